"""Cells whose configurations are equal train once: within a study, and across the studies of one ``--out``.

Two cells are *twins* when their configurations are equal (:attr:`Cell.key <.core.Cell.key>`: numbers
compared by value, the probe flag included).  IKA Table 4's p sweep at p = 3, for instance, is the
IKAN-direct Housing column of Table 4 itself (p = 3 there), split by split.

When a cell is about to run and a twin has finished ("ok" or "diverged": the same configuration gives the
same run on the same code and machine, see :mod:`.runner`) with that configuration, the twin's record is
carried over as the cell's ``result.json`` instead: the cell's own table, row, column, seed and tags,
``"same_config_as"`` naming the twin, and ``wall_s`` 0 (it cost nothing here, so the study's summed wall time
counts the run once).  A twin that failed ("error") is not carried: the cell runs.  While a twin is being
trained by another process the cell is skipped; a later invocation (``--collect-only`` included) carries it
over.  Carried cells have no training log, like imported ones (:mod:`.carry`), so the training-curve figures
show the run once.

Across studies: Transformer Dissection Tables 1 and 3 share three cells per seed (Eq. 9 and Vaswani's sum on
SP, Eq. 9 everywhere on NMT), Tables 1 and 4 six (column II of Shaw, XL and Eq. 9 on SP and NMT: no positions
in the value, which Table 4 spells ``value_position: none`` and Table 1 leaves out, see :attr:`.core.Cell.key`),
Tables 1 and 2 two (the exp kernel's asymmetric column: Vaswani's sum on NMT, Transformer-XL on SP), and IKA
Table 3's Transformer row is Table 1's Vaswani NMT cell but for seed 1, whose attention maps are recorded.
A cell with no finished twin in its own study takes the record of a finished cell of another study under
the same output folder whose record names the cell's configuration key (``"config"``; records written
before keys were recorded are not matched), ``same_config_as`` then reading ``<study>/<cell>``.  The other
studies' records are indexed once per invocation; one that finishes later, or is running, is not waited for:
the cell trains (the same run again).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from kernel_attention.study.core import Cell

__all__ = ["twins_of", "finished_twin", "other_studies_results", "finished_elsewhere", "twin_dir"]

#: Statuses of a twin's record that are carried over (a deterministic outcome of the configuration).
CARRIED = ("ok", "diverged")


def twins_of(cells: list[Cell]) -> dict[str, list[Cell]]:
    """For each cell id that has twins in ``cells``, the other cells with its configuration."""
    groups: dict[str, list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.key, []).append(c)
    return {c.id: [t for t in g if t is not c] for g in groups.values() if len(g) > 1 for c in g}


def finished_twin(cell: Cell, twins: list[Cell], dir_of: Callable[[Cell], Path],
                  stale: Callable[[dict, Path, Cell], bool]) -> dict | None:
    """The record to write as ``cell``'s ``result.json`` when one of ``twins`` has finished with a carried
    status (module docstring) and the current configuration, else None.  ``dir_of(cell)`` is a cell's
    folder; ``stale(record, folder, cell)`` tells a record of another configuration (:mod:`.runner`)."""
    for t in twins:
        p = dir_of(t) / "result.json"
        if not p.is_file():
            continue
        rec = json.loads(p.read_text())
        if rec.get("status") not in CARRIED or stale(rec, p.parent, t):
            continue
        return _carried(rec, cell, t.id)
    return None


def _carried(rec: dict, cell: Cell, source: str) -> dict:
    """``rec`` as ``cell``'s own record, carried from the cell named ``source``."""
    rec.update(cell=cell.id, table=cell.table, row=cell.row, col=cell.col, seed=cell.seed, tags=cell.tags,
               wall_s=0.0, same_config_as=source)
    rec.pop("imported_from", None)  # the source's provenance; this record's is same_config_as
    return rec


def other_studies_results(out: str | Path, study_name: str) -> dict[str, list[Path]]:
    """For each configuration key, the ``result.json`` files under ``out/<study>/cells/`` of the studies other
    than ``study_name`` whose records name it (module docstring)."""
    index: dict[str, list[Path]] = {}
    for p in sorted(Path(out).glob("*/cells/*/result.json")):
        if p.parts[-4] == study_name:
            continue
        try:
            key = json.loads(p.read_text()).get("config")
        except (OSError, json.JSONDecodeError):  # being written by another process: not indexed this time
            continue
        if key:
            index.setdefault(key, []).append(p)
    return index


def finished_elsewhere(cell: Cell, paths: list[Path]) -> dict | None:
    """The record to write as ``cell``'s ``result.json`` when one of ``paths`` (another study's results with
    ``cell``'s key, :func:`other_studies_results`) holds a carried status, else None."""
    for p in paths:
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):  # moved aside (--rerun-stale) by another process since indexed
            continue
        if rec.get("status") not in CARRIED or rec.get("config") != cell.key:
            continue
        origin = rec.get("same_config_as") or p.parts[-2]  # the cell that trained, if this one was carried
        return _carried(rec, cell, origin if "/" in origin else f"{p.parts[-4]}/{origin}")
    return None


def twin_dir(d: Path, rec: dict) -> Path:
    """The folder of the cell a record was carried from (its ``same_config_as``, as :func:`_carried` writes it:
    a cell of the same study, or ``<study folder>/<cell>`` of another under the same output folder), given the
    carrying cell's own folder ``d`` (``OUT/<study folder>/cells/<cell id>``); ``d`` itself when the record was
    not carried."""
    src = rec.get("same_config_as")
    if not src:
        return d
    folder, _, cell = src.rpartition("/")
    return d.parents[2] / folder / "cells" / cell if folder else d.parent / cell
