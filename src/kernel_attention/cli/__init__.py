"""The ``kernel-attention`` command line.

Each sub-command lives in its own module of this package and exposes ``add_parser(subparsers)`` (which
returns the sub-parser) and ``run(args) -> int``.  The list below is the only place that names them.

Commands that take ``key=value`` overrides (a positional ``overrides`` list) accept them anywhere on the
line, before or after the options (``evaluate RUN --split test eval.beam=5``): argparse fills a positional
list only from the first run of positionals, so :func:`main` gives it the ``key=value`` words that follow
the options too.  The commands of :data:`THREADED` take ``--threads N`` (:mod:`.threads`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import warnings

from kernel_attention.cli.threads import add_threads_option, apply_threads

# Sub-command modules, in the order ``--help`` shows them.
COMMANDS = ["check", "data", "bench", "train", "evaluate", "translate", "generate", "export", "average", "run",
            "study"]

# Commands whose runs keep checkpoints, so that the same command line resumes an interrupted one.
RESUMABLE = ("train", "study")

# Commands that compute in this process and get ``--threads N`` (bench and study have their own; run
# gives each worker one thread).
THREADED = ("check", "train", "evaluate", "translate", "generate")


def build_parser() -> argparse.ArgumentParser:
    from kernel_attention.vocabulary import describe_vocabulary

    parser = argparse.ArgumentParser(
        prog="kernel-attention",
        description="Transformer attention as a kernel smoother: train, evaluate and study any point of "
        "the kernel x position x value x filter grid.",
        epilog=describe_vocabulary(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"kernel_attention.cli.{name}")
        p = module.add_parser(sub)
        if name in THREADED:
            add_threads_option(p)
        p.set_defaults(_run=module.run, _parser=p)
    return parser


def _one_line(message, category, filename, lineno, line=None) -> str:
    return f"kernel-attention: warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    from kernel_attention.malloc import configure

    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "_run", None) is None:
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        parser.print_help()
        return 2
    if rest and isinstance(getattr(args, "overrides", None), list):
        late = [a for a in rest if "=" in a and not a.startswith("-")]  # key=value words after the options
        args.overrides.extend(late)
        rest = [a for a in rest if a not in late]
    if rest:
        args._parser.error(f"unrecognized arguments: {' '.join(rest)}")
    apply_threads(args)
    shown, warnings.formatwarning = warnings.formatwarning, _one_line  # read as the CLI's other messages
    configure()  # per-block CPU tensors from the heap (kernel_attention.malloc says which and why)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGINT / SIGTERM from a scheduler: a message, not a traceback
        how = f": {e}" if str(e) else ""  # the trainer says where it stopped (kernel_attention.training.interrupt)
        again = "" if args.command not in RESUMABLE else (
            " (the same command resumes from the last checkpoint)" if how else
            " (the same command runs it again, from its last checkpoint if one was written)")
        if os.environ.get("RANK", "0") == "0":  # under torchrun the signal reaches every rank: one line
            print(f"kernel-attention {args.command}: interrupted{how}{again}", file=sys.stderr)
        return 128 + getattr(e, "signum", signal.SIGINT)  # as the shell reports a process that signal ends
    finally:
        warnings.formatwarning = shown


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
