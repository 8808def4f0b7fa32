"""``benchmarks/cross_entropy.py`` runs on a tiny shape and prints one row per thread count."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cross_entropy.py"


def test_prints_a_ratio_row_per_thread_count(capsys):
    spec = importlib.util.spec_from_file_location("cross_entropy_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--tokens", "12", "--vocab", "30", "--repeats", "2", "--threads", "1", "0"])
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert len(rows) == 2 and all(float(r.split("|")[-2]) > 0 for r in rows)
