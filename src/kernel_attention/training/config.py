"""The training configuration: :class:`TrainConfig`, the ``train:`` section of a YAML config, and
:func:`seed_everything`.  What the fields do is :mod:`kernel_attention.training.loop`'s docstring."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import numpy as np
import torch

from kernel_attention.training.schedules import SCHEDULES

__all__ = ["TrainConfig", "seed_everything"]

#: numeric fields: (int or float, lowest accepted value or None, what is accepted); a None value is
#: accepted only where the field's default is None.  Checked up front, so that ``train.lr=nan`` or
#: ``train.log_every=0`` fails naming the key before any work instead of as a NaN loss or a
#: ZeroDivisionError some steps in.
_NUMBERS: dict[str, tuple[type, float | None, str]] = {
    "seed": (int, None, "an integer"),
    "max_steps": (int, 1, "an integer >= 1 (or null)"),
    "max_epochs": (int, 1, "an integer >= 1 (or null)"),
    "lr": (float, 0, "a finite number > 0"),
    "eps": (float, 0, "a finite number > 0"),
    "weight_decay": (float, 0, "a finite number >= 0"),
    "clip_norm": (float, 0, "a finite number >= 0 (0 = no clipping)"),
    "accum_steps": (int, 1, "an integer >= 1"),
    "regularization_weight": (float, 0, "a finite number >= 0"),
    "log_every": (int, 1, "an integer >= 1"),
    "eval_every": (int, 0, "an integer >= 0 (0 = only at the end)"),
    "checkpoint_every": (int, 0, "an integer >= 0 (0 = only at the end)"),
    "checkpoint_minutes": (float, 0, ">= 0 (0 = off), a finite number of minutes"),
    "keep_last": (int, 0, "an integer >= 0 (0 = none)"),
    "stop_after": (int, 0, "an integer >= 0 (or null)"),
    "patience": (int, 1, "an integer >= 1 (or null: no early stopping)"),
}
_STRICT = ("lr", "eps")  # > low, not >= low


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _checked(name: str, value: Any, kind: type, low: float | None, rule: str) -> Any:
    """``value`` as ``kind`` if it is what ``train.<name>`` accepts, else a ValueError naming both."""
    if value is None and "null" in rule:
        return None
    bad = ValueError(f"train.{name} must be {rule}, got {value!r}")
    if not _is_number(value) or (kind is int and float(value) != int(value)):
        raise bad
    if low is not None and (value <= low if name in _STRICT else value < low):
        raise bad
    return int(value) if kind is int else float(value)


@dataclasses.dataclass
class TrainConfig:
    """Everything the loop needs; the ``train:`` section of a YAML config maps onto these fields."""

    seed: int = 0
    max_steps: int | None = None        # optimiser updates; at least one of max_steps / max_epochs
    max_epochs: int | None = None
    optimizer: str = "adam"             # "adam" | "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: Any = "constant"          # a SCHEDULES spec: "inverse_sqrt:warmup=4000", {"name": "cosine"}, ...
    clip_norm: float = 0.0              # max global grad norm; 0 = no clipping
    accum_steps: int = 1                # micro-batches per update
    precision: str = "fp32"             # "fp32" | "bf16" (autocast, CPU or CUDA) | "fp16" (CUDA only)
    regularization_weight: float = 1.0  # weight of model.regularization() when the model has one
    log_every: int = 1                  # steps between "train" records
    eval_every: int = 0                 # steps between "valid" evaluations; 0 = only at the end
    patience: int | None = None         # stop after this many evaluations without a better validation
                                        # metric (early stopping; needs eval_every > 0); None = never
    checkpoint_every: int = 0           # steps between last.pt writes; 0 = only at the end
    checkpoint_minutes: float = 10.0    # also write last.pt once this long has passed since the last write
                                        # (checked on logged steps; 0 = off), so a kill loses at most that
    keep_last: int = 0                  # also keep the weights of the last N checkpoint_every checkpoints (and
                                        # the final one) as step_<k>.pt, for checkpoint averaging (.averaging)
    test_best: bool = True              # at the end, also evaluate best.pt on "test"
    progress: bool | None = None        # tqdm bar; None = on a TTY, else plain lines every log_every steps
                                        # (rank 0); false = neither
    tensorboard: bool = False
    device: str | None = None           # None = cuda:LOCAL_RANK if available else cpu
    compile: bool = False               # train through torch.compile(model, dynamic=True); evaluation and
                                        # checkpoints use the eager module, so the weights are the same
    stop_after: int | None = None       # simulate a kill after this global step (tests)

    def __post_init__(self):
        if self.max_steps is None and self.max_epochs is None:
            raise ValueError("TrainConfig needs max_steps or max_epochs")
        for name, (kind, low, rule) in _NUMBERS.items():
            setattr(self, name, _checked(name, getattr(self, name), kind, low, rule))
        for name in ("test_best", "tensorboard", "compile") + (("progress",) if self.progress is not None else ()):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"train.{name} must be true or false{' (or null)' if name == 'progress' else ''}, "
                                 f"got {getattr(self, name)!r}")
        if self.patience is not None and not self.eval_every:
            raise ValueError(f"train.patience={self.patience} counts evaluations: it needs train.eval_every > 0")
        if self.keep_last and not self.checkpoint_every:
            raise ValueError(f"train.keep_last={self.keep_last} keeps the checkpoints of train.checkpoint_every: "
                             "it needs train.checkpoint_every > 0")
        if self.optimizer not in ("adam", "adamw"):
            raise ValueError(f"optimizer {self.optimizer!r} is not one of ['adam', 'adamw']")
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision {self.precision!r} is not one of ['fp32', 'bf16', 'fp16']")
        if self.device is not None:
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError):
                raise ValueError(f"train.device must be a device name such as cpu, cuda or cuda:0 (or null), got "
                                 f"{self.device!r}") from None
        betas = self.betas
        if (not isinstance(betas, (list, tuple)) or len(betas) != 2
                or not all(_is_number(b) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"train.betas must be two numbers in [0, 1), e.g. [0.9, 0.98], got {betas!r}")
        self.betas = tuple(float(b) for b in betas)
        SCHEDULES.validate(self.schedule)  # fail before any work on a bad schedule name / parameter

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """Build from a config section; unknown keys fail naming the accepted ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"unknown train option(s) {', '.join(unknown)}; accepted: {', '.join(names)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's global and torch's (CPU and CUDA) generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
