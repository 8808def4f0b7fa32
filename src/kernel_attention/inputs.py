r"""The checks of an attention call's inputs: q, k, v (types, shapes, dtypes, grouped heads), masks that must
broadcast to (B, H, Tq, Tk), the query mask, and the finiteness check that :func:`validation` switches.

Shapes, dtypes and names are always checked (they read no tensor values); NaN and inf only where
:func:`validation` says, since the check reads a value back to the host.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor

__all__ = ["validation", "check_finite", "check_inputs", "check_broadcast", "check_float_mask", "kv_groups"]

_VALIDATE: bool | str = "auto"


def _broadcasts(shape, target) -> bool:
    """Whether ``shape`` broadcasts to ``target`` (``torch.broadcast_shapes`` costs more than a small call)."""
    return len(shape) <= len(target) and all(a == 1 or a == b for a, b in zip(reversed(shape), reversed(target)))


@contextlib.contextmanager
def validation(enabled: bool | str):
    """Set the finiteness check (NaN / inf in q, k, v and float masks) inside a block.

    ``"auto"`` (the default outside any block): checked where it costs no wait for a device, that is
    on CPU tensors in eager mode; skipped on accelerators and while ``torch.compile`` traces (a check
    there reads a value back to the host, which stalls every layer).  ``True``: always checked (on an
    accelerator each call then waits for the device; under ``torch.compile`` the check runs as
    ``torch._assert_async``, with a generic message).  ``False``: never.  Shape, dtype and name
    checks always run: they read no tensor values."""
    global _VALIDATE
    if not (enabled is True or enabled is False or enabled == "auto"):  # 1 == True, but is no setting
        raise ValueError(f"validation takes True, False or 'auto', got {enabled!r}")
    old, _VALIDATE = _VALIDATE, enabled
    try:
        yield
    finally:
        _VALIDATE = old


def check_finite(tensors: dict, neg_inf: bool = False) -> None:
    """Raise ``ValueError`` naming the first of ``tensors`` ({name: tensor}) that holds NaN or inf (``neg_inf``:
    -inf is allowed, as in a float mask that drops keys), as :func:`validation` says: one reduction per tensor
    and one read of their total in eager mode."""
    if _VALIDATE is False or not tensors:
        return
    compiling = torch.compiler.is_compiling()
    if _VALIDATE == "auto" and (compiling or any(x.device.type != "cpu" for x in tensors.values())):
        return
    with torch.no_grad():
        # a NaN or inf makes the total non-finite (inf - inf is NaN); a non-finite total is re-checked
        # elementwise to name the input (a finite sum that overflows is not an error)
        if neg_inf:  # -inf counted as 0: only NaN and +inf are errors
            tensors = {n: x.masked_fill(x == float("-inf"), 0) for n, x in tensors.items()}
        total = sum(x.sum(dtype=torch.float32) for x in tensors.values())
    if compiling:
        torch._assert_async(torch.isfinite(total), "attention inputs contain NaN or inf values")
        return
    if not math.isfinite(float(total)):
        for name, x in tensors.items():
            if not torch.isfinite(x).all():
                raise ValueError(f"{name} contains NaN or {'+inf' if neg_inf else 'inf'} values"
                                 + (" (-inf drops a key; NaN and +inf are not accepted)" if neg_inf else ""))


def _tensors(q, k, v) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_inputs(q: Tensor, k: Tensor, v: Tensor, finite: bool = True, groups: int = 1) -> None:
    """Raise a clear error for tensors that do not fit (B, H, Tq, D), (B, H_kv, Tk, D), (B, H_kv, Tk, Dv),
    H = ``groups`` · H_kv (grouped-query attention, :func:`kv_groups`; 1: the same heads)."""
    _tensors(q, k, v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must have 4 dims (B, H, T, D), got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if (q.shape[0], q.shape[1]) != (k.shape[0], k.shape[1] * groups) or k.shape[:2] != v.shape[:2]:
        gqa = q.shape[0] == k.shape[0] == v.shape[0] and k.shape[1] == v.shape[1] and q.shape[1] % k.shape[1] == 0
        raise ValueError(f"q, k, v must share (B, H): got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
                         + ("; pass enable_gqa=True for grouped-query attention" if gqa else ""))
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same feature size D: q {tuple(q.shape)} vs k {tuple(k.shape)}")
    if q.shape[-1] == 0 or v.shape[-1] == 0:
        raise ValueError(f"the feature sizes D and Dv must be at least 1: q {tuple(q.shape)}, v {tuple(v.shape)}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same number of keys Tk: k {tuple(k.shape)} vs v {tuple(v.shape)}")
    _same_dtype(q, k, v)
    if finite:
        check_finite({"q": q, "k": k, "v": v})


def _query_mask(query_mask: Tensor | None, q: Tensor) -> Tensor | None:
    """``query_mask`` checked to be (B, Tq) bool for q (B, H, Tq, D)."""
    if query_mask is not None and (not isinstance(query_mask, Tensor) or query_mask.dtype != torch.bool
                                   or tuple(query_mask.shape) != (q.shape[0], q.shape[2])):
        got = f"{query_mask.dtype} {tuple(query_mask.shape)}" if isinstance(query_mask, Tensor) else query_mask
        raise ValueError(f"query_mask must be a bool (B, Tq) = {(q.shape[0], q.shape[2])} tensor (True = real "
                         f"query), got {got}")
    return query_mask


def _same_dtype(q: Tensor, k: Tensor, v: Tensor) -> None:
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def kv_groups(q: Tensor, k: Tensor, v: Tensor) -> int:
    """Grouped-query attention, as SDPA's ``enable_gqa``: k (B, H_kv, Tk, D) and v (B, H_kv, Tk, Dv) with H_kv
    dividing q's H heads, query heads g·H/H_kv .. (g+1)·H/H_kv - 1 sharing key/value head g.  Returns
    H / H_kv, the query heads per key/value head (a backend that cannot take the groups repeats k and v so,
    :meth:`~kernel_attention.backends.Problem.grouped_kv`)."""
    if not all(isinstance(x, Tensor) and x.dim() == 4 for x in (q, k, v)):
        return 1  # check_inputs names the tensor of the wrong type or rank
    h, hk = q.shape[1], k.shape[1]
    if hk != v.shape[1] or hk == 0 or h % hk:
        raise ValueError(f"enable_gqa needs k and v with the same number of heads H_kv, a divisor of q's H: got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    return h // hk


def check_broadcast(name: str, t: Tensor | None, q: Tensor, k: Tensor) -> None:
    """Raise unless ``t`` (or None) broadcasts to (B, H, Tq, Tk) as PyTorch's attention masks do."""
    if t is None:
        return
    target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if t.dim() > 4:
        raise ValueError(f"{name} has {t.dim()} dims; at most 4 (B, H, Tq, Tk) are accepted")
    if not _broadcasts(t.shape, target):
        raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to (B, H, Tq, Tk) = {target}")


def check_float_mask(name: str, t: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
    """An additive float mask checked (broadcasts to (B, H, Tq, Tk); no NaN or +inf, while -inf drops a key)
    and given 4 dims and q's dtype and device (as a bool mask is moved), so that every backend indexes and adds it
    alike; None stays None."""
    if t is None:
        return None
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (added to log k), got {t.dtype}")
    check_broadcast(name, t, q, k)
    check_finite({name: t}, neg_inf=True)
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t.to(device=q.device, dtype=q.dtype)
