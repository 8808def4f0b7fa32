"""curves.csv: a study's training curves travel with its runs.csv, so imported cells are drawn where they did
not train (:mod:`kernel_attention.study.curves`)."""

import json
import math
import shutil

import pytest

from kernel_attention.study import StudyOptions, execute, get_study
from kernel_attention.study.curves import (CURVES_CSV, CURVES_FILE, TRAIN_POINTS, cell_log, curve_rows, read_curves,
                                           write_curves)
from kernel_attention.study.figures import training_curves_figure
from kernel_attention.study.runner import cell_dir
from kernel_attention.training.run_log import read_metrics


def test_rows_keep_every_evaluation_and_average_the_training_loss():
    log = [{"split": "train", "step": s, "loss": float(s)} for s in range(1, 251)]
    log += [{"split": "valid", "step": 100, "ppl": 50.0}, {"split": "valid", "step": 200, "ppl": 40.0},
            {"split": "valid", "step": 200, "ppl": 39.0},  # logged twice (the final evaluation): the last counts
            {"split": "valid", "step": 250, "ppl": float("inf")}, {"split": "test", "step": 250, "ppl": 1.0}]
    rows = curve_rows("c", log, "ppl")
    valid = [(r["step"], r["value"]) for r in rows if r["split"] == "valid"]
    assert valid[:2] == [(100, 50.0), (200, 39.0)] and valid[2][0] == 250 and math.isnan(valid[2][1])
    train = [(r["step"], r["value"]) for r in rows if r["split"] == "train"]
    assert len(train) == math.ceil(250 / 3) <= TRAIN_POINTS  # runs of ceil(250 / 100) = 3 updates
    assert train[:2] == [(3, 2.0), (6, 5.0)] and train[-2:] == [(249, 248.0), (250, 250.0)]  # the last run: 250
    assert all(r["key"] == ("loss" if r["split"] == "train" else "ppl") for r in rows)


def test_written_curves_read_back_as_log_records(tmp_path):
    log = [{"split": "train", "step": s, "loss": 1.0 / s} for s in range(1, 8)] + \
        [{"split": "valid", "step": 7, "bleu": 12.5}]
    path = write_curves(tmp_path / CURVES_CSV, {"b": (log, "bleu"), "a": ([], "bleu")})
    got = read_curves(path)
    assert list(got) == ["b"]  # a cell without records writes no rows
    assert got["b"][-1] == {"split": "train", "step": 7, "loss": pytest.approx(1 / 7, rel=1e-5)}
    assert {"split": "valid", "step": 7, "bleu": 12.5} in got["b"]


def test_imported_cells_are_drawn_from_the_curves_beside_the_runs(tmp_path):
    """A study run in one folder, its runs.csv imported into another: with curves.csv beside it the imported
    cells have their log records (those of the run, the training loss as written) and the figure draws both
    rows; with runs.csv alone they have none and there is no figure."""
    first = tmp_path / "first"
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), first, log=lambda m: None, figures=False)
    sdir = first / "synthetic-smoke"
    study = get_study("synthetic-smoke")
    cells, _ = study.cells(StudyOptions(scale="small", seeds=1))
    curves = read_curves(sdir / CURVES_CSV)
    assert sorted(curves) == sorted(c.id for c in cells)
    for c in cells:
        metric = study.table(c.table).metric
        logged = [r for r in read_metrics(cell_dir(first, study, c)) if r.get("split") == "valid"]
        assert logged and [r[metric] for r in curves[c.id] if r["split"] == "valid"] == \
            [pytest.approx(r[metric], rel=1e-5) for r in logged]

    for name, with_curves in (("second", True), ("third", False)):
        src = tmp_path / f"{name}_csv"
        src.mkdir()
        shutil.copy(sdir / "runs.csv", src / "runs.csv")
        if with_curves:
            shutil.copy(sdir / CURVES_CSV, src / CURVES_CSV)
        out = tmp_path / name
        res = execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), out, run=False, figures=False,
                      log=lambda m: None, import_from=(src / "runs.csv",))
        for c in cells:
            d = cell_dir(out, study, c)
            rec = json.loads((d / "result.json").read_text())
            assert "imported_from" in rec and not (d / "metrics.jsonl").exists()
            assert (d / CURVES_FILE).is_file() == with_curves
            assert bool(cell_log(d, rec)) == with_curves
        table = study.tables[0]
        fig = training_curves_figure(table, cells, lambda c: cell_dir(out, study, c), res["results"])
        if with_curves:
            assert sorted(fig.axes[1].get_legend_handles_labels()[1]) == sorted(lab for _, lab in table.rows)
            # collected again here, the curves travel on: the imported cells' rows are written once more
            assert read_curves(out / "synthetic-smoke" / CURVES_CSV) == curves
        else:
            assert fig is None
            assert read_curves(out / "synthetic-smoke" / CURVES_CSV) == {}
    # the runs imported into "third" without their curves get them when imported again with them
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), tmp_path / "third", run=False, figures=False,
            log=lambda m: None, import_from=(tmp_path / "second_csv" / "runs.csv",))
    assert read_curves(tmp_path / "third" / "synthetic-smoke" / CURVES_CSV) == curves
