"""The training configuration: :class:`TrainConfig`, the ``train:`` section of a YAML config, and
:func:`seed_everything`.  What the fields do is :mod:`kernel_attention.training.loop`'s docstring."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import torch

from kernel_attention.training.schedules import SCHEDULES

__all__ = ["TrainConfig", "seed_everything"]


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
    precision: str = "fp32"             # "fp32" | "bf16" | "fp16"
    regularization_weight: float = 1.0  # weight of model.regularization() when the model has one
    log_every: int = 1                  # steps between "train" records
    eval_every: int = 0                 # steps between "valid" evaluations; 0 = only at the end
    checkpoint_every: int = 0           # steps between last.pt writes; 0 = only at the end
    checkpoint_minutes: float = 10.0    # also write last.pt once this long has passed since the last write
                                        # (checked on logged steps; 0 = off), so a kill loses at most that
    test_best: bool = True              # at the end, also evaluate best.pt on "test"
    progress: bool | None = None        # tqdm bar; None = only on a TTY, rank 0
    tensorboard: bool = False
    device: str | None = None           # None = cuda:LOCAL_RANK if available else cpu
    stop_after: int | None = None       # simulate a kill after this global step (tests)

    def __post_init__(self):
        if self.max_steps is None and self.max_epochs is None:
            raise ValueError("TrainConfig needs max_steps or max_epochs")
        if self.optimizer not in ("adam", "adamw"):
            raise ValueError(f"optimizer {self.optimizer!r} is not one of ['adam', 'adamw']")
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision {self.precision!r} is not one of ['fp32', 'bf16', 'fp16']")
        if self.checkpoint_minutes < 0:
            raise ValueError(f"checkpoint_minutes must be >= 0 (0 = off), got {self.checkpoint_minutes}")
        if self.accum_steps < 1:
            raise ValueError(f"accum_steps must be >= 1, got {self.accum_steps}")
        self.betas = tuple(float(b) for b in self.betas)
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
