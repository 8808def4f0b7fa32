"""``kernel-attention train CONFIG [key=value ...]``: train one model from a YAML config.

The config has sections ``task``, ``data``, ``model``, ``train``, ``eval``, ``seed``, ``run`` (see
``configs/`` and kernel_attention.config).  Overrides use dotted keys, e.g.
``model.encoder_attention.kernel=rbf train.max_steps=2000``, before or after the options.  Every name,
value and combination is checked before training starts; a bad config exits with status 2 and a message
naming what was wrong and what is accepted.
Outputs go to ``--run-dir`` (default: the config's ``run.dir``, else ``runs/<config name>``): config.yaml,
metrics.jsonl, last.pt, best.pt.  An existing last.pt is resumed unless ``--no-resume``; a resume whose
config changed (other than how progress is shown and saved) is refused naming the changed keys unless
``--allow-config-change``, and a damaged last.pt, or one of another model, exits with status 2 saying so.
Progress: a bar on a terminal, else one line per ``train.log_every`` steps on stderr; the final metrics are
printed as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from pathlib import Path


def add_parser(sub) -> argparse.ArgumentParser:
    from kernel_attention.cli.config_keys import describe_config_keys
    from kernel_attention.models import MODELS
    from kernel_attention.tasks import TASKS

    p = sub.add_parser("train", help="train a model from a YAML config (+ key=value overrides)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=TASKS.describe() + "\n" + MODELS.describe() + "\n" + describe_config_keys())
    p.add_argument("config", help="YAML config file")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. train.lr=5e-4")
    p.add_argument("--run-dir", default=None, help="output directory")
    p.add_argument("--no-resume", action="store_true", help="start from scratch even if last.pt exists")
    p.add_argument("--allow-config-change", action="store_true",
                   help="resume last.pt even though the config differs from the one it was trained with "
                        "(the changed keys are named otherwise, and the resume refused)")
    p.add_argument("--check", action="store_true", help="only check the config, do not train")
    return p


def load_and_check(config: str, overrides: list[str]):
    """(cfg, task, train_cfg) or a printed error and None."""
    from kernel_attention.cli.errors import report
    from kernel_attention.config import load_config
    from kernel_attention.data.files import DataFormatError
    from kernel_attention.tasks.runner import prepare

    try:
        cfg = load_config(config, overrides)
        task, train_cfg = prepare(cfg)
    except (DataFormatError, pickle.UnpicklingError) as e:  # a data file that cannot be read as it is
        report("bad data file: ", e)
        return None
    except (ValueError, FileNotFoundError, KeyError, TypeError) as e:
        # SpecError / ConfigError / MissingDataError are ValueErrors or FileNotFoundErrors with full messages
        if isinstance(e, TypeError):
            print(f"kernel-attention: bad config {config}: {e}", file=sys.stderr)
        else:
            report(f"bad config {config}: ", e)
        return None
    return cfg, task, train_cfg


def run(args) -> int:
    from kernel_attention.cli.errors import report
    from kernel_attention.config import ConfigError
    from kernel_attention.data.files import DataFormatError
    from kernel_attention.tasks.runner import run_dir_of, train
    from kernel_attention.training.checkpoint import CheckpointError

    checked = load_and_check(args.config, args.overrides)
    if checked is None:
        return 2
    cfg = checked[0]
    if args.check:
        print(f"config {args.config} is valid")
        return 0
    run_dir = Path(args.run_dir) if args.run_dir else run_dir_of(cfg, Path("runs") / Path(args.config).stem)
    try:
        summary = train(cfg, run_dir, resume=not args.no_resume, allow_config_change=args.allow_config_change)
    except ConfigError as e:  # another config than the run trained with; a device this machine lacks
        return report("", e)
    except CheckpointError as e:
        hint = ""
        if e.path is not None and e.path.name == "last.pt" and not args.no_resume:
            hint = (f"; to start this run over, run the same command with --no-resume (it overwrites "
                    f"{e.path.parent}), or choose another --run-dir")
        return report("", e, hint)
    except (OSError, DataFormatError, pickle.UnpicklingError) as e:  # a full disk, a data file read late
        return report("", e)  # one line for those; any other OSError keeps its traceback
    if os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 reports
        return 0
    print(json.dumps({k: v for k, v in summary.items() if isinstance(v, (int, float, str, dict, list, type(None)))},
                     default=str, indent=1))
    print(f"run directory: {run_dir}", file=sys.stderr)  # stdout holds the JSON alone, for a pipe
    return 0
