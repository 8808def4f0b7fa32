"""``benchmarks/triton_host.py``: the host time per call of the ``triton`` backend, kernels recorded, not run."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[gpu]')")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "triton_host.py"


def test_host_table_has_every_variant(tmp_path):
    spec = importlib.util.spec_from_file_location("triton_host", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "host.md"
    assert mod.main(["--repeats", "1", "--calls", "1", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and "µs" not in line]
    assert [r.split(" | ")[0][2:] for r in rows] == ["SDPA (its compute included)"] + [v[0] for v in mod.VARIANTS]
    for row in rows[1:]:  # every time positive, the direct path and the operators' both timed
        assert all(float(x) > 0 for x in row.strip("| ").split(" | ")[1:])


@pytest.mark.parametrize("position,value", [("shaw", "relative"), ("xl", "none")])
def test_default_positions_cost_no_host_reads(position, value, host_reads):
    """A call with the default positions passed as a layer passes them (their offset) reads nothing back to the
    host (on a GPU each read is a device sync); positions as tensors are read once per call, not per check."""
    import torch

    import kernel_attention as ka
    from kernel_attention.backends.triton_aot import record_launches
    from kernel_attention.functional import attention
    from kernel_attention.positions import default_positions, make_position

    reads = host_reads
    b, h, t, d = 1, 2, 16, 16
    pos = make_position(position, d_model=h * d, n_heads=h, d_head=d, value_position=value)
    q, k, v = (torch.randn(b, h, t, d).requires_grad_() for _ in range(3))
    pq, pk = default_positions(t, t, q.device, True)
    counts = []
    for offset in (0, None):
        reads.clear()
        record_launches(lambda: attention(q, k, v, ka.make_kernel("exp"), "causal", backend="triton",
                                          terms=pos.terms(q, k, pq, pk, offset)).sum().backward())
        counts.append(len(reads))
    assert counts[0] == 0
    assert 0 < counts[1] <= {"shaw": 5, "xl": 7}[position]  # the distance range, then each vector's steps once
