"""``--only``: which cells of a grid a selector names, and what it says when it names none."""

import pytest

from kernel_attention.study import StudyOptions, get_study, study_names
from kernel_attention.study.runner import select_cells


def _cells(name: str, scale: str = "paper"):
    return get_study(name).build(StudyOptions(scale=scale, seeds=1))[0]


def test_a_row_is_named_by_its_kernels_registry_name_or_its_id():
    cells = _cells("ika-classification")
    by_id = select_cells(cells, ("t2/ikan_direct/sst2",), "ika-classification")
    by_name = select_cells(cells, ("t2/ikan-direct/sst2",), "ika-classification")
    assert [c.id for c in by_id] == [c.id for c in by_name] == ["t2__ikan_direct__sst2__s0"]
    rows = {c.row for c in select_cells(cells, ("rbf-only", "mikan/cr"), "ika-classification")}
    assert rows == {"rbf_only", "mikan"}
    assert len(select_cells(cells, ("rbf-only",), "ika-classification")) == 5  # its five datasets


def test_a_selector_that_names_no_cell_lists_the_ids_there_are():
    cells = _cells("ika-classification")
    with pytest.raises(ValueError) as e:
        select_cells(cells, ("t2/ikan-direkt",), "ika-classification")
    said = str(e.value)
    assert "selects no cell of study ika-classification" in said
    assert "tables are t2, rows transformer, rbf_only," in said and "columns mr, cr, sst2, subj, trec" in said


@pytest.mark.parametrize("name", [n for n in study_names() if n != "synthetic-smoke"])
def test_no_two_ids_of_a_study_differ_only_in_hyphens_and_underscores(name):
    # The selector reads "-" as "_"; that stays exact only while no study has two such ids.
    for scale in ("small", "paper"):
        ids = {x for c in _cells(name, scale) for x in (c.table, c.row, c.col)}
        assert len({i.replace("-", "_") for i in ids}) == len(ids)


def test_an_item_that_names_no_cell_beside_one_that_does_is_an_error():
    cells = _cells("ika-classification")
    with pytest.raises(ValueError, match=r"--only's \['nosuch'\] select no cell of study ika-classification; its "
                                         r"tables are t2"):
        select_cells(cells, ("t2/mikan", "nosuch"), "ika-classification")


def test_a_finished_cell_outside_only_stays_in_runs_csv_and_the_table(tmp_path, capsys):
    """Running one --only selection after another keeps the first one's rows (runs.csv is one row per
    finished cell of the grid); an item list with spaces after its commas is read item by item."""
    from kernel_attention.cli import main

    out = tmp_path / "s"
    for only in ("rbf", "exp"):
        assert main(["study", "synthetic-smoke", "--only", only, "--out", str(out), "--no-figures"]) == 0
    rows = (out / "synthetic-smoke" / "runs.csv").read_text().splitlines()
    assert len(rows) == 3 and {r.split(",")[3] for r in rows[1:]} == {"exp", "rbf"}
    assert "not run" not in (out / "synthetic-smoke" / "table.md").read_text()
    capsys.readouterr()
    assert main(["study", "synthetic-smoke", "--only", "exp, rbf", "--list", "--out", str(out)]) == 0
    listed = capsys.readouterr().out
    assert "copy__exp" in listed and "copy__rbf" in listed


def test_a_study_without_its_data_or_with_report_options_exits_2_and_records_nothing(tmp_path, capsys):
    """Data that is not there stops the study in one line (no traceback) before any record is written, so the
    same command runs the cell once the data is placed; so do an unknown --nmt-data and the page's options."""
    from kernel_attention.cli import main

    out = tmp_path / "s"
    args = ["study", "dissection-kernels", "--only", "exp/sp-asym", "--out", str(out), "--no-figures"]
    assert main([*args, "--data", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--data names the data root" in err and len(err.strip().splitlines()) == 1
    assert not list(out.glob("*/cells/*/result.json"))
    assert main([*args, "--nmt-data", "nosuch"]) == 2
    assert "--nmt-data: unknown dataset 'nosuch'; accepted:" in capsys.readouterr().err
    assert main(["study", "synthetic-smoke", "--check", "--out", str(out)]) == 2
    assert "--check go(es) with `kernel-attention study report`" in capsys.readouterr().err
    assert not (out / "synthetic-smoke").exists()
    assert main(["study", "synthetic-smoke", "--import-runs", str(tmp_path / "no.csv"), "--list"]) == 2
    assert f"--import-runs {tmp_path / 'no.csv'}: no such file" in capsys.readouterr().err
    assert main(["study"]) == 2
    assert "name a study (listed above)" in capsys.readouterr().err


def test_a_cell_that_ended_in_an_error_is_named_with_the_flag_that_runs_it_again(tmp_path, capsys):
    import json

    from kernel_attention.cli import main

    out = tmp_path / "s"
    assert main(["study", "synthetic-smoke", "--only", "exp", "--out", str(out), "--no-figures"]) == 0
    (rec,) = out.glob("synthetic-smoke/cells/*/result.json")
    rec.write_text(json.dumps({**json.loads(rec.read_text()), "status": "error", "error": "RuntimeError: x"}))
    capsys.readouterr()
    assert main(["study", "synthetic-smoke", "--only", "exp", "--out", str(out), "--no-figures"]) == 0
    said = capsys.readouterr().out
    assert "1 cell(s) ended in an error (copy__exp" in said and "--retry-errors runs them again" in said
