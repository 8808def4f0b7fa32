"""The optimiser of a training run: ``torch.optim.Adam`` (``train.optimizer: adam``, L2 weight decay added to
the gradient) or ``AdamW`` (``adamw``, decoupled weight decay), on PyTorch's fused implementation where the
device has one (CPU, CUDA): one kernel over all parameters per update rather than a handful of elementwise
operations per parameter.

Which implementation runs is not part of a checkpoint's meaning: :func:`load_optimizer_state` loads the
moments and step counts of a state written by either implementation, on any device, into the one built here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from kernel_attention.training.config import TrainConfig

__all__ = ["make_optimizer", "load_optimizer_state"]

#: Device types whose parameters PyTorch's fused Adam / AdamW update.
FUSED_DEVICES = ("cpu", "cuda")


def _fused(device: torch.device) -> bool | None:
    return True if device.type in FUSED_DEVICES else None


def make_optimizer(params: Iterable[torch.nn.Parameter], config: TrainConfig,
                   device: torch.device) -> torch.optim.Optimizer:
    """Adam or AdamW over ``params`` (on ``device``) with the config's lr, betas, eps and weight decay."""
    cls = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay,
               fused=_fused(device))


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)`` keeping ``optimizer``'s implementation (fused or not).

    A state dict's parameter groups carry the implementation flags of the optimiser that wrote it, and
    loading would put them back (and place the step counts for that implementation: on the parameters'
    device when fused, on the host otherwise); the groups get this optimiser's flags first."""
    saved = state["param_groups"]
    if len(saved) == len(optimizer.param_groups):  # else load_state_dict refuses it, saying why
        flags = [{k: g.get(k) for k in ("fused", "foreach")} for g in optimizer.param_groups]
        state = {**state, "param_groups": [{**group, **own} for group, own in zip(saved, flags)]}
    optimizer.load_state_dict(state)
