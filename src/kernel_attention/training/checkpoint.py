"""Checkpoints: everything needed to continue a run *exactly*, written atomically.

Layout of ``<run_dir>/last.pt`` and ``<run_dir>/best.pt`` (a ``torch.save`` dict; ``best.pt`` is the same
dict taken at the evaluation with the best selection metric so far)::

    {
      "format": "kernel-attention-checkpoint", "version": 1,
      "model":     unwrapped model state_dict,
      "optimizer": optimiser state_dict,
      "schedule":  {"spec": schedule spec as given, "lr": lr of the last update},
      "scaler":    GradScaler state_dict or None,
      "rng":       [per rank: {"python": random.getstate(), "numpy": {...}, "torch": ByteTensor,
                               "cuda": [ByteTensor per device] or None}],
      "step":      optimiser updates made,
      "epoch":     current epoch (0-based),
      "position":  micro-batches of this epoch already consumed,
      "best":      {"metric": name, "value": float or None, "step": int or None},
      "config":    the TrainConfig as a dict,
      "extra":     free dict (e.g. the task / model config, vocab) for later loading,
    }

Every value is a tensor or plain Python, so the file loads with ``torch.load(weights_only=True)``.
Writing goes to ``<name>.<pid>.tmp`` in the same directory and is moved in place with :func:`os.replace`
(:mod:`kernel_attention.atomic_write`), so a kill during a save never leaves a truncated ``last.pt``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kernel_attention.atomic_write import replacing

__all__ = ["FORMAT", "save_checkpoint", "load_checkpoint", "get_rng_state", "set_rng_state"]

FORMAT = "kernel-attention-checkpoint"


def get_rng_state() -> dict[str, Any]:
    """States of Python's, NumPy's legacy global, torch's CPU and (if present) CUDA generators."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    # A checkpoint loaded with map_location="cuda" brings these tensors to the GPU: the CPU generators
    # take CPU tensors.
    np.random.set_state((n["kind"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached"]))
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _as_tuple(x: Any) -> Any:
    # random.setstate needs tuples; a round trip through some loaders turns them into lists
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` (see the module docstring) to ``path`` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        torch.save({"format": FORMAT, "version": 1, **state}, tmp)
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`; fails clearly on anything else."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a kernel-attention checkpoint (format {FORMAT!r})")
    return state
