"""Regression tables and series of the IKA paper and the UCI benchmark of Gal & Ghahramani.

Layouts (under ``root/uci-regression`` unless said otherwise):

* Gal & Ghahramani (``<folder>/``): ``data.txt`` (or ``data.txt.gz``), whitespace-separated numbers, one row
  per instance; ``index_features.txt`` / ``index_target.txt`` (0-based columns, one per line);
  ``n_splits.txt`` and ``index_train_K.txt`` / ``index_test_K.txt`` (0-based rows of the given split K).
* Parkinsons telemonitoring: ``parkinsons-telemonitoring/parkinsons_updrs.data``, CSV with header.
* Mauna Loa CO2: ``root/timeseries/mauna-loa-co2/co2_mm_mlo.txt`` (NOAA monthly file, ``#`` comments);
  x = decimal date, y = monthly average (the columns the IKA code reads).
* Airline passengers: ``root/timeseries/airline-passengers/AirPassengers.csv``; x = month number 0..143,
  y = passengers (thousands), as the IKA code.

Every loader returns :class:`RegressionData` with ``x`` (N, F) and ``y`` (N, 1) float64 tensors, unscaled.
:func:`fit_scaler` gives min-max to [-1, 1] (what the IKA code does to housing and parkinsons, fitted on
the whole table) or standard scaling, fitted on any index set; :func:`kernel_attention.data.protocols.random_splits`
gives the IKA paper's ten random 90/10 splits.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Sequence

import torch

from .files import DataFormatError, read_lines
from .protocols import Split, random_splits

__all__ = ["RegressionData", "Scaler", "fit_scaler", "UCI_FOLDERS", "load_uci", "load_parkinsons", "load_co2",
           "load_airline", "load_regression"]

UCI_FOLDERS = {
    "boston": "bostonHousing", "housing": "bostonHousing", "concrete": "concrete", "energy": "energy",
    "kin8nm": "kin8nm", "naval": "naval-propulsion-plant", "power": "power-plant",
    "protein": "protein-tertiary-structure", "wine-red": "wine-quality-red", "yacht": "yacht",
}


@dataclasses.dataclass
class RegressionData:
    """``x``: (N, F) float64, ``y``: (N, 1) float64; ``given_splits``: the dataset's own splits (Gal &
    Ghahramani's 20, or 5 for protein), ``[]`` when it has none."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    feature_names: list[str]
    target_name: str
    given_splits: list[Split] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return self.x.shape[0]

    def sizes(self) -> dict[str, int]:
        return {"rows": len(self), "features": self.x.shape[1], "given_splits": len(self.given_splits)}

    def random_splits(self, n_splits: int = 10, train_fraction: float = 0.9, seed: int = 0) -> list[Split]:
        return random_splits(len(self), n_splits, train_fraction, seed)


@dataclasses.dataclass
class Scaler:
    """Per-column affine map ``z = (v - shift) / scale + offset``; ``inverse`` undoes it (e.g. to report
    RMSE in original units: RMSE_original = RMSE_scaled * scale for a min-max or standard target)."""

    method: str
    shift: list[float]
    scale: list[float]
    offset: float

    def transform(self, v: torch.Tensor) -> torch.Tensor:
        return (v - torch.tensor(self.shift, dtype=v.dtype)) / torch.tensor(self.scale, dtype=v.dtype) + self.offset

    def inverse(self, z: torch.Tensor) -> torch.Tensor:
        return (z - self.offset) * torch.tensor(self.scale, dtype=z.dtype) + torch.tensor(self.shift, dtype=z.dtype)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def fit_scaler(v: torch.Tensor, method: str = "minmax", indices: Sequence[int] | None = None) -> Scaler:
    """Fit on ``v[indices]`` ((N, F); all rows by default).  ``"minmax"``: to [-1, 1],
    ``z = 2 (v - min) / (max - min) - 1``; ``"standard"``: ``z = (v - mean) / std`` (population std);
    ``"none"``: identity.  A constant column gets scale 1 (it maps to a constant, not to NaN)."""
    fit = v if indices is None else v[torch.as_tensor(list(indices), dtype=torch.long)]
    if method == "minmax":
        lo, hi = fit.min(0).values, fit.max(0).values
        rng = hi - lo
        half = torch.where(rng > 0, rng / 2, torch.ones_like(rng))
        return Scaler(method, (lo + rng / 2).tolist(), half.tolist(), 0.0)
    if method == "standard":
        mu, sd = fit.mean(0), fit.std(0, unbiased=False)
        return Scaler(method, mu.tolist(), torch.where(sd > 0, sd, torch.ones_like(sd)).tolist(), 0.0)
    if method == "none":
        return Scaler(method, [0.0] * v.shape[1], [1.0] * v.shape[1], 0.0)
    raise ValueError(f"unknown scaling {method!r}; accepted: minmax, standard, none")


def _numbers(path: Path, dataset: str, sep: str | None = None, skip_comments: bool = False, header: bool = False):
    """Rows of floats; blank lines are skipped, a row of a different width, a non-number or a nan / inf is
    an error naming the file and line."""
    p, lines = read_lines(path, "utf-8", dataset)
    rows, width, head = [], None, None
    for i, line in enumerate(lines):
        if not line.strip() or (skip_comments and line.lstrip().startswith("#")):
            continue
        fields = [f.strip().strip('"') for f in (line.split(sep) if sep else line.split())]
        if header and head is None:
            head = fields
            continue
        if width is None:
            width = len(fields)
        if len(fields) != width:
            raise DataFormatError(p, i + 1, f"expected {width} fields, got {len(fields)}")
        try:
            row = [float(f) for f in fields]
        except ValueError:
            bad = next(f for f in fields if not _is_float(f))
            raise DataFormatError(p, i + 1, f"not a number: {bad[:30]!r}") from None
        if not all(map(math.isfinite, row)):  # float() reads nan / inf; a regression table has neither
            bad = next(f for f, v in zip(fields, row) if not math.isfinite(v))
            raise DataFormatError(p, i + 1, f"not a finite number: {bad[:30]!r} (column {fields.index(bad) + 1}); "
                                            "a missing value must be imputed or its row removed")
        rows.append(row)
    if not rows:
        raise DataFormatError(p, None, "no data rows")
    return head, torch.tensor(rows, dtype=torch.float64)


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _indices(path: Path, dataset: str, limit: int) -> list[int]:
    p, lines = read_lines(path, "utf-8", dataset)
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            v = int(float(line))  # some index files write 3.0
        except ValueError:
            raise DataFormatError(p, i + 1, f"not an index: {line[:30]!r}") from None
        if not 0 <= v < limit:
            raise DataFormatError(p, i + 1, f"index {v} outside 0..{limit - 1}")
        out.append(v)
    return out


def load_uci(root: str | Path, name: str) -> RegressionData:
    if name not in UCI_FOLDERS:
        raise ValueError(f"unknown UCI dataset {name!r}; accepted: {', '.join(UCI_FOLDERS)}")
    folder = Path(root) / "uci-regression" / UCI_FOLDERS[name]
    _, table = _numbers(folder / "data.txt", name)
    feats = _indices(folder / "index_features.txt", name, table.shape[1])
    target = _indices(folder / "index_target.txt", name, table.shape[1])
    if len(target) != 1:
        raise DataFormatError(folder / "index_target.txt", None, f"expected one target column, got {target}")
    p, n_lines = read_lines(folder / "n_splits.txt", "utf-8", name)
    try:
        n_splits = int(n_lines[0])
    except (ValueError, IndexError):
        raise DataFormatError(p, 1, "expected the number of splits") from None
    if n_splits < 1:
        raise DataFormatError(p, 1, f"the number of splits must be >= 1, got {n_splits}")
    splits = []
    for k in range(n_splits):
        tr = _indices(folder / f"index_train_{k}.txt", name, table.shape[0])
        te = _indices(folder / f"index_test_{k}.txt", name, table.shape[0])
        if set(tr) & set(te):
            raise DataFormatError(folder / f"index_test_{k}.txt", None, "train and test indices overlap")
        splits.append(Split(tr, te, [], k, None, "given"))
    return RegressionData(name, table[:, feats], table[:, target], [f"col{j}" for j in feats], f"col{target[0]}", splits)


def load_parkinsons(root: str | Path, target: str = "total_UPDRS", drop_other_score: bool = True,
                    subject: bool = False) -> RegressionData:
    """Parkinsons telemonitoring.  Features: every column except ``subject#`` and the target (and the other
    UPDRS score when ``drop_other_score``: the two scores are strongly correlated, so keeping one as an input
    makes the task far easier), 19 by default; ``subject`` keeps ``subject#`` as an input too (42 patients,
    each recorded about 140 times over six months: the target's standard deviation within a patient is about
    a quarter of its standard deviation over all rows)."""
    path = Path(root) / "uci-regression" / "parkinsons-telemonitoring" / "parkinsons_updrs.data"
    head, table = _numbers(path, "parkinsons", sep=",", header=True)
    scores = ("motor_UPDRS", "total_UPDRS")
    if target not in scores:
        raise ValueError(f"target must be one of {scores}, got {target!r}")
    if head is None or target not in head or len(head) != table.shape[1]:
        raise DataFormatError(path, 1, f"header {head} does not name the {table.shape[1]} columns with {target!r}")
    dropped = ({target} | (set() if subject else {"subject#"})
               | ({s for s in scores} if drop_other_score else set()))
    cols = [j for j, h in enumerate(head) if h not in dropped]
    t = head.index(target)
    return RegressionData("parkinsons", table[:, cols], table[:, [t]], [head[j] for j in cols], target)


def load_co2(root: str | Path, end_year: float | None = None) -> RegressionData:
    """Mauna Loa monthly CO2: x = decimal date (N, 1), y = monthly mean ppm.  ``end_year`` cuts the series
    (e.g. 2004 to compare with the classic GP example)."""
    path = Path(root) / "timeseries" / "mauna-loa-co2" / "co2_mm_mlo.txt"
    _, table = _numbers(path, "co2", skip_comments=True)
    if table.shape[1] < 4:
        raise DataFormatError(path, None, f"expected at least 4 columns (year month decimal average), got {table.shape[1]}")
    if end_year is not None:
        table = table[table[:, 2] < end_year]
    return RegressionData("co2", table[:, [2]], table[:, [3]], ["decimal_date"], "monthly_average")


def load_airline(root: str | Path) -> RegressionData:
    """Airline passengers: x = month number 0..N-1 (N, 1), y = passengers in thousands."""
    path = Path(root) / "timeseries" / "airline-passengers" / "AirPassengers.csv"
    p, lines = read_lines(path, "utf-8", "airline")
    values = []
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = [f.strip().strip('"') for f in line.split(",")]
        if len(fields) != 2 or not _is_float(fields[1]) or not math.isfinite(float(fields[1])):
            raise DataFormatError(p, i, f"expected 'YYYY-MM-DD,value' with a finite value, got {line[:40]!r}")
        values.append(float(fields[1]))
    if not values:
        raise DataFormatError(p, None, "no data rows")
    y = torch.tensor(values, dtype=torch.float64)[:, None]
    return RegressionData("airline", torch.arange(len(values), dtype=torch.float64)[:, None], y, ["month"], "passengers")


def load_regression(root: str | Path, name: str) -> RegressionData:
    if name in UCI_FOLDERS:
        return load_uci(root, name)
    loaders = {"parkinsons": load_parkinsons, "co2": load_co2, "airline": load_airline}
    if name not in loaders:
        raise ValueError(f"unknown regression dataset {name!r}; accepted: {', '.join([*UCI_FOLDERS, *loaders])}")
    return loaders[name](root)
