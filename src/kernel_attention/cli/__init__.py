"""The ``kernel-attention`` command line.

Each sub-command lives in its own module of this package and exposes ``add_parser(subparsers)`` (which
returns the sub-parser) and ``run(args) -> int``.  The list below is the only place that names them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Sub-command modules, in the order ``--help`` shows them.
COMMANDS = ["check", "data", "bench", "train", "evaluate", "translate", "generate", "run", "study"]


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
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from kernel_attention.malloc import configure

    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    configure()  # per-block CPU tensors from the heap (kernel_attention.malloc says which and why)
    return int(args._run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
