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
Outputs: ``OUT/NAME/runs.csv``, ``OUT/NAME/curves.csv`` (the cells' curves, imported with the runs.csv
beside it), ``OUT/NAME/table.md``, ``OUT/NAME/figures/*.png``.

``kernel-attention study report`` (``report`` in place of NAME; no study has that name) writes the results
page, docs/results.md, from the result sets under docs/results/ (their runs.csv, figures and prose, listed in
docs/results/sections.yaml): the tables, each comparison the papers draw with its paired difference over seeds
and its mark (holds / reversed / within noise), and the findings checklist built from those marks.
``report --check`` writes nothing and exits 1, with a unified diff, when the page on disk is not the one the
CSVs and prose give.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from kernel_attention.cli.threads import threads_per_op


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("study", help="run a paper table's grid and write our numbers beside the paper's",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="study name (omit with --list), or `report` (the results page)")
    p.add_argument("--scale", choices=("small", "converged", "paper"), default="small")
    p.add_argument("--seeds", type=int, default=None, help="runs per cell (default: the study's for the scale)")
    p.add_argument("--data", default=None, help="data root (default: $KERNEL_ATTENTION_DATA, else ../shared/data "
                                                "from the current folder, else ~/.cache/kernel-attention)")
    p.add_argument("--out", default="studies", help="output directory (default: studies)")
    p.add_argument("--only", default="", help="comma-separated table / row / column ids to run (e.g. t2-sp); "
                   "a/b selects cells matching both (e.g. mikan/cr)")
    p.add_argument("--nmt-data", default=None, help="NMT dataset (small: multi30k, paper: iwslt14)")
    p.add_argument("--lm-data", default=None, help="SP dataset (small: wikitext-2, paper: wikitext-103)")
    p.add_argument("--threads", type=threads_per_op, default=1, help="torch threads (default 1)")
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
                   help="run no cell; rewrite runs.csv, curves.csv, table.md and figures from the finished cells")
    p.add_argument("--import-runs", action="append", default=[], metavar="CSV",
                   help="first carry the finished cells of a study's runs.csv (from another machine or an "
                   "earlier folder) into OUT, so they are skipped and collected with the new ones; repeatable")
    p.add_argument("--list", action="store_true",
                   help="run nothing; without NAME list the studies, with NAME list its cells (--scale, --seeds, "
                   "--only) and where each stands in --out: finished, stale, running, started (resumes from "
                   "last.pt?) or to run")
    p.add_argument("--check", action="store_true",
                   help="report: write nothing; exit 1 with a diff when the page is not the generated one")
    p.add_argument("--results", default="docs/results", metavar="DIR",
                   help="report: the folder of result sets and sections.yaml (default: docs/results)")
    p.add_argument("--page", default=None, metavar="MD",
                   help="report: the page to write or check (default: DIR.md beside DIR, docs/results.md)")
    return p


REPORT = "report"  # `study report`: the results page, not a study (a study of that name is refused)


def report(args) -> int:
    """``kernel-attention study report [--check]``: write (or compare) the results page."""
    from kernel_attention.study.results_page import check_page, write_page

    results = Path(args.results)
    page = Path(args.page) if args.page else results.with_name(results.name + ".md")
    if not results.is_dir():
        print(f"kernel-attention study report: {results} is no folder of result sets (run it from the repository's "
              f"root, or name the folder with --results)", file=sys.stderr)
        return 2
    try:
        if args.check:
            diff = check_page(results, page)
            if diff:
                sys.stdout.write(diff)
                again = " ".join(["kernel-attention study report", *(["--results", str(results)] if args.results !=
                                  "docs/results" else []), *(["--page", str(page)] if args.page else [])])
                print(f"kernel-attention study report: {page} is out of date; `{again}` writes it", file=sys.stderr)
                return 1
            print(f"{page} is the page the CSVs and prose of {results} give")
            return 0
        write_page(results, page)
    except (OSError, KeyError, ValueError) as e:  # a missing CSV or prose file, an unknown placeholder or set
        print(f"kernel-attention study report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {page}")
    return 0


def run(args) -> int:
    import torch

    from kernel_attention.data import DATASETS
    from kernel_attention.data.files import MissingDataError
    from kernel_attention.study import StudyOptions, execute, get_study, study_names

    if args.name == REPORT:
        if REPORT in study_names():
            raise RuntimeError(f"a study is named {REPORT!r}, the results page's subcommand")
        return report(args)
    given = [f for f, on in (("--check", args.check), ("--results", args.results != "docs/results"),
                            ("--page", args.page is not None)) if on]
    if given:  # the page's options would be ignored by a study, which then runs
        print(f"kernel-attention study: {', '.join(given)} go(es) with `kernel-attention study report`, not with "
              f"a study", file=sys.stderr)
        return 2
    if not args.name:
        for n in study_names():
            print(f"{n:22s} {get_study(n).title}")
        if not args.list:
            print("kernel-attention study: name a study (listed above), or `study report`", file=sys.stderr)
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
    missing = [f for f in args.import_runs if not Path(f).is_file()]
    if missing:
        print(f"kernel-attention study: --import-runs {missing[0]}: no such file", file=sys.stderr)
        return 2
    for flag, name in (("--nmt-data", args.nmt_data), ("--lm-data", args.lm_data)):
        try:
            if name is not None:
                DATASETS.entry(name)
        except ValueError as e:
            print(f"kernel-attention study: {flag}: {e}", file=sys.stderr)
            return 2
    opts = StudyOptions(scale=args.scale, seeds=args.seeds, data=args.data,
                        only=tuple(x.strip() for x in args.only.split(",") if x.strip()), nmt_data=args.nmt_data,
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
    except MissingDataError as e:  # data not placed here (see --data); the cell is not recorded, a rerun runs it
        print(f"kernel-attention study: {e} (--data names the data root)", file=sys.stderr)
        return 2
    return 0
