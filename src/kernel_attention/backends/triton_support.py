r"""Whether the ``triton`` backend runs a call, and what its two paths (the flash kernels,
:mod:`~kernel_attention.backends.triton_flash`, and the squared form, :mod:`~kernel_attention.backends.triton_squared`)
share: loading their kernel modules, compiled or interpreted, the tile sizes of a launch, and the compile check.

:func:`triton_why_not` is the backend's ``supports``: Triton installed; CUDA tensors, or CPU tensors under
Triton's interpreter (``TRITON_INTERPRET=1`` set before the kernels are first loaded, for tests); no weights
asked for and no dropout on them; a filter the kernels compute per tile
(:func:`~kernel_attention.backends.triton_filters.tile_filter`); then either an exp-family kernel on its SDPA
features with Shaw's clipped tables (:func:`shaw_terms`), Transformer-XL's term and a float bias, or an implicit
kernel in squared form (:func:`squared_why_not`) without positional terms.

:func:`compile_check` compiles the kernels of an eager call's specialisation before its forward runs, the
backward's with them, so that a Triton release that cannot compile them (Triton 3.6 rejects code that 3.9
compiles) raises :class:`~kernel_attention.backends.KernelCompileError` while ``auto`` can still run the call on
another backend, rather than Triton's error in the middle of a backward pass.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading

import torch
from torch import Tensor

from kernel_attention.backends.base import Problem
from kernel_attention.backends.dispatch import KernelCompileError
from kernel_attention.backends.first_order import first_order
from kernel_attention.backends.squared import MAX_SPREAD, key_spread
from kernel_attention.backends.triton_filters import TileFilter, kept_key_log, tile_filter
from kernel_attention.kernels.capabilities import has_squared_form, sdpa_layout
from kernel_attention.positions.difference_index import DifferenceIndex

__all__ = ["INSTALLED", "triton_why_not", "squared_why_not", "shaw_terms", "kernels", "pow2", "cdiv", "direct",
           "eager_function", "launch", "differentiates", "signature", "compile_check", "compile_failures"]

#: whether triton can be imported (found without importing it: TRITON_INTERPRET must be set before that)
INSTALLED = importlib.util.find_spec("triton") is not None

_FLASH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: float16's exponent range does not hold eps · e^-MAX_SPREAD
_SQUARED_DTYPES = (torch.float32, torch.bfloat16)


def kernels(name: str):
    """The kernel module ``kernel_attention.backends.<name>`` (``triton_kernels``, ``triton_squared_kernels``,
    ``triton_tiles``), imported on first use: whether its kernels are compiled or interpreted is fixed then, by
    TRITON_INTERPRET."""
    return importlib.import_module(f"kernel_attention.backends.{name}")


def _interpreting() -> bool:
    """TRITON_INTERPRET is set (read as Triton reads it, without importing Triton)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def _loaded_interpreted() -> bool | None:
    """Whether the kernels were loaded for the interpreter; None when not loaded yet (both kernel modules import
    ``triton_tiles``, so its flag stands for them)."""
    mod = sys.modules.get("kernel_attention.backends.triton_tiles")
    return None if mod is None else mod.INTERPRETED


def pow2(n: int, least: int = 16) -> int:
    """The least power of two >= n and >= ``least``: a tile's extent (Triton's ranges are powers of two)."""
    return max(least, 1 << max(0, (n - 1).bit_length()))


def cdiv(a: int, b: int) -> int:
    """ceil(a / b): the tiles that cover ``a`` rows of ``b``."""
    return -(-a // b)


def direct(*args) -> bool:
    """True when a call may run its operator's implementation directly: torch.compile is not tracing and every
    tensor argument is a plain tensor (not a fake or functional one).  The operator machinery (schema checks,
    defaults, dispatch) adds host time to every call (docs/benchmarks-gpu-triton.md, "Host time per call"), and
    on a GPU a short call waits on its host."""
    if torch.compiler.is_compiling():
        return False
    return all(type(x) in (Tensor, torch.nn.Parameter) for x in args if isinstance(x, Tensor))


def eager_function(name: str, forward, setup_context, backward) -> type:
    """An autograd Function with an operator's implementation (``forward``) and autograd formula
    (``setup_context``, ``backward``, as given to ``register_autograd``): the operator's eager path, for calls
    where :func:`direct` holds; gradients of outputs that are not used arrive as None."""

    def run(ctx, *inputs):  # a forward taking ctx: apply() then skips binding the arguments to a signature
        ctx.set_materialize_grads(False)
        output = forward(*inputs)
        setup_context(ctx, inputs, output)
        return output

    # a second derivative is refused, as the operators (no formula for the backward) refuse it
    body = {"forward": staticmethod(run), "backward": staticmethod(first_order(backward))}
    return type(name, (torch.autograd.Function,), body)


#: the kernels' specialisations checked so far: key -> None (compiled) or Triton's error, in one line
_checked: dict = {}
_warming = threading.local()


def launch(kernel, grid):
    """``kernel[grid]``; inside :func:`compile_check`'s warm-up, a call that compiles ``kernel`` for the arguments
    it is given and loads it onto the device without running it (Triton's ``warmup``)."""
    if getattr(_warming, "on", False):
        def warm(*args, **kwargs):
            _warming.kernel = getattr(kernel, "__name__", "?")
            compiled = kernel.warmup(*args, grid=grid, **kwargs)
            # loading it onto the device checks its shared memory and threads against the device's (OutOfResources),
            # which Triton otherwise does at the first launch
            getattr(compiled, "_init_handles", lambda: None)()
        return warm
    return kernel[grid]


def differentiates(args: tuple) -> bool:
    """Whether a call on ``args`` will differentiate: gradients on and some tensor argument requires one."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in args if isinstance(x, Tensor))


def signature(*parts) -> tuple:
    """What of a call's tensors (on one device) decides the code its kernels compile to besides the widths of
    their tiles: each one's dtype and rank, or None."""
    return tuple(None if x is None else (x.dtype, x.dim()) for x in parts)


def compile_check(key: tuple, warm) -> None:
    """Compile, without running them, the kernels of a call the first time its specialisation ``key`` is seen:
    ``warm()`` makes the call's launches (forward, and backward where it will differentiate) with :func:`launch`
    compiling instead of running.  Raises :class:`KernelCompileError` with Triton's message where one fails, at
    once for that key on later calls.  A call whose kernels fail here, before its forward runs, can still run on
    another backend; one whose backward failed at its first launch could not."""
    if key not in _checked:
        _warming.on, _warming.kernel = True, None
        try:
            warm()
            _checked[key] = None
        except torch.OutOfMemoryError:  # the stand-in outputs did not fit: not the kernels' fault, check again later
            raise
        except Exception as e:  # noqa: BLE001 - a warm-up only compiles: any other error is Triton's compiler's
            lines = [x for x in str(e).splitlines() if x.strip()]
            where = f"{_warming.kernel}: " if _warming.kernel else ""
            _checked[key] = f"{where}{type(e).__name__}: {lines[-1] if lines else ''}".strip()
        finally:
            _warming.on = False
    why = _checked[key]
    if why is not None:
        import triton

        raise KernelCompileError(f"Triton {triton.__version__} failed to compile the triton backend's kernels for "
                                 f"this call ({why})")


def compile_failures() -> list[str]:
    """Triton's errors for the kernel specialisations that failed to compile in this process."""
    return [why for why in _checked.values() if why is not None]


def _shaw_band(index, tq: int, tk: int, width: int) -> tuple[int, int] | None:
    """(c, o) when ``index`` is clip(o + i - j, -c, c) + c and the table has 2c + 1 columns, else None."""
    if isinstance(index, DifferenceIndex):
        c = index.clip
        o = index.offset() if c is not None else None
    else:
        from kernel_attention.backends.banded import shaw_clip

        c, o = shaw_clip(index, tq, tk), 0
    if c is None or o is None or width != 2 * c + 1:
        return None
    return c, o


def shaw_terms(p: Problem) -> tuple[int, int] | str | None:
    """(c, o) of Shaw's index clip(o + i - j, -c, c) + c shared by the key table and the value table that ``p``'s
    terms hold, None when they hold neither, or why not in words."""
    t = p.terms
    b, h, tq, tk = p.shape
    if t is None or not (t.relative or t.value):
        return None
    if len(t.relative) > 1 or len(t.value) > 1:
        return "more than one relative table (several position axes)"
    bands = []
    for logits, index in t.relative:
        band = _shaw_band(index, tq, tk, logits.shape[-1]) if logits.dim() == 4 else None
        if band is None:
            return "a relative table other than Shaw's clip(o + i - j, -c, c) + c with its 2c + 1 columns"
        bands.append(band)
    for table, index in t.value:
        band = _shaw_band(index, tq, tk, table.shape[0]) if table.dim() == 2 else None
        if band is None:
            return "a relative value table other than Shaw's (2c + 1, Dv) read at clip(o + i - j, -c, c) + c"
        bands.append(band)
    if len(set(bands)) > 1:
        return "Shaw's key and value tables read at different indices"
    return bands[0]


def squared_why_not(p: Problem, tf: TileFilter, km: Tensor | None) -> str | None:
    """None when the squared path runs ``p`` (a kernel with :class:`SquaredForm`, the filter already read as
    ``tf`` and ``km``); otherwise why not."""
    t = p.terms
    if t is not None and (t.relative or t.relative_factors or t.bias is not None or t.value
                          or t.key_bias is not None or t.q_feat is not None):
        return "the squared form (implicit kernels) takes no positional terms: they enter log k"
    if p.q.dtype not in _SQUARED_DTYPES:
        return f"dtype {p.q.dtype}: the squared form takes float32 or bfloat16 (eps · e^-{MAX_SPREAD:g} underflows)"
    if torch.compiler.is_compiling():
        return "the squared form's key-log range is read back to the host, which torch.compile does not trace"
    spread = key_spread(kept_key_log(p, tf, km))
    if spread > MAX_SPREAD:
        return (f"the per-key log factor spans {spread:.3g} (more than {MAX_SPREAD:g}), so its exponentials "
                f"would underflow")
    return None


def triton_why_not(p: Problem, key_bias: str = "mask") -> str | None:
    """None when the ``triton`` backend runs ``p``; otherwise why not."""
    if not INSTALLED:
        return "triton is not installed (pip install 'kernel-attention[gpu]')"
    dev = p.q.device.type
    if dev == "cpu":
        if not _interpreting():
            return "CPU tensors run only under Triton's interpreter (TRITON_INTERPRET=1, for tests)"
        if _loaded_interpreted() is False:
            return "its kernels were loaded compiled (TRITON_INTERPRET was not set when they were first used)"
    elif dev != "cuda":
        return f"device {dev!r}: its kernels run on CUDA (or on the CPU under Triton's interpreter)"
    if p.need_weights:
        return "need_weights=True: only dense forms the (Tq, Tk) weights"
    if p.dropout_p > 0:
        return "dropout on the weights is not in its kernels"
    filt = tile_filter(p)
    if isinstance(filt, str):
        return filt
    if has_squared_form(p.kernel):
        return squared_why_not(p, *filt)
    if sdpa_layout(p.kernel, key_bias) is None:
        return (f"kernel {p.kernel.name!r} has neither SDPA features (capability SDPAFeatures) nor a squared "
                f"form (SquaredFeatures)")
    if p.q.dtype not in _FLASH_DTYPES:
        return f"dtype {p.q.dtype}: its kernels take float32, bfloat16 or float16"
    t = p.terms
    b, h, tq, tk = p.shape
    if t is not None:
        if t.bias is not None and t.bias.dim() > 4:
            return "a float mask or bias of more than 4 dims"
        shaw = shaw_terms(p)
        if isinstance(shaw, str):
            return shaw
        if len(t.relative_factors) > 1:
            return "more than one relative table (several position axes)"
        for q_side, table, index in t.relative_factors:
            from kernel_attention.backends.relative import toeplitz_base

            if q_side.dim() != 4 or table.dim() != 3 or table.shape[0] not in (1, h):
                return "Transformer-XL's term with a table other than (H|1, R, d)"
            if toeplitz_base(index) is None:
                return "Transformer-XL's term with an index other than base + i - j (default positions)"
    return None
