"""``kernel-attention average RUN [--last N] [--out FILE]``: average the weights of a run's last checkpoints.

RUN is a run directory trained with ``train.keep_last=N`` (and ``train.checkpoint_every``): its
``step_<k>.pt`` files are averaged, the newest ``--last`` of them (default: all).  Checkpoint files of one
run may be named instead (``average RUN/step_3000.pt RUN/step_2500.pt``).  The parameters are averaged,
buffers are the newest checkpoint's; the result is written to ``RUN/average.pt`` (``--out``), a checkpoint
that ``evaluate``, ``translate`` and ``export`` read like ``best.pt``.  Prints the path and the steps averaged.

    kernel-attention train CONFIG train.keep_last=10 train.checkpoint_every=1000
    kernel-attention average runs/CONFIG
    kernel-attention evaluate runs/CONFIG/average.pt --split test
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("average", help="average the weights of a run's last checkpoints (RUN/average.pt)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="RUN", help="a run directory, or checkpoint files of one run")
    p.add_argument("--last", type=int, metavar="N", help="average the newest N step_<k>.pt of RUN (default: all)")
    p.add_argument("--out", metavar="FILE", help="where to write (default: average.pt beside the checkpoints)")
    return p


def _checkpoints(paths: list[str], last: int | None) -> list[Path]:
    """The checkpoint files to average, oldest step first (ValueError naming what is wrong)."""
    from kernel_attention.training.averaging import snapshots

    if last is not None and last < 1:
        raise ValueError(f"--last must be an integer >= 1, got {last}")
    if len(paths) == 1 and Path(paths[0]).is_dir():
        found = snapshots(paths[0])
        if not found:
            raise ValueError(f"{paths[0]} holds no step_<k>.pt checkpoints: train it with train.keep_last=N "
                             "(and train.checkpoint_every) to keep them, or name checkpoint files")
        return found[-last:] if last else found
    if last is not None:
        raise ValueError("--last chooses among a run directory's step_<k>.pt; with checkpoint files named, leave "
                         "it out")
    for p in paths:
        if not Path(p).is_file():
            raise FileNotFoundError(f"checkpoint {p} does not exist")
    return [Path(p) for p in paths]


def _one_run(pairs: list[tuple[dict, Path]]) -> None:
    """ValueError unless the checkpoints are distinct steps of one run: one model and task in their stored
    configs (a resumed run may have changed its training keys, such as ``train.max_steps``)."""
    from kernel_attention.tasks.resume_check import changed_keys

    seen: dict = {}
    for state, f in pairs:
        step = state.get("step")
        if step in seen:
            raise ValueError(f"{seen[step]} and {f} are both step {step}: the checkpoints of one run have distinct "
                             f"steps (a file named twice, or two runs)")
        seen[step] = f
    base, f0 = (pairs[0][0].get("extra") or {}).get("config"), pairs[0][1]
    for state, f in pairs[1:]:
        cfg = (state.get("extra") or {}).get("config")
        if base is None or cfg is None:
            continue
        differ = [(k, a, b) for k, a, b in changed_keys(base, cfg) if k.split(".")[0] in ("model", "task")]
        if differ:
            listed = "; ".join(f"{k}: {a!r} vs {b!r}" for k, a, b in differ[:3])
            raise ValueError(f"{f0} and {f} are checkpoints of two runs ({listed}): average the checkpoints of one")


def run(args) -> int:
    from kernel_attention.load import copy_artifacts
    from kernel_attention.tasks.runner import load_run
    from kernel_attention.training.averaging import average_states, parameter_names, weights_only
    from kernel_attention.training.checkpoint import load_checkpoint, load_model_state, save_checkpoint

    try:
        pairs = sorted(((load_checkpoint(f), f) for f in _checkpoints(args.paths, args.last)),
                       key=lambda sf: sf[0].get("step", 0))
        _one_run(pairs)
        states, files = [s for s, _ in pairs], [f for _, f in pairs]
        _, model, _ = load_run(files[-1])
        for s, f in pairs:
            load_model_state(model, s["model"], f)  # every file a checkpoint of this model, or a clear error
        avg = average_states([s["model"] for s in states], parameter_names(model))
        out = Path(args.out) if args.out else files[-1].parent / "average.pt"
        copy_artifacts((states[-1].get("extra") or {}).get("artifacts"), files[-1].parent, out.parent)
        save_checkpoint(out, {**weights_only(states[-1]), "model": avg,
                              "averaged": [s.get("step") for s in states]})
    except (ValueError, FileNotFoundError, KeyError, OSError) as e:
        print(f"kernel-attention average: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(out), "steps": [s.get("step") for s in states]}))
    return 0
