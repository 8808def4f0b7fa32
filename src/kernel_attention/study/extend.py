"""Cells given more updates: a finished cell whose configuration differs from the grid's only by a larger
``train.max_steps`` is continued, not trained again from the start.

A resumed run is the uninterrupted one (the trainer's exact resume), and a finished run resumed with a larger
``max_steps`` trains on from its end (:mod:`kernel_attention.training.loop`).  That continuation is the run of
the larger limit when the learning-rate schedule gives the updates already made the same rates under both
limits (``inverse_sqrt`` and ``constant`` do; ``cosine``, which anneals over ``max_steps``, does not) and the
old limit fell on an evaluation step (else the run's final evaluation counted towards early stopping where the
longer run evaluates nothing).  Such a cell, its ``last.pt`` kept, is

* ``"rekey"``: its recorded run ended before either limit (early stopping) or at the new one: the longer run
  stops at the same step, so its record stands under the grid's configuration, re-keyed;
* ``"train"``: trained on from its ``last.pt`` to the new limit, or until early stopping ends it.

The record must be of the run the folder's ``config.yaml`` describes (its key is that configuration's, the
cell's tags included), or of that configuration at the record's step count: a cell whose ``config.yaml``
already names the grid's configuration while its record has the shorter limit is one whose continuation
began and was stopped, and it trains on too.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kernel_attention.study.core import Cell

__all__ = ["extension", "rekey", "key_at_limit"]


def _same_rates(train: dict, old: int, new: int) -> bool:
    """Whether ``train``'s schedule gives updates 0..old-1 the same rates under max_steps ``old`` and ``new``."""
    from kernel_attention.training.config import TrainConfig
    from kernel_attention.training.schedules import SCHEDULES

    cfg = TrainConfig.from_dict({**train, "max_steps": new})
    a, b = (SCHEDULES.create(cfg.schedule, lr=cfg.lr, max_steps=n) for n in (old, new))
    return all(a(s) == b(s) for s in range(old))


def key_at_limit(cell: Cell, config: dict, max_steps: int | None = None) -> str:
    """The configuration key of ``cell`` with ``config`` (and ``train.max_steps`` replaced, if given)."""
    if max_steps is not None:
        config = {**config, "train": {**(config.get("train") or {}), "max_steps": max_steps}}
    return dataclasses.replace(cell, config=config).key


def extension(cell: Cell, d: Path, rec: dict) -> str | None:
    """``"rekey"``, ``"train"`` or None (the module docstring) for the finished, stale cell folder ``d`` whose
    record is ``rec``."""
    from kernel_attention.config import load_config
    from kernel_attention.tasks.resume_check import changed_keys
    from kernel_attention.training.checkpoint import CheckpointError, load_checkpoint

    if not ((d / "config.yaml").is_file() and (d / "last.pt").is_file()):
        return None
    ran = load_config(d / "config.yaml")
    if rec.get("config") not in (key_at_limit(cell, ran), key_at_limit(cell, ran, rec.get("steps"))):
        return None  # the record is not of the run this folder's config.yaml describes (nor of its shorter limit)
    changes = changed_keys(ran, cell.config)
    if any(key != "train.max_steps" for key, _, _ in changes):
        return None
    train = dict(cell.config.get("train") or {})
    new = train.get("max_steps")
    old = (ran.get("train") or {}).get("max_steps")
    if not (isinstance(old, int) and isinstance(new, int) and new >= old):
        return None
    every = int(train.get("eval_every") or 0)
    if old < new and ((every and old % every) or not _same_rates(train, old, new)):
        return None
    try:
        ck = load_checkpoint(d / "last.pt", mmap=True)  # only its step and counters are read
    except (CheckpointError, FileNotFoundError):
        return None
    patience = train.get("patience")
    stopped_early = patience is not None and int(ck.get("stale_evals", 0)) >= int(patience)
    recorded = ck.get("finished") and int(ck["step"]) == rec.get("steps")
    if recorded and (stopped_early or int(ck["step"]) >= new):
        return "rekey"
    return "train"


def rekey(cell: Cell, d: Path) -> dict:
    """The record of ``d``, rewritten under ``cell``'s configuration key (``"rekey"``)."""
    rec = json.loads((d / "result.json").read_text())
    rec["config"] = cell.key
    return rec
