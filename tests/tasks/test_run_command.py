"""`kernel-attention run` prints its markdown table (a few steps only; the real run is in the report)."""

from kernel_attention.cli import main
from kernel_attention.cli.run import GRID


def test_run_prints_one_row_per_grid_point(capsys):
    assert main(["run", "--steps", "2", "--jobs", "1", "--test-size", "8"]) == 0
    out = capsys.readouterr().out
    rows = [l for l in out.splitlines() if l.startswith("| ") and not l.startswith("| kernel")]
    assert len(rows) == len(GRID)
    assert {r.split("|")[1].strip() for r in rows} == {"exp", "rbf", "linear"}
    assert "wall time" in out
