"""A study's training curves as data that travels with its ``runs.csv``: ``curves.csv``.

A cell's curves live in its run folder's ``metrics.jsonl`` (:mod:`kernel_attention.training.run_log`), which
stays on the machine that trained it; ``runs.csv`` carries the results elsewhere but not the log.  So the
collection of a study also writes ``OUT/<study>/curves.csv``, one row per point of each finished cell's curves:

    cell, split, step, key, value

* ``split`` "valid": every validation record, ``key`` the metric's name in the log (``bleu``, ``ppl``, ...), its
  value as logged (the figures apply a table's scale);
* ``split`` "train": the training loss (``key`` "loss") as the mean over each of at most :data:`TRAIN_POINTS`
  runs of consecutive updates, at the run's last update (a loss logged every update is 10^4 rows a cell).

Importing a ``runs.csv`` (:mod:`.carry`) also reads the ``curves.csv`` beside it, when there is one, and writes
each imported cell's rows into its folder as ``curves.jsonl`` (records shaped as the log's); :func:`cell_log`
reads a cell's log, else those records, else its twin's (:mod:`.twins`), so the figures draw imported cells too.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from kernel_attention.atomic_write import write_text
from kernel_attention.study.twins import twin_dir
from kernel_attention.training.run_log import read_metrics

__all__ = ["CURVES_CSV", "CURVES_FILE", "TRAIN_POINTS", "cell_log", "curve_rows", "write_curves", "read_curves",
           "write_cell_curves"]

CURVES_CSV = "curves.csv"
#: the imported curves of a cell, in its folder
CURVES_FILE = "curves.jsonl"
#: the most points of a cell's training loss in curves.csv
TRAIN_POINTS = 100
_FIELDS = ("cell", "split", "step", "key", "value")


def _own_log(d: Path) -> list[dict]:
    records = read_metrics(d)
    if records:
        return records
    path = d / CURVES_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


def cell_log(d: Path, rec: dict) -> list[dict]:
    """The log records of the cell in folder ``d`` whose result record is ``rec``: its ``metrics.jsonl``, else
    its imported ``curves.jsonl``, else those of the twin it was carried from; [] when none is here."""
    records = _own_log(d)
    if not records and rec.get("same_config_as"):
        records = _own_log(twin_dir(d, rec))
    return records


def curve_rows(cell: str, records: list[dict], metric: str) -> list[dict]:
    """The curves.csv rows of one cell from its log records: its validation ``metric`` at every evaluation, and
    its training loss averaged over runs of ``ceil(n / TRAIN_POINTS)`` consecutive updates (n logged updates).
    A non-finite value is written as ``nan`` (a diverged run's curve stops there)."""
    def num(v) -> float:
        v = float(v)
        return v if math.isfinite(v) else float("nan")

    valid: dict[int, float] = {}
    train: list[tuple[int, float]] = []
    for r in records:
        if "step" not in r:
            continue
        if r.get("split") == "valid" and metric in r:
            valid[int(r["step"])] = num(r[metric])  # a step logged twice keeps its last record
        elif r.get("split") == "train" and "loss" in r:
            train.append((int(r["step"]), num(r["loss"])))
    rows = [{"cell": cell, "split": "valid", "step": s, "key": metric, "value": v} for s, v in sorted(valid.items())]
    size = max(1, math.ceil(len(train) / TRAIN_POINTS))
    for i in range(0, len(train), size):
        run = train[i:i + size]
        rows.append({"cell": cell, "split": "train", "step": run[-1][0], "key": "loss",
                     "value": sum(v for _, v in run) / len(run)})
    return rows


def write_curves(path: Path, logs: dict[str, tuple[list[dict], str]]) -> Path:
    """Write curves.csv at ``path`` from ``{cell id: (log records, metric)}``, cells in id order."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=_FIELDS, lineterminator="\n")
    w.writeheader()
    for cell in sorted(logs):
        records, metric = logs[cell]
        for row in curve_rows(cell, records, metric):
            w.writerow({**row, "value": f"{row['value']:.6g}"})
    write_text(path, buf.getvalue())
    return path


def read_curves(path: Path) -> dict[str, list[dict]]:
    """``{cell id: [log-shaped records]}`` of a curves.csv: ``{"split", "step", key: value}`` per row."""
    out: dict[str, list[dict]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(row["cell"], []).append({"split": row["split"], "step": int(row["step"]),
                                                    row["key"]: float(row["value"])})
    return out


def write_cell_curves(d: Path, records: list[dict]) -> None:
    """An imported cell's records into its folder (``curves.jsonl``), for :func:`cell_log`."""
    write_text(d / CURVES_FILE, "".join(json.dumps(r) + "\n" for r in records))
