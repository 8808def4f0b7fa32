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
      "task_state": [per rank: Task.train_state(), e.g. {"mems": a Transformer-XL memory} or None],
      "step":      optimiser updates made,
      "epoch":     current epoch (0-based),
      "position":  micro-batches of this epoch already consumed,
      "log_window": [per rank: {"sums": {log: sum}, "steps": int, "tokens": int}, the updates since the last
                     train record],
      "best":      {"metric": name, "value": float or None, "step": int or None},
      "stale_evals": evaluations since best improved, "finished": bool, "elapsed_s": seconds trained,
      "config":    the TrainConfig as a dict,
      "extra":     free dict (e.g. the task / model config, vocab) for later loading,
    }

The snapshots ``step_<k>.pt`` and an averaged ``average.pt`` (:mod:`.averaging`) are the same dict without
``optimizer``, ``scaler``, ``rng``, ``task_state``, ``log_window`` and ``schedule`` (``average.pt`` adds
``averaged``: the steps it averages): they load for evaluation, not for a resume.

Every value is a tensor or plain Python, so the file loads with ``torch.load(weights_only=True)``.
Writing goes to ``<name>.<pid>.tmp`` in the same directory and is moved in place with :func:`os.replace`
(:mod:`kernel_attention.atomic_write`), so a kill during a save never leaves a truncated ``last.pt``.

A file that cannot be used -- truncated or overwritten by another program, empty, not a checkpoint, or
holding objects ``weights_only`` refuses to build (unpickling them could run code) -- raises
:class:`CheckpointError` with one line saying which; so does a write that fails (a full disk says "No space
left on device", also where PyTorch's zip writer reports only "file write failed").
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import shutil
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kernel_attention.atomic_write import replacing

__all__ = ["FORMAT", "CheckpointError", "save_checkpoint", "load_checkpoint", "load_model_state", "get_rng_state",
           "set_rng_state"]

FORMAT = "kernel-attention-checkpoint"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or written as it is; ``path`` names the file."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        super().__init__(message)
        self.path = Path(path) if path is not None else None


# Below this many free bytes on a checkpoint's file system, a failed write is taken for a full disk.
_NEARLY_FULL = 64 * 2**20


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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            torch.save({"format": FORMAT, "version": 1, **state}, tmp)
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint {path}: {e.strerror or e}"
                              + ("; free some space or choose another --run-dir" if e.errno == errno.ENOSPC else ""),
                              path) from None
    except RuntimeError as e:  # torch's zip writer: "PytorchStreamWriter failed writing file ...: file write failed"
        if "write" not in str(e).lower():
            raise
        free = _free_bytes(path.parent)
        why = (f"{os.strerror(errno.ENOSPC)} ({free / 2**20:.0f} MiB free there); free some space or choose "
               f"another --run-dir") if free is not None and free < _NEARLY_FULL else str(e).splitlines()[0]
        raise CheckpointError(f"cannot write checkpoint {path}: {why}", path) from None
    return path


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    mmap: bool = False) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`; fails clearly on anything else.  ``mmap=True``
    maps the tensors from the file rather than reading them, for a caller that wants the plain values only."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): it was not written to the end", path)
    mmap = mmap and zipfile.is_zipfile(path)  # torch maps only its zip format; anything else is read, and judged
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e):  # weights_only met a class or function it will not import: refused, not damaged
            name = next((line.strip() for line in str(e).splitlines() if "GLOBAL" in line), "")
            raise CheckpointError(f"checkpoint {path} holds Python objects other than tensors and plain values, "
                                  f"which are refused because loading them could run code ({name}); "
                                  "only load such a file from a source you trust, with torch.load", path) from None
        raise CheckpointError(f"checkpoint {path} is damaged or not a PyTorch file (it does not unpickle)", path) from None
    except (LookupError, ValueError, TypeError, AttributeError, struct.error) as e:
        # the unpickler reads other bytes (a YAML file, text) as opcodes until one fails in any of these ways
        raise CheckpointError(f"checkpoint {path} is damaged or not a PyTorch file (it does not unpickle: "
                              f"{type(e).__name__})", path) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        detail = str(e).splitlines()[0].split(". ")[0] if str(e) else type(e).__name__
        raise CheckpointError(f"checkpoint {path} is damaged (truncated or overwritten?): {detail}", path) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a kernel-attention checkpoint (format {FORMAT!r})", path)
    return state


def load_model_state(model: torch.nn.Module, state: dict[str, Any], path: str | os.PathLike) -> None:
    """``model.load_state_dict(state)``, or a :class:`CheckpointError` that says the checkpoint at ``path``
    was written by another model and how the two differ (missing, unexpected and reshaped weights, a few
    of each), instead of PyTorch's list of every key."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    reshaped = [f"{k} {tuple(state[k].shape)} here {tuple(own[k].shape)}" for k in own
                if k in state and hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or reshaped:
        def few(names: list[str]) -> str:
            return ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
        parts = [what.format(len(v), few(v)) for what, v in (
            ("it lacks {} weights of this model ({})", missing),
            ("it has {} weights this model does not ({})", unexpected),
            ("{} weights have another shape (checkpoint's, then this model's: {})", reshaped)) if v]
        raise CheckpointError(f"checkpoint {path} was written by a different model than this config builds: "
                              + "; ".join(parts), path)
    model.load_state_dict(state)
