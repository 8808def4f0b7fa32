"""``kernel-attention bench``: time every backend against PyTorch SDPA (see
:mod:`kernel_attention.backends.bench`)."""

from __future__ import annotations

import argparse

from kernel_attention.backends import bench


def add_parser(subparsers):
    p = subparsers.add_parser("bench", help="benchmark the attention backends against PyTorch SDPA",
                              description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    return bench.add_arguments(p)


def run(args) -> int:
    return bench.run(args)
