r"""Large CPU tensors from the heap instead of fresh memory maps (glibc).

glibc's malloc serves every allocation above its mmap threshold (128 KB, rising to at most 32 MB) with a
new ``mmap``, whose pages fault in -- and are zeroed by the kernel -- on first touch, and unmaps it
again on ``free``.  The blocked backends allocate a few (B, H, rows, Tk) tensors per block of query rows
(42 MB each at B=4, H=8, 256 rows, T=1024), so every block of every call pays those page faults again:
``xl`` at T=1024 spent about a fifth of its forward+backward time on them (docs/benchmarks.md).

:func:`heap_malloc` sets ``M_MMAP_MAX = 0`` (large blocks come from the heap, and freed ones are reused)
and ``M_TRIM_THRESHOLD = 2^31 - 1`` (freed memory at the top of the heap is kept for the next block):
glibc's form of PyTorch's advice to run CPU work with jemalloc or tcmalloc.  The cost is that the
process keeps its peak memory instead of returning it to the system between steps.  It is
process-wide, so importing the library never does it: the command line does at start
(``KERNEL_ATTENTION_MALLOC=system`` keeps glibc's defaults), and a script calls :func:`heap_malloc`
itself or runs with ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647`` in its environment.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["ENV", "heap_malloc", "configure", "in_effect"]

#: Environment variable read by :func:`configure`: "heap" (default) or "system".
ENV = "KERNEL_ATTENTION_MALLOC"

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt parameters, <malloc.h>
_KEEP = 2 ** 31 - 1                       # the largest value mallopt's int takes
#: The same settings as glibc reads them from the environment at start, for child processes.
CHILD_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(_KEEP)}


def heap_malloc(children: bool = True) -> bool:
    """Serve large allocations of this process from the heap (module docstring); with ``children``, also
    put the settings in ``os.environ`` so that processes started from here inherit them.  Returns
    whether it took effect (False where the C library is not glibc)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - glibc always has it
        return False
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, _KEEP) == 1
    if ok and children:
        os.environ.update(CHILD_ENV)
    return ok


def configure() -> str:
    """What the command line does at start: :func:`heap_malloc` unless ``KERNEL_ATTENTION_MALLOC=system``.
    Returns the setting in effect, "heap" or "system"."""
    choice = os.environ.get(ENV, "heap")
    if choice not in ("heap", "system"):
        raise ValueError(f"{ENV}={choice!r} is not one of ['heap', 'system']")
    return "heap" if choice == "heap" and heap_malloc() else "system"


def in_effect() -> str:
    """The setting that processes started from here get, from the environment: "heap" or "system"."""
    mmap_max = "MALLOC_MMAP_MAX_"  # the setting that takes large blocks off mmap; the trim threshold only keeps them
    return "heap" if os.environ.get(mmap_max) == CHILD_ENV[mmap_max] else "system"
