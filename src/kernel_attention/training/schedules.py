"""Learning-rate schedules, registered by name in :data:`SCHEDULES`.

A schedule is a pure function of the update count: ``schedule(step) -> lr``, where ``step`` is the number
of optimiser updates already made (0 for the first update).  Being stateless, it resumes exactly from the
step stored in a checkpoint.  The trainer builds one with the run's base ``lr`` and ``max_steps``::

    SCHEDULES.create("inverse_sqrt:warmup=4000,warmup_init_lr=1e-7", lr=5e-4, max_steps=50000)

Names (``kernel-attention`` CLI / configs use the same strings):

``constant``      lr, optionally after a linear warm-up from 0.
``inverse_sqrt``  fairseq ``--lr-scheduler inverse_sqrt``:
                      lr(s) = warmup_init_lr + s * (lr - warmup_init_lr) / warmup     for s < warmup
                      lr(s) = lr * sqrt(warmup / s)                                      for s >= warmup
                  fairseq sets the rate for update s+1 from ``num_updates = s``; so does ``lr(s)``.
                  (fairseq's ``--min-lr`` is a stopping rule there, not a floor; use ``max_steps``.)
``cosine``        Transformer-XL ``--scheduler cosine`` (``CosineAnnealingLR(T_max=max_step)`` stepped
                  with the global step, linear warm-up from 0 replacing it during the first ``warmup``):
                      lr(s) = lr * s / warmup                                            for s < warmup
                      lr(s) = eta_min + (lr - eta_min) * (1 + cos(pi * s / T)) / 2       otherwise
                  with T = ``total`` if given else the run's ``max_steps``; lr(s >= T) = eta_min.
"""

from __future__ import annotations

import math

from kernel_attention.registry import Param, Registry

__all__ = ["SCHEDULES", "Schedule", "Constant", "InverseSqrt", "Cosine"]

SCHEDULES = Registry("schedule")


class Schedule:
    """Base class: ``__call__(step) -> lr`` for the update numbered ``step`` (0-based)."""

    def __call__(self, step: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


def _nonneg(x) -> bool:
    return x >= 0


class Constant(Schedule):
    def __init__(self, lr: float, warmup: int = 0):
        self.lr, self.warmup = lr, warmup

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * step / self.warmup
        return self.lr


class InverseSqrt(Schedule):
    def __init__(self, lr: float, warmup: int = 4000, warmup_init_lr: float = 0.0):
        if warmup < 1:
            raise ValueError(f"inverse_sqrt needs warmup >= 1, got {warmup}")
        self.lr, self.warmup, self.warmup_init_lr = lr, warmup, warmup_init_lr

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.warmup_init_lr + step * (self.lr - self.warmup_init_lr) / self.warmup
        return self.lr * math.sqrt(self.warmup) / math.sqrt(step)


class Cosine(Schedule):
    def __init__(self, lr: float, total: int, warmup: int = 0, eta_min: float = 0.0):
        if total < 1:
            raise ValueError(f"cosine needs a positive number of steps (total or max_steps), got {total}")
        self.lr, self.total, self.warmup, self.eta_min = lr, total, warmup, eta_min

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * step / self.warmup
        if step >= self.total:
            return self.eta_min
        return self.eta_min + (self.lr - self.eta_min) * (1 + math.cos(math.pi * step / self.total)) / 2


_WARMUP = Param("warmup", int, 0, "linear warm-up updates", check=_nonneg, rule=">= 0")


@SCHEDULES.register("constant", [_WARMUP], "constant lr, optional linear warm-up from 0")
def _constant(lr: float, max_steps: int | None = None, warmup: int = 0) -> Schedule:
    return Constant(lr, warmup)


@SCHEDULES.register(
    "inverse_sqrt",
    [
        Param("warmup", int, 4000, "warm-up updates (fairseq --warmup-updates)", check=lambda x: x >= 1, rule=">= 1"),
        Param("warmup_init_lr", float, 0.0, "lr at update 0 (fairseq --warmup-init-lr)", check=_nonneg, rule=">= 0"),
    ],
    "fairseq inverse square root with linear warm-up",
)
def _inverse_sqrt(lr: float, max_steps: int | None = None, warmup: int = 4000, warmup_init_lr: float = 0.0) -> Schedule:
    return InverseSqrt(lr, warmup, warmup_init_lr)


@SCHEDULES.register(
    "cosine",
    [
        _WARMUP,
        Param("eta_min", float, 0.0, "final lr", check=_nonneg, rule=">= 0"),
        Param("total", int, None, "steps of the half cosine (default: max_steps)", optional=True),
    ],
    "Transformer-XL cosine annealing to eta_min over max_steps",
)
def _cosine(lr: float, max_steps: int | None = None, warmup: int = 0, eta_min: float = 0.0,
            total: int | None = None) -> Schedule:
    total = total if total is not None else max_steps
    if total is None:
        raise ValueError("schedule 'cosine' needs max_steps (or its 'total' parameter)")
    return Cosine(lr, total, warmup, eta_min)
