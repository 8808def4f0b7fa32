"""``benchmarks/training_ops.py`` runs on tiny shapes and prints one row per operation and thread count."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "training_ops.py"


def test_prints_a_ratio_row_per_op_and_thread_count(capsys):
    spec = importlib.util.spec_from_file_location("training_ops_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--tokens", "12", "--sizes", "30", "--repeats", "2", "--threads", "1", "0"])
    rows = [r.split("|") for r in capsys.readouterr().out.splitlines() if r.startswith("| ")]
    rows = [r for r in rows if r[1].strip() in mod.OPS]  # the data rows, not the header
    assert [r[1].strip() for r in rows] == ["cross_entropy"] * 2 + ["dropout"] * 2
    assert all(float(r[-2]) > 0 for r in rows)
