"""The sliced path's loops as compiled code (``csrc/sliced.cpp``), built on first use.

:mod:`kernel_attention.backends.sliced` runs both passes per (block of rows, head, batch element) slice; in
Python every backward slice costs four elementwise passes, a copy of the term and a dozen interpreter round
trips around its products, and the forward gives each slice to the flash kernel with the term as its mask.
The compiled loops run the same ATen products with fused passes per slice (the soft-max and its lse in the
forward; P by exp2 and dS in the backward) and no interpreter in between.

It is compiled by :func:`torch.utils.cpp_extension.load` the first time the sliced path runs (once, then
cached under ``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), with
``-march=native``: the cache entry's name carries a hash of the CPU's model and flags (and of the torch it
builds against), so that a home directory shared by different machines never loads code built for another
instruction set.  Without a compiler, or when the build fails, the Python loop runs (same results) and
:func:`why_not` says why.  ``KERNEL_ATTENTION_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import torch

__all__ = ["sliced", "why_not", "ENV"]

#: The environment variable that turns the compiled loop off ("0") -- the Python loop then runs.
ENV = "KERNEL_ATTENTION_NATIVE"

_SOURCE = Path(__file__).with_name("csrc") / "sliced.cpp"
_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
_lock = threading.Lock()
_state: dict = {}  # "module" or "error", set once per process


def _build_tag() -> str:
    """A short hash of the CPU's model name and flags (``-march=native`` code is only valid on such a CPU) and of
    the torch it is built against (its version and directory): each environment keeps its own build, instead of
    two virtual environments rebuilding the same cache entry in turn."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))][:2]
    lines += [torch.__version__, str(Path(torch.__file__).parent)]
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:10]


def _build():
    from torch.utils.cpp_extension import load

    path = os.environ.get("PATH", "")
    try:  # the ninja package's binary, also when the environment's bin directory is not on PATH
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path
    except ImportError:
        pass
    try:
        return load(name=f"kernel_attention_sliced_{_build_tag()}", sources=[str(_SOURCE)], extra_cflags=_FLAGS,
                    extra_ldflags=["-fopenmp"], verbose=False)
    finally:
        os.environ["PATH"] = path


def _load():
    """The module, built (or loaded from the cache) at the first call of the process; None if that failed."""
    with _lock:
        if not _state:
            try:
                _state["module"] = _build()
            except Exception as e:  # no compiler, no headers, a failed build: the Python loop runs
                last = (str(e).strip().splitlines() or [""])[-1][:200]
                _state["error"] = f"the build failed ({type(e).__name__}: {last})"
    return _state.get("module")


def why_not(dtype: torch.dtype) -> str | None:
    """None when the compiled loops run the sliced path for tensors of ``dtype``, else the reason."""
    if os.environ.get(ENV, "1") == "0":
        return f"turned off by {ENV}=0"
    if dtype not in (torch.float32, torch.float64):
        return f"compiled for float32 and float64, not {dtype}"
    if _load() is None:
        return _state["error"]
    return None


def sliced(dtype: torch.dtype):
    """The compiled module (``block_forward``, ``block_backward``) for tensors of ``dtype``, or None when it
    cannot run them (:func:`why_not` says why)."""
    return _state.get("module") if why_not(dtype) is None else None
