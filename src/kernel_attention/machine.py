"""The host a run or a benchmark ran on, in words.

A training run repeated on the same code and machine gives the same numbers to the last digit; on another
CPU it need not: PyTorch's CPU kernels (its BLAS among them) take the code path of the vector instructions
the CPU has, and those paths round differently, which a training run amplifies (checked on the studies'
cells, docs/results.md).  So every study cell records :func:`numerics` -- what decides its rounding -- and
the tables' wall-time lines and the benchmark name the CPU with :func:`cpu`.
"""

from __future__ import annotations

import platform

__all__ = ["cpu_name", "cpu", "numerics"]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere), or "?"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def cpu() -> str:
    """The CPU's model and the vector instruction set PyTorch's CPU kernels dispatch to on it, e.g.
    ``"AMD EPYC (AVX512)"``."""
    import torch

    return f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()})"


def numerics() -> str:
    """CPU model, the vector instruction set PyTorch's CPU kernels dispatch to, torch version and the GPU
    (training uses it whenever there is one): e.g. ``"AMD EPYC (AVX512), torch 2.13.0+cpu"``."""
    import torch

    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu()}, torch {torch.__version__}{gpu}"
