"""Evaluation protocols of the two papers, seeded and recorded as plain JSON-ready objects.

* Transformer Dissection (sec. 1.6 of the reference notes): N random initialisations, report the test score
  of the run with the best validation score -> :func:`select_best`.
* Implicit Kernel Attention: mean +- std over repeated runs (10 random 90/10 splits for the regression
  tables, 10-fold CV for MR/CR/SUBJ/MPQA) -> :func:`mean_std`, :func:`random_splits`,
  :func:`kfold_indices`.

Every function that draws random numbers takes an explicit ``seed`` and uses its own
``numpy.random.default_rng``, so it touches no global state and the same seed gives the same split on
every machine.  Results are dataclasses with ``to_dict()`` (lists and numbers only) for ``json.dump``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = [
    "Split",
    "kfold_indices",
    "random_splits",
    "train_dev_split",
    "cut_by_fractions",
    "seed_list",
    "Selection",
    "select_best",
    "Summary",
    "mean_std",
]


@dataclasses.dataclass
class Split:
    """Index lists of one split (fold ``fold`` of a protocol); ``dev`` may be empty."""

    train: list[int]
    test: list[int]
    dev: list[int] = dataclasses.field(default_factory=list)
    fold: int = 0
    seed: int | None = None
    protocol: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check_seed(seed: Any) -> int:
    if seed is None or isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"an explicit integer seed is required, got {seed!r}")
    return int(seed)


def kfold_indices(n: int, k: int = 10, seed: int = 0, labels: Sequence[int] | None = None) -> list[Split]:
    """``k`` folds of ``range(n)``: the test parts are disjoint and cover every index once; fold ``i``
    trains on the rest.  The order is shuffled with ``seed`` first (the classification ``.all`` files are
    sorted by class).  With ``labels``, folds are stratified: each class is dealt round-robin over the
    folds after shuffling, so class proportions are equal up to one example per fold."""
    seed = _check_seed(seed)
    if not 2 <= k <= n:
        raise ValueError(f"k-fold needs 2 <= k <= n, got k={k}, n={n}")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    fold_of = np.empty(n, dtype=np.int64)
    if labels is None:
        fold_of[perm] = np.arange(n) % k
    else:
        labels = np.asarray(labels)
        if labels.shape != (n,):
            raise ValueError(f"labels must have shape ({n},), got {labels.shape}")
        offset = 0
        for c in np.unique(labels):
            members = perm[labels[perm] == c]  # shuffled members of class c
            fold_of[members] = (np.arange(members.size) + offset) % k
            offset += members.size  # continue the round-robin where the previous class stopped
    out = []
    for i in range(k):
        test = np.nonzero(fold_of == i)[0]
        train = np.nonzero(fold_of != i)[0]
        out.append(Split(train.tolist(), test.tolist(), [], i, seed, f"{k}-fold" + (" stratified" if labels is not None else "")))
    return out


def random_splits(n: int, n_splits: int = 10, train_fraction: float = 0.9, seed: int = 0) -> list[Split]:
    """The IKA regression protocol: split ``i`` shuffles ``range(n)`` with seed ``seed + i`` and trains on
    the first ``int(n * train_fraction)`` indices, tests on the rest (as the official code,
    ``idx[:int(num_data * tr_ratio)]``)."""
    seed = _check_seed(seed)
    if isinstance(n_splits, bool) or not isinstance(n_splits, (int, np.integer)) or n_splits < 1:
        raise ValueError(f"n_splits must be an integer >= 1, got {n_splits!r}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    n_train = int(n * train_fraction)
    if n_train == 0 or n_train == n:
        raise ValueError(f"{n} examples cannot be split {train_fraction:.2f}/{1 - train_fraction:.2f}")
    out = []
    for i in range(n_splits):
        perm = np.random.default_rng(seed + i).permutation(n)
        out.append(Split(np.sort(perm[:n_train]).tolist(), np.sort(perm[n_train:]).tolist(), [], i, seed + i,
                         f"random {train_fraction:.2f}/{1 - train_fraction:.2f}"))
    return out


def train_dev_split(split: Split, dev_fraction: float = 0.1, seed: int = 0) -> Split:
    """Move a random ``dev_fraction`` of ``split.train`` to ``split.dev`` (Kim 2014 holds out 10% of the
    training part for early stopping when a dataset has no dev set)."""
    seed = _check_seed(seed)
    train = np.asarray(split.train)
    perm = np.random.default_rng(seed).permutation(train.size)
    n_dev = int(round(train.size * dev_fraction))
    return dataclasses.replace(split, train=np.sort(train[perm[n_dev:]]).tolist(),
                               dev=np.sort(train[perm[:n_dev]]).tolist())


def cut_by_fractions(n: int, valid: float, test: float, seed: int, what: str = "rows",
                     where: str | None = None) -> dict[str, list[int]]:
    """The user's-own-data cut of one file: ``range(n)`` shuffled with ``seed`` (``torch.randperm``, so a cut
    made before stays the same), the first ``valid`` fraction for valid (none when ``valid`` is 0, else at
    least one), the next ``test`` fraction for test (at least one), the rest for train; each list sorted.
    ``what`` and ``where`` (the file) name the items in the errors."""
    import torch

    from .files import DataFormatError

    if not (0 <= valid < 1 and 0 < test < 1 and valid + test < 1):
        raise ValueError(f"valid={valid} and test={test} must be fractions (test above 0) with a sum below 1")
    if n < 3:
        raise DataFormatError(where or "<data>", None, f"{n} {what} are too few to cut into train/valid/test")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_valid = max(1, round(valid * n)) if valid > 0 else 0
    n_test = max(1, round(test * n))
    cut = {"valid": order[:n_valid], "test": order[n_valid:n_valid + n_test], "train": order[n_valid + n_test:]}
    return {s: sorted(idx) for s, idx in cut.items()}


def seed_list(base: int, n: int) -> list[int]:
    """The seeds of ``n`` runs: ``base, base+1, ...`` (recorded with every result)."""
    return [_check_seed(base) + i for i in range(n)]


@dataclasses.dataclass
class Selection:
    """Outcome of best-validation selection: the chosen run, its scores, and every run for the record."""

    best_index: int
    best_seed: Any
    valid: float
    test: float
    mode: str
    runs: list[dict]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def select_best(runs: Sequence[Mapping[str, Any]], valid_key: str = "valid", test_key: str = "test",
                mode: str = "max", seed_key: str = "seed") -> Selection:
    """Pick the run with the best ``run[valid_key]`` (``mode="max"`` for BLEU/accuracy, ``"min"`` for
    perplexity/RMSE) and report its ``run[test_key]``; ties go to the earliest run; NaN never wins."""
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    if not runs:
        raise ValueError("select_best needs at least one run")
    best = None
    for i, r in enumerate(runs):
        for key in (valid_key, test_key):
            if key not in r:
                raise KeyError(f"run {i} has no {key!r} (keys: {sorted(r)})")
        v = float(r[valid_key])
        if math.isnan(v):
            continue
        if best is None or (v > float(runs[best][valid_key]) if mode == "max" else v < float(runs[best][valid_key])):
            best = i
    if best is None:
        raise ValueError(f"every run has a NaN {valid_key!r}")
    chosen = runs[best]
    return Selection(best, chosen.get(seed_key), float(chosen[valid_key]), float(chosen[test_key]), mode,
                     [dict(r) for r in runs])


@dataclasses.dataclass
class Summary:
    """``mean`` and ``std`` of ``values`` (``ddof`` 0 as numpy's default, used by the IKA code; 1 for the
    sample standard deviation)."""

    mean: float
    std: float
    n: int
    ddof: int
    values: list[float]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return f"{self.mean:.4g} ± {self.std:.2g} (n={self.n})"


def mean_std(values: Sequence[float], ddof: int = 0) -> Summary:
    v = np.asarray([float(x) for x in values], dtype=np.float64)
    if v.size == 0 or v.size <= ddof:
        raise ValueError(f"mean_std needs more than ddof={ddof} values, got {v.size}")
    return Summary(float(v.mean()), float(v.std(ddof=ddof)), int(v.size), ddof, v.tolist())
