"""Autocast across a hand-written backward pass.

PyTorch runs a custom autograd Function's forward under the caller's autocast and its backward without it.
Where the forward's inputs come in two dtypes -- CUDA's autocast computes exp, pow and log in float32 beside
bf16 products, so the implicit kernels' log k and a positional term arrive in float32 beside bf16 values -- the
forward's products were cast by autocast, and the backward's would meet both dtypes.  ``torch.amp.custom_bwd``
replays the forward's autocast in the backward, but binds one device type when the class is defined; the
Functions here run on any device, so the state is recorded per call:

    forward:   ctx.autocast = autocast_state(v)
    backward:  with replay(ctx.autocast): ...
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

__all__ = ["autocast_state", "replay"]


def autocast_state(t: Tensor) -> tuple[str, torch.dtype] | None:
    """(device type, dtype) of the autocast in force for ``t``'s device, or None where it is off."""
    dev = t.device.type
    return (dev, torch.get_autocast_dtype(dev)) if torch.is_autocast_enabled(dev) else None


def replay(state: tuple[str, torch.dtype] | None):
    """A context that turns on the autocast :func:`autocast_state` recorded (none: nothing)."""
    return torch.autocast(state[0], dtype=state[1]) if state is not None else contextlib.nullcontext()
