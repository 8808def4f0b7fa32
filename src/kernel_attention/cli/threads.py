"""``--threads N`` for the commands that compute: how many threads torch uses inside one operation.

PyTorch starts one intra-op thread per core.  On a shared machine, or with several runs side by side (a
study's processes, a queue of jobs), that oversubscribes the cores and every run slows down; ``--threads``
sets :func:`torch.set_num_threads` before any work, as ``OMP_NUM_THREADS`` would, without an environment
variable.  Left out, torch's default stays.
"""

from __future__ import annotations

import argparse

from kernel_attention.cli.counts import at_least

__all__ = ["threads_per_op", "add_threads_option", "apply_threads"]

#: argparse type of ``--threads``: an integer >= 1
threads_per_op = at_least(1, "threads per operation")


def add_threads_option(p: argparse.ArgumentParser) -> None:
    """Add ``--threads N`` to a sub-command's parser (unless it has its own)."""
    if any("--threads" in a.option_strings for a in p._actions):
        return
    p.add_argument("--threads", type=threads_per_op, default=None, metavar="N",
                   help="torch intra-op threads (torch.set_num_threads; default: torch's, one per core)")
    p.set_defaults(_threads_option=True)  # commands with their own --threads (bench, study) apply it themselves


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's intra-op threads from ``args.threads`` where the command has the option and it was given."""
    n = getattr(args, "threads", None)
    if getattr(args, "_threads_option", False) and n is not None:
        import torch
        torch.set_num_threads(int(n))
