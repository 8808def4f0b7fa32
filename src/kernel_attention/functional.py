r"""``kernel_attention.attention``: the kernel smoother as a function, shaped like PyTorch's
:func:`~torch.nn.functional.scaled_dot_product_attention`.

    out = attention(q, k, v, kernel="rbf", mask="causal")

q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv).  With ``kernel="exp"`` and no
positional terms it equals ``scaled_dot_product_attention`` (tested).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings

import torch
from torch import Tensor

from kernel_attention.filters import Filter, make_filter
from kernel_attention.inputs import (_broadcasts, _query_mask, _same_dtype, _tensors, check_broadcast, check_finite,
                                     check_float_mask, check_inputs, kv_groups, validation)
from kernel_attention.kernels import Kernel, make_kernel
from kernel_attention.kernels.base import with_scale
from kernel_attention.kernels.capabilities import pools_keys
from kernel_attention.smoother import PositionalTerms

__all__ = ["attention", "explain", "choose_backend", "build_problem", "resolve_mask", "validation",
           "check_inputs", "check_finite"]

#: What a string spec alone determines, kept between calls (the functional API is called per layer and
#: step with the same specs, and building these cost more than a small attention call): filters,
#: kernels without parameters or buffers, and the (Tq, Tk) masks of filters that need no call-time
#: key mask (:attr:`Filter.by_spec`): the last ``_MASK_ENTRIES`` of up to ``_MASK_ELEMENTS`` elements
#: each (64 MB of bool masks at most).
_SPECS: dict = {}
_MASKS: dict = {}
_CACHE_ENTRIES = 64
_MASK_ENTRIES = 16
_MASK_ELEMENTS = 1 << 22
_WARNED: set = set()  # the compile failures warned of


def _from_spec(kind: str, spec, make, keep=lambda obj: True):
    """``make(spec)``; for a string spec, built once and kept (if ``keep(obj)``)."""
    if not isinstance(spec, str):
        return make(spec)
    obj = _SPECS.get((kind, spec))
    if obj is None:
        obj = make(spec)
        if keep(obj) and len(_SPECS) < _CACHE_ENTRIES:
            _SPECS[(kind, spec)] = obj
    return obj


def _stateless(kern: Kernel) -> bool:
    return next(iter(kern.parameters()), None) is None and next(iter(kern.buffers()), None) is None


def _filter_mask(filt: Filter, tq: int, tk: int, device, key_mask: Tensor | None) -> Tensor:
    """``filt.mask``, kept per (filter, Tq, Tk, device) when it is a function of those alone."""
    if key_mask is not None or not filt.by_spec or tq * tk > _MASK_ELEMENTS or torch.compiler.is_compiling():
        return _bool_mask(filt, filt.mask(tq, tk, device, key_mask), tq, tk)
    key = (filt.spec_key, tq, tk, str(device))
    keep = _MASKS.get(key)
    if keep is None:
        if len(_MASKS) >= _MASK_ENTRIES:
            _MASKS.pop(next(iter(_MASKS)))  # the oldest
        keep = _MASKS[key] = _bool_mask(filt, filt.mask(tq, tk, device), tq, tk)
    return keep


def _bool_mask(filt: Filter, keep, tq: int, tk: int) -> Tensor:
    """``keep``, checked to be what :meth:`Filter.mask` promises (a filter of one's own may return a 0/1 float
    mask, or a shape that is no (Tq, Tk) grid).  A mask of one row or one column, (..., 1, Tk), (..., Tq, 1) or
    (Tk,), as PyTorch's attention broadcasts it, is expanded to (..., Tq, Tk) (a view)."""
    if (not isinstance(keep, Tensor) or keep.dtype != torch.bool or keep.dim() < 1
            or not _broadcasts(keep.shape[-2:], (tq, tk))):
        got = f"{keep.dtype} {tuple(keep.shape)}" if isinstance(keep, Tensor) else type(keep).__name__
        raise ValueError(f"filter {filt!r}: mask({tq}, {tk}) gave {got}, not a bool tensor broadcastable to "
                         f"(..., {tq}, {tk}) (True = the key takes part)")
    if keep.dim() == 1:
        keep = keep[None]
    return keep if keep.shape[-2:] == (tq, tk) else keep.expand(*keep.shape[:-2], tq, tk)


def resolve_mask(mask, q: Tensor, k: Tensor, key_mask: Tensor | None = None,
                 is_causal: bool = False, defer: bool = False) -> tuple[Tensor | None, Tensor | None, Filter | None]:
    """Turn ``mask`` (None | bool tensor | float tensor | Filter | name) into
    (bool keep mask or None, float bias or None, the filter or None), all broadcastable to
    (B, H, Tq, Tk).  Raises when a tensor does not broadcast.  ``defer``: the keep mask of a filter that is
    a function of its spec alone (no key mask, no tensor of its own) is returned as a function that forms it,
    so that a caller that only describes the call (``explain``) never forms the (Tq, Tk) tensor."""
    b, tq, tk = q.shape[0], q.shape[2], k.shape[2]
    bias = None
    filt = None
    if isinstance(mask, Tensor) and mask.dtype != torch.bool:
        if not mask.is_floating_point():
            raise TypeError(f"mask must be bool (True = the key takes part) or float (added to log k), got {mask.dtype}")
        bias, mask = mask, None
    if mask is not None:
        filt = _from_spec("filter", mask, make_filter)
    if is_causal:
        causal = _from_spec("filter", "causal", make_filter)
        filt = causal if filt is None else filt & causal
    if key_mask is not None:
        if key_mask.dtype != torch.bool or key_mask.shape != (b, tk):
            raise ValueError(f"key_mask must be bool of shape (B={b}, Tk={tk}), True = real token; got "
                             f"{tuple(key_mask.shape)} {key_mask.dtype}")
    keep = None
    # a full filter keeps every pair: with a key mask, the mask is the key mask's (B, 1, 1, Tk), which fused
    # attention takes as padding, not a (B, 1, Tq, Tk) formed from it
    if filt is not None and filt.kind != "full":
        if defer and key_mask is None and filt.by_spec and not torch.compiler.is_compiling():
            return functools.partial(_filter_mask, filt, tq, tk, q.device, None), check_float_mask(
                "float mask", bias, q, k), filt
        keep = _filter_mask(filt, tq, tk, q.device, key_mask)
    if key_mask is not None and not (filt is not None and filt.needs_key_mask):
        km = key_mask[:, None, None, :]
        keep = km if keep is None else keep & km
    check_broadcast("mask", keep, q, k)
    bias = check_float_mask("float mask", bias, q, k)
    return keep, bias, filt


def attention(q: Tensor, k: Tensor, v: Tensor, kernel: str | Kernel = "exp", mask=None, *,
              key_mask: Tensor | None = None, is_causal: bool = False, bias: Tensor | None = None,
              terms: PositionalTerms | None = None, dropout_p: float = 0.0, need_weights: bool = False,
              enable_gqa: bool = False, scale: float | None = None, backend="auto",
              query_mask: Tensor | None = None):
    r"""Kernel-smoother attention (Transformer Dissection, Definition 1).

    .. math::  out_i = \sum_{j \in M(i)} \frac{k(q_i, k_j)}{\sum_{j' \in M(i)} k(q_i, k_{j'})} v_j

    Args:
        q: (B, H, Tq, D) queries; k: (B, H, Tk, D) keys; v: (B, H, Tk, Dv) values.
        kernel: a kernel name or spec (``"exp"``, ``"rbf"``, ``"poly:degree=3"``, ``"linear"``,
            ``"periodic"``, ...; see ``kernel_attention.KERNELS``) or a :class:`Kernel`.
        mask: the set filter M.  A bool tensor broadcastable to (B, H, Tq, Tk) with True = the key takes
            part (as in PyTorch's fused attention); a float tensor, added to log k (as PyTorch adds a
            float mask to the logits); a :class:`~kernel_attention.filters.Filter`; or a filter name or
            composition (``"causal"``, ``"causal&local:window=4"``).
        key_mask: (B, Tk) bool, True = real token; padding keys are excluded.
        query_mask: (B, Tq) bool, True = real query: the queries a kernel pools over (the implicit kernels'
            amortised density pools q and k); None: every query.  In self-attention with padding, pass the
            key_mask here too (:class:`~kernel_attention.KernelAttention` does).  Other kernels ignore it.
        is_causal: intersect M with the (lower-right aligned) causal set.
        bias: extra additive log-kernel term broadcastable to (B, H, Tq, Tk), i.e. a multiplicative
            factor exp(bias) of the kernel (a positional kernel k_T in product form).
        terms: positional factor in compact form (what :class:`~kernel_attention.KernelAttention`
            passes); ``bias`` is added to it.
        dropout_p: dropout on the normalised weights.
        need_weights: also return the (B, H, Tq, Tk) weights.
        enable_gqa: grouped-query attention: k and v may have H_kv heads, a divisor of q's H, each shared by
            H / H_kv consecutive query heads (as in :func:`torch.nn.functional.scaled_dot_product_attention`).
        scale: the factor of <q, k> in the exponent of ``exp`` (or of -||q - k||^2 in ``rbf``); None: the
            kernel's own (1/sqrt(D) by default), as PyTorch's ``scale=``.  The same as ``kernel="exp:scale=s"``.
        backend: ``"auto"`` (default) walks the named backends in order (``sdpa``, ``triton``, ``flex``,
            ``banded``, ``squared``, ``blockwise``, ``linear``, ``dense``) and takes the first that runs the call; a
            name (or a spec such as ``"blockwise:block=4096"``) forces one and raises
            :class:`~kernel_attention.backends.BackendError` if it cannot run the call
            (:class:`~kernel_attention.backends.KernelCompileError` if its kernels fail to compile for it, where
            ``auto`` warns and runs the call on the next backend).  See :func:`explain` for why each backend was
            or was not chosen.

    Returns:
        (B, H, Tq, Dv), or ``(output, weights)`` when ``need_weights``.  A query whose filtered set is
        empty gets zeros (and zero gradient), never NaN.

    A direct kernel (``poly``, ``linear``, ``linear-magnitude``: no log-kernel) is computed in float32 (at
    least) when the inputs are half precision or autocast is on, and its output returned in q's dtype: its
    normaliser sum_j k(q_i, k_j) is a plain sum, which cancels at bfloat16's 8 bits of mantissa (a signed
    kernel) and overflows float16's range, where an exp-family kernel's soft-max subtracts the row maximum.
    """
    _tensors(q, k, v)  # before q.dtype is read
    if all(x.is_floating_point() for x in (q, k, v)) and not q.dtype == k.dtype == v.dtype:
        if not torch.is_autocast_enabled(q.device.type):
            _same_dtype(q, k, v)  # before a direct kernel's inputs are widened to one dtype below
        dt = torch.get_autocast_dtype(q.device.type)  # as PyTorch's attention casts them under autocast
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
    kern = _from_spec("kernel", with_scale(kernel, scale), make_kernel, _stateless)
    out_dtype = q.dtype
    wide = not kern.positive and (q.dtype in (torch.float16, torch.bfloat16)
                                  or torch.is_autocast_enabled(q.device.type))
    if wide:
        dt = torch.promote_types(q.dtype, torch.float32)
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
        mask = mask.to(dt) if isinstance(mask, Tensor) and mask.is_floating_point() else mask
        bias = bias.to(dt) if bias is not None else None
        terms = terms.to(dt) if terms is not None else None
    held = next((p.dtype for p in kern.parameters() if p.is_floating_point()), q.dtype)
    if held != q.dtype and not torch.is_autocast_enabled(q.device.type):  # autocast casts per operation itself
        raise TypeError(f"kernel {getattr(kern, 'name', type(kern).__name__)!r} holds {held} weights and q is "
                        f"{q.dtype}: move the kernel with .to({q.dtype}) (a layer's .to() moves its kernel)")
    problem = build_problem(q, k, v, kern, mask, key_mask=key_mask, is_causal=is_causal, bias=bias,
                            terms=terms, dropout_p=dropout_p, need_weights=need_weights, enable_gqa=enable_gqa)
    query_mask = _query_mask(query_mask, q)
    pools = (key_mask is not None or query_mask is not None) and pools_keys(problem.kernel)
    if pools:  # the backends call log_kernel(q, k) and its relatives, which pool over keys, without the masks
        problem.kernel.pool_key_mask, problem.kernel.pool_query_mask = key_mask, query_mask
    try:
        with torch.autocast(q.device.type, enabled=False) if wide else contextlib.nullcontext():
            out, weights = _run(problem, backend)
    finally:
        if pools:
            problem.kernel.pool_key_mask = problem.kernel.pool_query_mask = None
    if wide:
        out = out.to(out_dtype)
        weights = weights.to(out_dtype) if weights is not None else None
    return (out, weights) if need_weights else out


def _run(problem, backend) -> tuple:
    """(out, weights) of ``problem`` on ``backend``; under ``auto``, a chosen backend whose kernels fail to compile
    for it (:class:`~kernel_attention.backends.KernelCompileError`) is passed over for the next one, with a warning
    at the first such call."""
    from kernel_attention.backends import AUTO, KernelCompileError, choose

    choice = choose(problem, backend, explain=False)
    try:
        return choice.backend.run(problem)
    except KernelCompileError as e:
        if backend != AUTO:
            raise KernelCompileError(f"{e}; backend='auto' runs such a call on another backend") from e
        why = str(e)
        then = choose(problem, backend, explain=False, skip={choice.name: why})
        if why not in _WARNED:
            _WARNED.add(why)
            warnings.warn(f"{why}; backend='auto' runs such calls on {then.name!r} instead", RuntimeWarning,
                          stacklevel=3)
        return then.backend.run(problem)


def build_problem(q: Tensor, k: Tensor, v: Tensor, kernel: str | Kernel = "exp", mask=None, *,
                  key_mask: Tensor | None = None, is_causal: bool = False, bias: Tensor | None = None,
                  terms: PositionalTerms | None = None, dropout_p: float = 0.0, need_weights: bool = False,
                  enable_gqa: bool = False, scale: float | None = None, defer_mask: bool = False):
    """Check the inputs and resolve the kernel, filter and additive terms into a backend
    :class:`~kernel_attention.backends.Problem` (the arguments are those of :func:`attention`).
    ``defer_mask``: a structured filter's (Tq, Tk) mask is formed only when a backend reads ``keep``
    (``explain`` and ``choose_backend``, which describe from the filter's kind and row bounds)."""
    from kernel_attention.backends import Problem

    groups = kv_groups(q, k, v) if enable_gqa else 1
    check_inputs(q, k, v, groups=groups)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    kern = _from_spec("kernel", with_scale(kernel, scale), make_kernel, _stateless)
    keep, float_mask, filt = resolve_mask(mask, q, k, key_mask, is_causal, defer=defer_mask)
    keep, keep_fn = (None, keep) if callable(keep) else (keep, None)
    bias = check_float_mask("bias", bias, q, k)
    extra = [x for x in (float_mask, bias) if x is not None]
    if extra:
        terms = PositionalTerms() if terms is None else terms
        total = sum(extra[1:], extra[0])
        terms = dataclasses.replace(terms, bias=total if terms.bias is None else terms.bias + total)
    return Problem(q, k, v, kern, keep=keep, filter=filt, key_mask=key_mask, terms=terms,
                   dropout_p=dropout_p, need_weights=need_weights, keep_fn=keep_fn, kv_groups=groups)


def choose_backend(q: Tensor, k: Tensor, v: Tensor, kernel: str | Kernel = "exp", mask=None, *,
                   backend="auto", **kwargs) -> tuple[str, dict]:
    """``(name, reasons)``: the backend :func:`attention` would use for these arguments and, for every
    backend, why it was or was not chosen.  Runs no attention."""
    from kernel_attention.backends import choose

    c = choose(build_problem(q, k, v, kernel, mask, defer_mask=True, **kwargs), backend)
    return c.name, c.reasons


def explain(q: Tensor, k: Tensor, v: Tensor, kernel: str | Kernel = "exp", mask=None, *, backend="auto",
            **kwargs):
    """The :class:`~kernel_attention.backends.Choice` for these arguments (``print`` it):

        >>> print(explain(q, k, v, kernel="poly", mask="local:window=8"))
        backend: dense
          sdpa: kernel 'poly' has no SDPA features (capability SDPAFeatures)
          ...
          linear: filter local(window=8) is neither full, causal nor padding ...
          dense: chosen: materialises the (Tq, Tk) kernel matrix

    A mask given by name is described from the filter's row bounds, not formed (``build_problem``'s
    ``defer_mask``): memory O(Tq + Tk) for it (a sparse pattern's kept keys come from its tiles), except where
    the squared backend checks a union of filters (``|``), whose mask it forms.
    """
    from kernel_attention.backends import choose

    return choose(build_problem(q, k, v, kernel, mask, defer_mask=True, **kwargs), backend)
