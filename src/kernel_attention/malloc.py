r"""Per-block CPU tensors from the heap instead of fresh memory maps (glibc).

glibc's malloc serves every allocation above its mmap threshold (128 KB, rising to at most 32 MB) with a
new ``mmap``, whose pages fault in -- and are zeroed by the kernel -- on first touch, and unmaps it
again on ``free``.  The blocked backends allocate a few (B, H, rows, Tk) tensors per block of query rows
(42 MB each at B=4, H=8, 256 rows, T=1024), so every block of every call pays those page faults again:
``xl`` at T=1024 spent about a fifth of its forward+backward time on them (docs/benchmarks.md).

:func:`heap_malloc` raises the mmap threshold to 256 MiB (``M_MMAP_THRESHOLD``: blocks below it come from
the heap, and freed ones are reused) and the trim threshold to 1 GiB (``M_TRIM_THRESHOLD``: freed memory
at the top of the heap is kept for the next block): glibc's form of PyTorch's advice to run CPU work
with jemalloc or tcmalloc.  Blocks of 256 MiB and more still get their own maps, returned to the system
on ``free``.  Serving those from the heap too (``M_MMAP_MAX = 0``, the first form of this setting) left
freed (B, H, T, T) tensors resident as holes in the heap: dense attention at B=4, T=4096 peaked at
12-19 GB instead of 6.0-6.3 GB, or was killed for memory.  The cost that remains is that the process
keeps up to its peak of sub-threshold blocks instead of returning it between steps.  It is
process-wide, so importing the library never does it: the command line does at start
(``KERNEL_ATTENTION_MALLOC=system`` keeps glibc's defaults), and a script calls :func:`heap_malloc`
itself or runs with the variables of :data:`CHILD_ENV` in its environment.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["ENV", "MMAP_THRESHOLD", "CHILD_ENV", "heap_malloc", "configure", "in_effect", "describe"]

#: Environment variable read by :func:`configure`: "heap" (default) or "system".
ENV = "KERNEL_ATTENTION_MALLOC"

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>
#: Blocks from this size on get their own map (and go back to the system on free): a (B, H, T, T)
#: tensor of dense attention at long T; below it, the blocked paths' per-block buffers (at most
#: 32M elements, 128 MiB in float32, plus the xl logits' extra columns) come from the heap.
MMAP_THRESHOLD = 256 * 2 ** 20
#: Free memory at the top of the heap kept for reuse (several per-block buffers).
TRIM_THRESHOLD = 2 ** 30
#: The same settings as glibc reads them from the environment at start, for child processes.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}


def heap_malloc(children: bool = True) -> bool:
    """Serve this process's allocations below :data:`MMAP_THRESHOLD` from the heap (module docstring);
    with ``children``, also put the settings in ``os.environ`` so that processes started from here
    inherit them.  Returns whether it took effect (False where the C library is not glibc)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - glibc always has it
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
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
    var = "MALLOC_MMAP_THRESHOLD_"  # the setting that moves blocks off mmap; the trim threshold only keeps them
    return "heap" if os.environ.get(var) == CHILD_ENV[var] else "system"


def describe() -> str:
    """:func:`in_effect` in words, for the machine lines of benchmarks and study tables."""
    return f"blocks under {MMAP_THRESHOLD >> 20} MiB from the heap" if in_effect() == "heap" else "glibc defaults"
