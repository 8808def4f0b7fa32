"""Attention backends vs PyTorch SDPA: forward, forward+backward, peak memory.

    python benchmarks/attention.py --T 256 1024 4096 --out docs/benchmarks.md

Same as ``kernel-attention bench``; see :mod:`kernel_attention.backends.bench` for the options."""

import sys

from kernel_attention.backends.bench import main

if __name__ == "__main__":
    sys.exit(main())
