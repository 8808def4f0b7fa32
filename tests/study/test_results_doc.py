"""docs/results.md is traceable to its CSVs: every table row that a CSV in docs/figures/csv/ renders
(with the study's own table code) appears verbatim in docs/results.md, and a CSV round trip through
write_csv / read_csv renders the same tables."""

from pathlib import Path

import pytest

from kernel_attention.study import get_study
from kernel_attention.study.report import read_csv, render_tables, write_csv

DOCS = Path(__file__).resolve().parents[2] / "docs"
CSVS = sorted((DOCS / "figures" / "csv").glob("*.csv"))


def _rows(markdown: str) -> list[str]:
    """The data rows of the rendered tables that hold at least one run (last column: runs per cell)."""
    return [line for line in markdown.splitlines() if line.startswith("| ") and not line.startswith("| row |")
            and any(n != "0" for n in line.rstrip(" |").rsplit("| ", 1)[-1].split("/"))]


@pytest.mark.parametrize("path", CSVS, ids=[p.stem for p in CSVS])
def test_results_doc_tables_are_rendered_from_the_csvs(path):
    records = read_csv(path)
    study = get_study(records[0]["study"])
    rows = _rows(render_tables(study, records, [], records[0]["scale"]))
    assert rows, f"{path.name} renders no row with runs"
    doc = (DOCS / "results.md").read_text()
    missing = [r for r in rows if r not in doc]
    assert not missing, f"docs/results.md lacks these rows of {path.name} (re-render with --collect-only):\n" + \
        "\n".join(missing)


def test_csv_round_trip_renders_the_same_tables(tmp_path):
    records = read_csv(CSVS[0])
    study = get_study(records[0]["study"])
    again = read_csv(write_csv(tmp_path / "runs.csv", study, records))
    assert render_tables(study, again, [], "small") == render_tables(study, records, [], "small")
    assert isinstance(again[0]["seed"], int) and isinstance(again[0]["test"], float)
