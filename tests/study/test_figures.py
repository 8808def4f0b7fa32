"""The study figures read: labelled axes, a title, one legend entry per (row, column) named by its labels,
a validation panel beside the training loss, colour bars on the attention maps; files written as PNG."""

import json

import matplotlib.pyplot as plt
import numpy as np
import pytest

from kernel_attention.study import figures, get_study
from kernel_attention.study.core import Cell, TableSpec

PNG = b"\x89PNG\r\n\x1a\n"
ROWS = [("exp", "exponential"), ("rbf", "RBF")]


def _write_cell(root, cell, train_loss, valid, status="ok"):
    """A cell folder as the runner leaves it: metrics.jsonl ("train" records per step, "valid" ones per
    evaluation, a final "test") and its result record."""
    d = root / cell.id
    d.mkdir(parents=True)
    recs = [{"step": s, "epoch": 0, "split": "train", "loss": v} for s, v in enumerate(train_loss, 1)]
    recs += [{"step": s, "epoch": 0, "split": "valid", "bleu": v, "loss": 1.0} for s, v in valid]
    recs.append({"step": len(train_loss), "epoch": 0, "split": "test", "bleu": 1.0, "final": True})
    recs.sort(key=lambda r: r["step"])
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    finite = [v for _, v in valid if v == v]
    return {"cell": cell.id, "table": cell.table, "row": cell.row, "col": cell.col, "seed": cell.seed,
            "status": status, "valid": max(finite) if finite and status == "ok" else None}


def _grid(tmp_path, cols, seeds=(1, 2)):
    """Two rows x ``cols`` x ``seeds`` cells with logs; seed 2 validates better than seed 1 everywhere."""
    table = TableSpec("t9", "Table 9, NMT (BLEU)", "bleu", True, ROWS, cols, {})
    cells, results = [], []
    for i, (rid, _) in enumerate(ROWS):
        for cid, _ in cols:
            for s in seeds:
                c = Cell("not-registered", "t9", rid, cid, s, {})
                cells.append(c)
                loss = [5.0 / (k + s + i) for k in range(1, 9)]
                results.append(_write_cell(tmp_path / "cells", c, loss, [(4, 10.0 * s + i), (8, 12.0 * s + i)]))
    return table, cells, (lambda c: tmp_path / "cells" / c.id), results


def _panels(fig):
    """{(ylabel, title): axes} of a curve figure's panels."""
    return {(ax.get_ylabel(), ax.get_title()): ax for ax in fig.axes}


def test_curves_name_each_variant_and_show_validation_beside_the_loss(tmp_path):
    cols = [("nmt-asym", "NMT asym"), ("nmt-sym", "NMT sym")]
    table, cells, dir_of, results = _grid(tmp_path, cols)
    fig = figures.training_curves_figure(table, cells, dir_of, results)
    try:
        panels = _panels(fig)
        assert set(panels) == {("training loss", "NMT asym: training loss"), ("training loss", "NMT sym: training loss"),
                               ("validation BLEU", "NMT asym: validation BLEU"),
                               ("validation BLEU", "NMT sym: validation BLEU")}
        for (ylabel, title), ax in panels.items():
            assert ax.get_xlabel() == "training step (updates)"
            col = title.split(":")[0]
            _, labels = ax.get_legend_handles_labels()
            assert labels == [f"exponential \N{EM DASH} {col}", f"RBF \N{EM DASH} {col}"]  # one line per (row, col)
            assert ax.get_legend() is not None and len(ax.get_legend().get_texts()) == 2
        # best_valid: the seed with the best validation score (seed 2) is the one drawn, in both panels
        valid = panels[("validation BLEU", "NMT sym: validation BLEU")]
        assert [list(line.get_ydata()) for line in valid.get_lines()] == [[20.0, 24.0], [21.0, 25.0]]
        loss = panels[("training loss", "NMT sym: training loss")]
        assert list(loss.get_lines()[0].get_ydata()) == pytest.approx([5.0 / (k + 2) for k in range(1, 9)])
        assert loss.get_yscale() == "log"
        title = fig._suptitle.get_text()
        assert "Table 9, NMT (BLEU)" in title and "best validation score" in title and "2 seeds" in title
    finally:
        plt.close(fig)

    path = figures.training_curves(tmp_path / "fig", table, cells, dir_of, results)
    assert path.endswith("curves_t9.png") and open(path, "rb").read(8) == PNG


def test_one_column_legend_is_the_row_labels_and_mean_mode_draws_a_band(tmp_path):
    table, cells, dir_of, results = _grid(tmp_path, [("nmt", "NMT BLEU")])
    fig = figures.training_curves_figure(table, cells, dir_of, results, seeds="mean")
    try:
        loss, valid = fig.axes[0], fig.axes[1]
        assert loss.get_ylabel() == "training loss" and valid.get_ylabel() == "validation BLEU"
        for ax in (loss, valid):
            assert ax.get_legend_handles_labels()[1] == ["exponential", "RBF"]
            assert len(ax.collections) == 2  # a ± std band per variant
        assert list(valid.get_lines()[0].get_ydata()) == [15.0, 18.0]  # mean of seeds 1 and 2
        assert "mean over seeds" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_a_log_axis_follows_the_lines_and_cuts_a_band_that_nears_zero(tmp_path):
    """Two seeds far apart: mean - std is 500 times below the mean line; the axis keeps to the lines."""
    table = TableSpec("t9", "Table 9, NMT (BLEU)", "bleu", True, ROWS[:1], [("nmt", "NMT")], {})
    cells = [Cell("not-registered", "t9", "exp", "nmt", s, {}) for s in (1, 2)]
    results = [_write_cell(tmp_path, c, [loss] * 8, [(8, 10.0)]) for c, loss in zip(cells, (1.0, 1e-3))]
    fig = figures.training_curves_figure(table, cells, lambda c: tmp_path / c.id, results, seeds="mean")
    try:
        loss = fig.axes[0]
        assert loss.get_yscale() == "log"
        assert list(loss.get_lines()[0].get_ydata()) == pytest.approx([0.5005] * 8)
        band = loss.collections[0].get_paths()[0].vertices[:, 1]
        assert band.min() == pytest.approx(1e-3)  # the band itself is drawn as computed ...
        # ... and cut at the lines' range (a flat line: a factor 1.5 either side)
        assert loss.get_ylim() == pytest.approx((0.5005 / 1.5, 0.5005 * 1.5))
    finally:
        plt.close(fig)


def test_mean_std_studies_average_their_seeds_by_default(tmp_path):
    table, cells, dir_of, results = _grid(tmp_path, [("bleu", "BLEU")])
    cells = [Cell("ika-translation", *(getattr(c, k) for k in ("table", "row", "col", "seed", "config")))
             for c in cells]  # a registered mean_std study
    fig = figures.training_curves_figure(table, cells, dir_of, results)
    try:
        assert "mean over seeds" in fig._suptitle.get_text()
        assert get_study("ika-translation").title in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_a_diverged_seed_is_passed_over_and_a_variant_that_only_diverged_is_marked(tmp_path):
    table = TableSpec("t2", "Table 2, NMT (BLEU)", "bleu", True, [("linear", "linear"), ("exp", "exponential")],
                      [("nmt", "NMT")], {})
    root = tmp_path / "cells"
    cells = [Cell("s", "t2", r, "nmt", s, {}) for r in ("linear", "exp") for s in (1, 2)]
    nan = float("nan")
    results = [_write_cell(root, cells[0], [3.0, 2.0, nan, nan], [(2, 1.0), (4, nan)], "diverged"),
               _write_cell(root, cells[1], [3.0, nan, nan, nan], [(2, nan), (4, nan)], "diverged"),
               _write_cell(root, cells[2], [3.0, 9.0, nan, nan], [(2, 30.0), (4, nan)], "diverged"),
               _write_cell(root, cells[3], [3.0, 2.0, 1.5, 1.0], [(2, 5.0), (4, 6.0)])]
    fig = figures.training_curves_figure(table, cells, lambda c: root / c.id, results)
    try:
        loss, valid = fig.axes
        assert valid.get_legend_handles_labels()[1] == ["linear", "exponential"]
        lines = valid.get_lines()
        # linear: every seed diverged -> the first, with an 'x' where it stopped; exp: the seed that did not
        assert lines[0].get_ydata()[0] == 1.0 and lines[1].get_marker() == "x"
        assert list(lines[2].get_ydata()) == [5.0, 6.0]
        assert len(lines) == 3
    finally:
        plt.close(fig)


def test_the_title_names_the_variants_with_results_but_no_curves(tmp_path):
    """Cells carried in without their logs (published before curves were kept) are named, not drawn."""
    table, cells, dir_of, results = _grid(tmp_path, [("nmt-asym", "NMT asym"), ("nmt-sym", "NMT sym")])
    for c in cells:
        if c.row == "rbf" and c.col == "nmt-sym" or c.row == "exp" and c.col == "nmt-asym":
            (dir_of(c) / "metrics.jsonl").unlink()
    fig = figures.training_curves_figure(table, cells, dir_of, results)
    try:
        title = fig._suptitle.get_text()
        assert title.splitlines()[-1] == "no curves kept for: exponential \N{EM DASH} NMT asym, RBF \N{EM DASH} NMT sym"
        labels = {t for ax in fig.axes for t in ax.get_legend_handles_labels()[1]}
        assert labels == {"RBF \N{EM DASH} NMT asym", "exponential \N{EM DASH} NMT sym"}
    finally:
        plt.close(fig)
    still_training = [r for r in results if not (r["row"] == "exp" and r["col"] == "nmt-asym")]
    fig = figures.training_curves_figure(table, cells, dir_of, still_training)
    try:  # a variant without results is not named
        assert fig._suptitle.get_text().endswith("no curves kept for: RBF \N{EM DASH} NMT sym")
    finally:
        plt.close(fig)


def test_no_log_no_figure(tmp_path):
    table, cells, dir_of, results = _grid(tmp_path, [("nmt", "NMT")])
    assert figures.training_curves(tmp_path / "fig", table, cells, lambda c: tmp_path / "none", results) is None


def test_attention_maps_have_axis_labels_a_colour_bar_and_a_title(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.random((2, 5, 5))
    maps = {"Transformer": w / w.sum(-1, keepdims=True), "IKAN": np.full((1, 5, 5), 0.2)}
    fig = figures.attention_heatmaps_figure(maps)
    try:
        panels = [ax for ax in fig.axes if ax.images]
        assert len(panels) == 3  # IKAN has one head: its second panel is off
        assert all(ax.get_xlabel() == "key position" and ax.get_ylabel().endswith("query position") for ax in panels)
        assert panels[0].get_ylabel() == "Transformer\nquery position" and panels[2].get_ylabel().startswith("IKAN")
        bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
        assert len(bars) == 1 and bars[0].get_ylabel() == "attention weight"
        assert len({ax.images[0].get_clim() for ax in panels}) == 1  # one colour scale for the bar
        assert "attention weights" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
    path = figures.attention_heatmaps(tmp_path / "fig2.png", maps, tokens=list("abcde"), title="Fig. 2")
    assert open(path, "rb").read(8) == PNG


def test_similarity_magnitude_panels_are_labelled(tmp_path):
    series = {"Transformer": [(0, 0.5, 1.0), (1, 0.6, 2.0)], "MIKAN": [(0, 0.4, 0.5), (1, 0.3, 0.2)]}
    fig = figures.similarity_magnitude_figure(series, "encoder.layers.0.self_attn")
    try:
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
            assert ax.get_legend_handles_labels()[1] == ["Transformer", "MIKAN"]
        assert fig._suptitle.get_text().startswith("IKA Fig. 3")
    finally:
        plt.close(fig)
    assert open(figures.similarity_magnitude(tmp_path / "f3.png", series, "x"), "rb").read(8) == PNG


def test_a_long_training_loss_is_drawn_as_its_running_mean():
    from kernel_attention.study.figures import SMOOTH, _running_mean

    short = [3.0, 1.0, 2.0]
    assert list(_running_mean(short)) == short                       # few points: drawn as logged
    n = 4 * SMOOTH                                                   # window 4
    values = [float(i % 4) for i in range(n)]                        # 0, 1, 2, 3, 0, ...
    mean = _running_mean(values)
    assert mean[0] == 0.0 and mean[1] == 0.5 and mean[2] == 1.0      # fewer points at the start
    assert np.allclose(mean[3:], 1.5)                                # then the mean of the last four
    values[10] = float("nan")
    assert np.isnan(_running_mean(values)[10])


def test_a_cell_without_a_result_is_not_drawn(tmp_path):
    """A cell still training has a log but no record yet: its curve stops short and the table leaves it out,
    so the figure does too (and counts only the seeds it draws)."""
    table, cells, dir_of, results = _grid(tmp_path, [("nmt", "NMT")], seeds=(1, 2, 3))
    finished = [r for r in results if r["seed"] != 3]
    # best_valid: seed 2 of the finished ones; seed 3 (30 + row, 36 + row) once it has its record
    for records, n, best in ((finished, 2, 20.0), (results, 3, 30.0)):
        fig = figures.training_curves_figure(table, cells, dir_of, records)
        try:
            valid = _panels(fig)[("validation BLEU", "NMT: validation BLEU")]
            assert [list(line.get_ydata()) for line in valid.get_lines()] == \
                [[best, best * 1.2], [best + 1, best * 1.2 + 1]]
            assert f"up to {n} seeds" in fig._suptitle.get_text()
        finally:
            plt.close(fig)


def test_a_cell_carried_from_a_twin_draws_the_twins_log(tmp_path):
    """A cell whose result was carried over from a twin (the same configuration, trained once: in its own study or
    another under the same output folder) has no log of its own; the figure draws the twin's, the same run."""
    table = TableSpec("t9", "Table 9, NMT (BLEU)", "bleu", True, ROWS, [("nmt", "NMT")], {})
    here, there = tmp_path / "study-a" / "cells", tmp_path / "study-b" / "cells"
    exp, rbf = Cell("not-registered", "t9", "exp", "nmt", 1, {}), Cell("not-registered", "t9", "rbf", "nmt", 1, {})
    twin = Cell("not-registered", "t1", "baseline", "nmt", 1, {})
    _write_cell(there, twin, [3.0, 2.0], [(2, 30.0)])
    _write_cell(here, rbf, [3.0, 2.5], [(2, 20.0)])
    (here / exp.id).mkdir()
    results = [{"cell": exp.id, "status": "ok", "valid": 30.0, "same_config_as": f"study-b/{twin.id}"},
               {"cell": rbf.id, "status": "ok", "valid": 20.0}]
    fig = figures.training_curves_figure(table, [exp, rbf], lambda c: here / c.id, results)
    try:
        valid = _panels(fig)[("validation BLEU", "NMT: validation BLEU")]
        assert [list(line.get_ydata()) for line in valid.get_lines()] == [[30.0], [20.0]]
        assert valid.get_legend_handles_labels()[1] == ["exponential", "RBF"]
    finally:
        plt.close(fig)
    results[0]["same_config_as"] = rbf.id   # a twin in the same study
    fig = figures.training_curves_figure(table, [exp, rbf], lambda c: here / c.id, results)
    try:
        valid = _panels(fig)[("validation BLEU", "NMT: validation BLEU")]
        assert [list(line.get_ydata()) for line in valid.get_lines()] == [[20.0], [20.0]]
    finally:
        plt.close(fig)
