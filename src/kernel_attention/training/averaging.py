"""Checkpoint averaging: one model whose weights are the mean of a run's last N checkpoints (Vaswani et al.
2017, Sec. 6.1, "averaging the last 5 checkpoints, written at 10-minute intervals"; fairseq's
``scripts/average_checkpoints.py``, which Transformer Dissection's NMT recipe runs over the last 10).

With ``train.keep_last = N`` the trainer keeps, beside ``last.pt``, the weights of its last N periodic
checkpoints (every ``train.checkpoint_every`` updates, and the final one) as ``RUN/step_<k>.pt``: the
checkpoint without the optimiser, scaler and random states, which only a resume needs.  A run that starts
over, or resumes from an earlier ``last.pt``, first deletes the snapshots of later steps.  Then::

    kernel-attention average RUN [--last N] [--out RUN/average.pt]
    kernel-attention evaluate RUN/average.pt --split test

For checkpoints c_1..c_N of one model, every parameter θ is averaged, θ̄ = (1/N) Σ_i θ_i (accumulated in
float64, stored in the parameter's dtype); buffers (state such as a cached table or a step counter, not
weights) are taken from the newest checkpoint.  The averaged file is a weights-only checkpoint like the
snapshots, with ``"averaged"``: the steps it averages.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

import torch

from kernel_attention.training.checkpoint import save_checkpoint

__all__ = ["SNAPSHOT", "weights_only", "keep_snapshot", "drop_snapshots_after", "snapshots", "parameter_names",
           "average_states"]

#: the file name of the snapshot of step k
SNAPSHOT = "step_{}.pt"
_SNAPSHOT = re.compile(r"^step_(\d+)\.pt$")
#: what only a resume needs, left out of snapshots and averages
_RESUME_ONLY = ("optimizer", "scaler", "rng", "task_state", "log_window", "schedule")


def weights_only(state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint ``state`` without what only a resume needs (optimiser, scaler, random states)."""
    return {k: v for k, v in state.items() if k not in _RESUME_ONLY}


def _stepped(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(k, path)`` of the ``step_<k>.pt`` files of ``run_dir``, oldest step first."""
    return sorted((int(m.group(1)), p) for p in Path(run_dir).glob("step_*.pt") if (m := _SNAPSHOT.match(p.name)))


def snapshots(run_dir: str | Path) -> list[Path]:
    """The ``step_<k>.pt`` files of ``run_dir``, oldest step first."""
    return [p for _, p in _stepped(run_dir)]


def keep_snapshot(run_dir: str | Path, state: dict[str, Any], keep: int) -> Path:
    """Write ``step_<state['step']>.pt`` (weights only) and delete all but the newest ``keep`` snapshots."""
    path = save_checkpoint(Path(run_dir) / SNAPSHOT.format(state["step"]), weights_only(state))
    for old in snapshots(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def drop_snapshots_after(run_dir: str | Path, step: int) -> None:
    """Delete the snapshots of steps after ``step``: a run that starts over (step 0) or resumes from an earlier
    ``last.pt`` writes its own, and another run's must not be averaged with them."""
    for k, p in _stepped(run_dir):
        if k > step:
            p.unlink(missing_ok=True)


def parameter_names(model: torch.nn.Module) -> list[str]:
    """The state-dict names of ``model``'s parameters, a tied weight under each of its names."""
    return [n for n, _ in model.named_parameters(remove_duplicate=False)]


def average_states(states: list[dict[str, torch.Tensor]], parameters: Iterable[str]) -> dict[str, torch.Tensor]:
    """The model state dict whose ``parameters`` are the mean over ``states`` (model state dicts of one model,
    oldest first) and whose other entries are the last state's."""
    if not states:
        raise ValueError("no checkpoints to average")
    names = set(parameters)
    out = dict(states[-1])
    for name in names:
        first = states[0][name]
        if not first.is_floating_point():
            raise ValueError(f"parameter {name} is {first.dtype}, not a floating-point tensor: cannot average it")
        total = torch.zeros_like(first, dtype=torch.float64)
        for s in states:
            total += s[name].to(torch.float64)
        out[name] = (total / len(states)).to(first.dtype)
    return out
