"""Carry finished cells from a ``runs.csv`` into a study folder, so that a study goes on elsewhere.

    kernel-attention study dissection-kernels --seeds 5 --import-runs docs/results/dissection-kernels/runs.csv

A ``runs.csv`` (written by :func:`~.report.write_csv`) holds every field of each finished cell's
``result.json`` except its training log.  Importing writes one ``result.json`` per row whose cell belongs
to the study's grid at the chosen scale and seeds and has no ``result.json`` yet, so the runner skips
those cells and ``--collect-only`` renders them beside the new ones: seeds 4-5 added on another machine to
seeds 1-3 that ran earlier, say.  Each imported record names its source (``"imported_from"``).  A cell
already finished here is left alone (the local run wins); rows of another study or scale, and rows whose
table / row / column / seed disagree with their cell id, are errors (a wrong file, not something to merge),
and such a file imports nothing.
Imported cells have no ``metrics.jsonl``; where a ``curves.csv`` lies beside the ``runs.csv`` (:mod:`.curves`),
each imported cell's rows of it are written into its folder, so the training-curve figures draw it too (also for
a cell finished here that has no log: one imported before its curves were published).
A row whose ``config`` (the configuration key it ran with, :attr:`.core.Cell.key`) is not its cell's current one
is not imported: it is a result of a configuration since corrected, and the cell runs again here.  Rows
without one (CSVs written before it was recorded) are imported as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from kernel_attention.atomic_write import write_text
from kernel_attention.study.core import Cell, Study
from kernel_attention.study.curves import CURVES_CSV, cell_log, read_curves, write_cell_curves
from kernel_attention.study.report import read_csv

__all__ = ["import_runs"]


def import_runs(path: str | Path, study: Study, cells: list[Cell], scale: str, dir_of) -> dict[str, int]:
    """Write ``result.json`` for the rows of ``path`` that are cells of ``cells`` without one yet.

    ``dir_of(cell)`` is the cell's folder.  Returns counts: ``{"imported", "already_finished",
    "outside_grid", "other_config"}`` ("outside_grid": rows of this study whose cell the grid does not hold,
    e.g. a seed beyond ``--seeds``; "other_config": rows run with another configuration than their cell's,
    module docstring).  Raises ``ValueError`` for rows of another study or scale, or inconsistent with their id.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--import-runs: no such file {str(path)!r} (a runs.csv written by a study)")
    by_id = {c.id: c for c in cells}
    counts = {"imported": 0, "already_finished": 0, "outside_grid": 0, "other_config": 0}
    todo = []  # every row is checked before any is written: a wrong file imports nothing
    for n, rec in enumerate(read_csv(path), start=2):  # line 1 is the header
        where = f"{path}, line {n}"
        if rec.get("study", study.name) != study.name:
            raise ValueError(f"{where}: a row of study {rec['study']!r}, not {study.name!r}")
        if rec.get("scale", scale) != scale:
            raise ValueError(f"{where}: a row of scale {rec['scale']!r}; this invocation is --scale {scale}")
        if "cell" not in rec:
            raise ValueError(f"{where}: no 'cell' field (expected the columns of a study's runs.csv)")
        cell = by_id.get(rec["cell"])
        if cell is None:
            counts["outside_grid"] += 1
            continue
        fields = {"table": cell.table, "row": cell.row, "col": cell.col, "seed": cell.seed}
        wrong = {k: rec.get(k) for k, v in fields.items() if rec.get(k) != v}
        if wrong:
            raise ValueError(f"{where}: cell {cell.id} but {wrong} (expected {fields})")
        if rec.get("config", cell.key) != cell.key:
            counts["other_config"] += 1
            continue
        todo.append((cell, rec))
    beside = path.with_name(CURVES_CSV)
    curves = read_curves(beside) if beside.is_file() else {}
    for cell, rec in todo:
        d = dir_of(cell)
        if (d / "result.json").is_file():
            counts["already_finished"] += 1
            if cell.id in curves and not cell_log(d, {}):  # imported before its curves were published
                write_cell_curves(d, curves[cell.id])
            continue
        d.mkdir(parents=True, exist_ok=True)
        rec.pop("study", None)
        rec.setdefault("error", None)
        rec["tags"] = cell.tags  # not in the CSV; the grid's cell has them (e.g. the p of a sweep cell)
        rec["imported_from"] = str(path)
        if cell.id in curves:
            write_cell_curves(d, curves[cell.id])
        write_text(d / "result.json", json.dumps(rec, indent=1))
        counts["imported"] += 1
    return counts
