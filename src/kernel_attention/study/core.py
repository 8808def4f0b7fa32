"""What a study is: a grid of cells (one training run each) plus the paper's table to put our numbers beside.

    cell id   = <study>/<table>/<row>/<col>/s<seed>   (file-system safe: "__" between the parts)
    Cell      = (table, row, col, seed, config, scale) config: a normal run config (task/data/model/train/eval/seed)
    Cell.key  = a digest of the config (and probe flag): what a finished cell's result was run with
    Study     = name, tables (TableSpec: rows, cols, the paper's numbers), protocol, build(options) -> cells

Protocols (reference notes):
    "best_valid"  Transformer Dissection: N seeds per cell, report the test score of the seed with the best
                  validation score;
    "mean_std"    Implicit Kernel Attention: mean ± std (ddof 0) of the test score over runs / folds / splits
                  (regression: each run's score is its best test RMSE over epochs, valid_fraction 0).

A study's ``build(options)`` returns ``(cells, shrink)`` where ``shrink`` lists, in words, everything the
scale changed relative to the paper configuration (printed and written into table.md); :meth:`Study.cells`
stamps each cell with the scale, which picks the folder it runs in (:meth:`Study.folder`): the scales of one
study under one ``--out`` never share a folder.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from typing import Any, Callable

__all__ = ["Cell", "TableSpec", "Study", "StudyOptions", "STUDIES", "register_study", "get_study"]

_SAFE = re.compile(r"[^A-Za-z0-9_.=-]+")

#: Attention options (of ``model.attention`` / ``model.*_attention``) whose spelled values mean what leaving
#: them out means in every model, so that a config spelling them is the same run as one omitting them: TD
#: Table 4's column II spells ``value_position: none`` (TD Eq. 8) and Table 2's exp row ``kernel: exp,
#: symmetric: false``, where Table 1's rows leave them out.  (``position`` is not one: its default is the
#: model's, ``xl`` in the language model.)
ATTENTION_DEFAULTS: dict[str, tuple[Any, ...]] = {"value_position": ("none", False), "kernel": ("exp",),
                                                  "symmetric": (False,)}


@dataclasses.dataclass
class StudyOptions:
    """Command-line options of ``kernel-attention study NAME``."""

    scale: str = "small"              # "small" | "converged" | "paper"
    seeds: int | None = None          # runs per cell (seeds / folds / splits); None = the study's default
    data: str | None = None           # data root (None = the registry's default root)
    only: tuple[str, ...] = ()        # restrict to tables / rows / columns (ids), e.g. ("t1-sp",)
    nmt_data: str | None = None       # dataset name for NMT cells (small: multi30k, paper: iwslt14)
    lm_data: str | None = None        # dataset name for SP cells (small: wikitext-2, paper: wikitext-103)

    def dataset(self, name: str) -> Any:
        """A ``data.dataset`` spec for ``name`` under the chosen root."""
        return {"name": name, "root": self.data} if self.data else name


@dataclasses.dataclass
class Cell:
    study: str
    table: str
    row: str
    col: str
    seed: int
    config: dict[str, Any]
    tags: dict[str, Any] = dataclasses.field(default_factory=dict)   # e.g. {"p": 0.1} for figure cells
    scale: str = "small"               # set by Study.cells; picks the study folder (Study.folder)

    @property
    def id(self) -> str:
        return "__".join(_SAFE.sub("-", str(p)) for p in (self.table, self.row, self.col, f"s{self.seed}"))

    @property
    def key(self) -> str:
        """16 hex digits of a SHA-256 of the configuration that decides this cell's run: the config with
        numbers compared by value (the ``p: 3`` of a YAML file is a sweep's ``p = 3.0``) and without the
        folder the dataset is read from (``--data``) and without attention options spelled at the value their
        absence means (:data:`ATTENTION_DEFAULTS`), plus the probe flag (a probed run also writes the
        records the figures read).  Result records keep it (``config``), so that a result run with another
        configuration -- the same cell after a config was corrected -- is told apart (:mod:`.runner`)."""
        cfg = copy.deepcopy(self.config)
        ds = (cfg.get("data") or {}).get("dataset") if isinstance(cfg.get("data"), dict) else None
        if isinstance(ds, dict) and "name" in ds:
            cfg["data"]["dataset"] = ds["name"]
        model = cfg.get("model")
        for name, block in (model.items() if isinstance(model, dict) else ()):
            if name.endswith("attention") and isinstance(block, dict):
                for opt, same in ATTENTION_DEFAULTS.items():
                    if opt in block and block[opt] in same:
                        del block[opt]
        text = json.dumps([_normal(cfg), bool(self.tags.get("probe"))], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _normal(x: Any) -> Any:
    """``x`` with every int and float as a float (bools kept apart: True is not 1.0 in a config)."""
    if isinstance(x, dict):
        return {str(k): _normal(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_normal(v) for v in x]
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    return x


@dataclasses.dataclass
class TableSpec:
    """One table of the paper: rows and columns (id, label) and the paper's numbers as printed."""

    name: str
    title: str
    metric: str                       # key of the task's evaluate() dict: bleu, ppl, accuracy, rmse
    higher_is_better: bool
    rows: list[tuple[str, str]]
    cols: list[tuple[str, str]]
    paper: dict[tuple[str, str], str]
    scale_factor: float = 1.0         # ours x factor when shown (accuracy in %: 100)
    digits: int = 2
    scaled_units: bool = False        # regression: show RMSE in the scaled target units (runs' unit_factor)


@dataclasses.dataclass
class Study:
    name: str
    title: str
    protocol: str                      # "best_valid" | "mean_std"
    tables: list[TableSpec]
    build: Callable[[StudyOptions], tuple[list[Cell], list[str]]]
    default_seeds: dict[str, int]      # scale -> runs per cell
    figures: Callable[..., list[str]] | None = None   # (study_dir, cells, results) -> written PNG paths
    notes: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.protocol not in ("best_valid", "mean_std"):
            raise ValueError(f"study {self.name}: protocol {self.protocol!r} is not 'best_valid' or 'mean_std'")

    def folder(self, scale: str) -> str:
        """The folder of this study's cells at ``scale`` under a study's ``--out``: the name at the small
        scale, ``<name>-<scale>`` at the others."""
        return self.name if scale == "small" else f"{self.name}-{scale}"

    def cells(self, options: StudyOptions) -> tuple[list[Cell], list[str]]:
        """``build(options)``, each cell stamped with ``options.scale``; a scale the study has no setting
        for is a ValueError naming those it has."""
        if options.scale not in self.default_seeds:
            raise ValueError(f"study {self.name} has no {options.scale!r} scale; accepted: "
                             f"{', '.join(self.default_seeds)}")
        cells, shrink = self.build(options)
        for c in cells:
            c.scale = options.scale
        return cells, shrink

    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"study {self.name} has no table {name!r}; tables: {[t.name for t in self.tables]}")


STUDIES: dict[str, Study] = {}


def register_study(study: Study) -> Study:
    if study.name in STUDIES:
        raise ValueError(f"study {study.name!r} is already registered")
    STUDIES[study.name] = study
    return study


def get_study(name: str) -> Study:
    """The registered study ``name`` (the paper studies register when :mod:`kernel_attention.study` is
    imported, through :mod:`~kernel_attention.study.definitions`)."""
    if name not in STUDIES:
        raise KeyError(f"unknown study {name!r}; accepted: {', '.join(sorted(STUDIES))}")
    return STUDIES[name]
