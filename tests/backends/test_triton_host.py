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
