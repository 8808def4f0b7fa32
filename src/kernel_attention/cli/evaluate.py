"""``kernel-attention evaluate CHECKPOINT [--split test] [key=value ...]``: metrics of a trained model.

CHECKPOINT is a ``best.pt`` / ``last.pt`` written by ``train`` (or its run directory: best.pt is used).
The task and data are rebuilt from the config stored in the checkpoint; overrides change it for this
evaluation only, e.g. ``eval.beam=5`` or ``eval.mem_len=640 eval.clamp_len=400``, before or after the
options.  Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    from kernel_attention.cli.config_keys import describe_config_keys

    p = sub.add_parser("evaluate", help="evaluate a checkpoint on valid/test",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=describe_config_keys())
    p.add_argument("checkpoint")
    p.add_argument("overrides", nargs="*", help="section.key=value changes to the stored config")
    p.add_argument("--split", default="test", choices=("valid", "test"))
    p.add_argument("--device", default="cpu")
    return p


def overrides_dict(items: list[str]) -> dict:
    from kernel_attention.config import apply_overrides
    return apply_overrides({}, items)


def load(args):
    from kernel_attention.tasks.runner import load_run
    try:
        return load_run(args.checkpoint, overrides_dict(getattr(args, "overrides", []) or []), args.device)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"kernel-attention: cannot load {args.checkpoint}: {e}", file=sys.stderr)
        return None


def run(args) -> int:
    import torch

    loaded = load(args)
    if loaded is None:
        return 2
    task, model, _ = loaded
    with torch.no_grad():
        metrics = task.evaluate(model, args.split)
    print(json.dumps({"split": args.split, **metrics}))
    return 0
