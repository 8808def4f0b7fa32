"""``kernel-attention evaluate CHECKPOINT [--split test] [key=value ...]``: metrics of a trained model.

CHECKPOINT is a ``best.pt`` / ``last.pt`` written by ``train``, an ``average.pt`` written by ``average``, a
``.safetensors`` file written by ``export`` (or a run directory: best.pt is used, else last.pt, else
model.safetensors).
The task is rebuilt from the config stored in the checkpoint, with the vocabulary / BPE files the run
directory holds (so the training data is not needed); overrides change the config for this evaluation
only, e.g. ``eval.beam=5`` or ``eval.mem_len=640 eval.clamp_len=400``, before or after the options.
Prints JSON.

A new test set, e.g. after the training data was moved or deleted:

    kernel-attention evaluate runs/en-fr --test-src new/test.en --test-tgt new/test.fr   # translation
    kernel-attention evaluate runs/lm --test-file new/test.txt                           # language model
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
    p.add_argument("--split", default=None, choices=("valid", "test"), help="the dataset's split (default: test)")
    p.add_argument("--test-src", metavar="FILE", help="translation: evaluate on this source file (one tokenised "
                   "sentence per line) with --test-tgt, instead of the dataset's test split")
    p.add_argument("--test-tgt", metavar="FILE", help="translation: the references of --test-src, line by line")
    p.add_argument("--test-file", metavar="FILE", help="language model: evaluate on this plain-text file "
                   "(one sentence or document per line) instead of the dataset's test split")
    p.add_argument("--device", default="cpu")
    return p


def overrides_dict(items: list[str]) -> dict:
    from kernel_attention.config import apply_overrides
    return apply_overrides({}, items)


def load(args):
    """``(task, model, config)`` of the run, checkpoint or safetensors export ``args.checkpoint`` names."""
    from kernel_attention.load import load as load_run
    try:
        run = load_run(args.checkpoint, args.device, overrides_dict(getattr(args, "overrides", []) or []))
        return run.task, run.model, run.config
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"kernel-attention: cannot load {args.checkpoint}: {e}", file=sys.stderr)
        return None


def run(args) -> int:
    import torch

    loaded = load(args)
    if loaded is None:
        return 2
    task, model, _ = loaded
    split = args.split or "test"
    if split != "test" and (args.test_src or args.test_tgt or args.test_file):
        print(f"kernel-attention: --split {split} reads the dataset's split; the files of --test-src/--test-tgt or "
              f"--test-file are evaluated as the test split: leave --split out", file=sys.stderr)
        return 2
    if args.test_src or args.test_tgt:
        if not (args.test_src and args.test_tgt) or not hasattr(task, "set_test_pair"):
            other = " (a language-model run: --test-file)" if hasattr(task, "set_test_file") else ""
            print(f"kernel-attention: --test-src and --test-tgt go together, with a translation run{other}",
                  file=sys.stderr)
            return 2
        set_test, files = task.set_test_pair, (args.test_src, args.test_tgt)
    elif args.test_file:
        if not hasattr(task, "set_test_file"):
            print("kernel-attention: --test-file needs a language-model run (translation: --test-src/--test-tgt)",
                  file=sys.stderr)
            return 2
        set_test, files = task.set_test_file, (args.test_file,)
    else:
        set_test = None
    try:
        if set_test is not None:
            set_test(*files)
            split = "test"
        with torch.no_grad():
            metrics = task.evaluate(model, split)
    except (ValueError, FileNotFoundError) as e:
        hint = ""
        if isinstance(e, FileNotFoundError) and set_test is None:
            hint = ("; give a test set with --test-src/--test-tgt" if hasattr(task, "set_test_pair") else
                    "; give a test set with --test-file" if hasattr(task, "set_test_file") else
                    "; point the run at its data with data.dataset=SPEC (or data.root=DIR)")
        print(f"kernel-attention: cannot evaluate {args.checkpoint}: {e}{hint}", file=sys.stderr)
        return 2
    print(json.dumps({"split": split, **({"files": list(files)} if set_test else {}), **metrics}))
    return 0
