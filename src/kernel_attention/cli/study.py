"""``kernel-attention study NAME``: run one table of the papers end to end and write our numbers beside theirs.

Studies: dissection-positions (TD Table 1), dissection-kernels (Table 2), dissection-order (Table 3),
dissection-values (Table 4), ika-classification (IKA Table 2), ika-translation (Table 3), ika-regression
(Table 4), ika-graphs (Table 5), synthetic-smoke (two synthetic cells, for checks).

``--scale paper`` uses the papers' configurations (configs/transformer_dissection, configs/
implicit_kernel_attention); ``--scale small`` shrinks model, data and steps so a cell takes minutes on a
CPU, and says exactly what it shrank (printed, and written into table.md); ``--scale converged`` trains
models sized for the staged data until the validation metric stops improving (early stopping), the scale
whose findings the results page reports.  ``--seeds N`` runs per cell
(seeds; folds for classification; splits for regression).  Every cell is a normal training run under
``OUT/NAME/cells/<cell>/``; finished cells (result.json) are skipped, unfinished ones resume from last.pt.
Several processes may run one study into the same OUT at once (say one per core): each skips the
cells another is training.
``--import-runs CSV`` carries the finished cells of an earlier runs.csv in first (more seeds on top of
published ones, say).  Cells whose configurations are equal train once.  A result records the configuration
it ran with: one of another configuration (a config corrected since) is left out and not imported, and
``--rerun-stale`` runs such cells again (their old folders moved aside).
Outputs: ``OUT/NAME/runs.csv``, ``OUT/NAME/table.md``, ``OUT/NAME/figures/*.png``.
"""

from __future__ import annotations

import argparse
import shlex
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("study", help="run a paper table's grid and write our numbers beside the paper's",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="study name (omit with --list)")
    p.add_argument("--scale", choices=("small", "converged", "paper"), default="small")
    p.add_argument("--seeds", type=int, default=None, help="runs per cell (default: the study's for the scale)")
    p.add_argument("--data", default=None, help="data root (default: $KERNEL_ATTENTION_DATA or ../shared/data)")
    p.add_argument("--out", default="studies", help="output directory (default: studies)")
    p.add_argument("--only", default="", help="comma-separated table / row / column ids to run (e.g. t2-sp); "
                   "a/b selects cells matching both (e.g. mikan/cr)")
    p.add_argument("--nmt-data", default=None, help="NMT dataset (small: multi30k, paper: iwslt14)")
    p.add_argument("--lm-data", default=None, help="SP dataset (small: wikitext-2, paper: wikitext-103)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--checkpoint-minutes", type=float, default=None, metavar="M",
                   help="write each cell's last.pt at least every M minutes (default: the configs' "
                   "train.checkpoint_minutes, 10), e.g. on a machine lent for a while; not part of a cell's "
                   "configuration")
    p.add_argument("--retry-errors", action="store_true", help="run again cells that ended with an error")
    p.add_argument("--rerun-stale", action="store_true",
                   help="run again cells finished with another configuration than the current one (their "
                   "folders are moved to <cell>.stale-<key>)")
    p.add_argument("--no-figures", action="store_true")
    p.add_argument("--collect-only", action="store_true",
                   help="run no cell; rewrite runs.csv, table.md and figures from the finished cells")
    p.add_argument("--import-runs", action="append", default=[], metavar="CSV",
                   help="first carry the finished cells of a study's runs.csv (from another machine or an "
                   "earlier folder) into OUT, so they are skipped and collected with the new ones; repeatable")
    p.add_argument("--list", action="store_true",
                   help="run nothing; without NAME list the studies, with NAME list its cells (--scale, --seeds, "
                   "--only) and where each stands in --out: finished, stale, running, started (resumes from "
                   "last.pt?) or to run")
    return p


def run(args) -> int:
    import torch

    from kernel_attention.study import StudyOptions, execute, get_study, study_names

    if not args.name:
        for n in study_names():
            print(f"{n:22s} {get_study(n).title}")
        return 0 if args.list else 2
    if args.seeds is not None and args.seeds < 1:
        print("kernel-attention study: --seeds must be >= 1", file=sys.stderr)
        return 2
    if args.checkpoint_minutes is not None and not args.checkpoint_minutes > 0:
        print(f"kernel-attention study: --checkpoint-minutes must be > 0, got {args.checkpoint_minutes}",
              file=sys.stderr)
        return 2
    try:
        study = get_study(args.name)
    except KeyError as e:
        print(f"kernel-attention study: {e.args[0]}", file=sys.stderr)
        return 2
    opts = StudyOptions(scale=args.scale, seeds=args.seeds, data=args.data,
                        only=tuple(x for x in args.only.split(",") if x), nmt_data=args.nmt_data,
                        lm_data=args.lm_data)
    if args.list:
        from kernel_attention.study.states import cell_states, format_states
        try:
            print(format_states(cell_states(study, opts, args.out)))
        except ValueError as e:  # an --only that selects nothing
            print(f"kernel-attention study: {e}", file=sys.stderr)
            return 2
        return 0
    torch.set_num_threads(max(1, args.threads))
    command = "" if args.collect_only else "kernel-attention study " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if len(sys.argv) > 2 and sys.argv[1] == "study" else f"kernel-attention study {study.name} --scale {args.scale}"
    try:
        execute(study.name, opts, args.out, command=command, retry_errors=args.retry_errors,
                figures=not args.no_figures, log=lambda m: print(m, flush=True), run=not args.collect_only,
                import_from=tuple(args.import_runs), rerun_stale=args.rerun_stale,
                checkpoint_minutes=args.checkpoint_minutes)
    except ValueError as e:  # a runs.csv of another study or scale, an --only that selects nothing
        print(f"kernel-attention study: {e}", file=sys.stderr)
        return 2
    except ImportError as e:  # an optional package a cell needs (the GP rows: GPyTorch); finished cells stay
        print(f"kernel-attention study: {e} (or leave those cells out with --only)", file=sys.stderr)
        return 2
    return 0
