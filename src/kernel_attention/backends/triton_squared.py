r"""The ``triton`` backend's path for a kernel in squared form (the implicit kernels, :class:`SquaredForm`):

    k(q_i, k_j) = c_i · (<q'_i, k'_j>^2 + eps) · exp(m_j),     out_i = sum_j k_ij v_j / sum_j k_ij

normalised as k / sum k (no soft-max), c_i cancelling.  As on the CPU's ``squared`` backend
(:mod:`~kernel_attention.backends.squared`), with w_j = exp(m_j - max_kept m) <= 1 and V' = [w ∘ v, w]
(B, H, Tk, Dv + 1) formed with torch ops (their autograd carries the gradient to m, the key log):

    N_i = sum_j (s_ij^2 + eps) M_ij V'_j  (B, H, Tq, Dv + 1) float32,     out_i = N_i[:Dv] / N_i[Dv]

(0 for a row with no kept key).  N and its gradients for q', k', V' are Triton kernels over tiles
(:mod:`~kernel_attention.backends.triton_squared_kernels`), registered as two operators with fake
implementations (``kernel_attention::triton_squared_forward``, ``::triton_squared_backward``); no (Tq, Tk)
tensor is formed.  The filter (an intersection of a band, a sparse pattern and padding,
:mod:`~kernel_attention.backends.triton_filters`) is the one of the exp-family kernels, with the same tile
skipping.

**Magnitude dropout** (training with ``magnitude_dropout`` > 0): k_ij = (s_ij^2 + eps) · exp(D_ij (a_i + m_j)),
D drawn per pair in the kernels from the call's seed (``SquaredForm.seed``) at the pair's offset, the same in
the forward and both backward kernels; the kernels sum the kept pairs on V' and the dropped ones on V1 = [v, 1],
and the rows combine them as the CPU path does (:func:`~kernel_attention.backends.squared.squared_smoother`).
The masks differ from the CPU paths' for one seed (another generator); their distribution is the same.
:func:`magnitude_keep_mask` forms D for tests.

**Range.**  m is masked to the keys some query keeps and its spread (max - min) must be at most
:data:`~kernel_attention.backends.squared.MAX_SPREAD`, as on the CPU path: the check reads the spread back
to the host, so it is not made while ``torch.compile`` traces (the path refuses there).  float16 is refused
(its exponent range does not hold eps · e^-MAX_SPREAD).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from kernel_attention.backends.base import Problem
from kernel_attention.backends.triton_filters import TileFilter, kept_key_log
from kernel_attention.backends.triton_support import (cdiv, compile_check, differentiates, direct, eager_function,
                                                      kernels, launch, pow2, signature)

__all__ = ["squared_forward", "squared_backward", "triton_squared_smoother", "magnitude_keep_mask"]


# The kernels as two operators with fake implementations, run directly as an autograd Function on eager calls of
# plain tensors (triton_support.direct).  Inputs are contiguous: fq (B, H, Tq, F), fk (B, H, Tk, F), vw (B, H, Tk,
# W) and, with magnitude dropout, v1 (B, H, Tk, W), of one dtype; km (B, H, Tk) int8 or None; ``filt`` is
# TileFilter.args(); n and dn (B, H, Tq, W), or (B, H, Tq, 2W) with dropout, float32.

def _launch(fq, fk, vw, km, filt, eps, drop, seed, block) -> dict:
    mode, off, lo, hi, pattern, stride, c = filt
    return dict(Tq=fq.shape[2], Tk=fk.shape[2], F=fq.shape[-1], W=vw.shape[-1], eps=eps, drop=drop, seed=seed,
                OFF=off, DLO=lo, DHI=hi, STRIDE=stride, SC=c, MODE=mode, PAT=pattern, HAS_KM=km is not None,
                HAS_DROP=drop > 0, PREC="ieee" if fq.dtype == torch.float32 else "tf32",
                BM=block, BN=block, BF=pow2(fq.shape[-1]), BW=pow2(vw.shape[-1]),
                num_warps=8 if block >= 64 else 4)


def _squared_forward(fq: Tensor, fk: Tensor, vw: Tensor, v1: Optional[Tensor], km: Optional[Tensor], filt: list[int],
                     eps: float, drop: float, seed: int, block: int) -> Tensor:
    """N (B, H, Tq, W) float32: N_i = sum_j (<fq_i, fk_j>^2 + eps) M_ij vw_j; with ``drop`` > 0, [N1, N2]
    (B, H, Tq, 2W), the pairs whose magnitude is kept on vw and the dropped ones on v1."""
    b, h, tq, _ = fq.shape
    width = vw.shape[-1] * (2 if drop > 0 else 1)
    n = torch.empty(b, h, tq, width, dtype=torch.float32, device=fq.device)
    launch(kernels("triton_squared_kernels").squared_forward, (cdiv(tq, block), b * h))(
        fq, fk, vw, vw if v1 is None else v1, fq if km is None else km, n,
        **_launch(fq, fk, vw, km, filt, eps, drop, seed, block))
    return n


squared_forward = torch.library.custom_op("kernel_attention::triton_squared_forward", mutates_args=())(_squared_forward)


@squared_forward.register_fake
def _(fq, fk, vw, v1, km, filt, eps, drop, seed, block):
    b, h, tq, _ = fq.shape
    return fq.new_empty(b, h, tq, vw.shape[-1] * (2 if drop > 0 else 1), dtype=torch.float32)


def _squared_backward(dn: Tensor, fq: Tensor, fk: Tensor, vw: Tensor, v1: Optional[Tensor], km: Optional[Tensor],
                      filt: list[int], eps: float, drop: float, seed: int,
                      block: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dfq, dfk, dvw, dv1), the gradients of :func:`squared_forward`'s inputs given dN (dv1 empty without
    dropout)."""
    kern = kernels("triton_squared_kernels")
    b, h, tq, _ = fq.shape
    tk = fk.shape[2]
    dn = dn.float().contiguous()
    args = _launch(fq, fk, vw, km, filt, eps, drop, seed, block)
    kmp = fq if km is None else km
    dfq, dfk, dvw = torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(vw)
    dv1 = fq.new_empty(0) if v1 is None else torch.empty_like(v1)
    v1p = vw if v1 is None else v1
    launch(kern.squared_backward_kv, (cdiv(tk, block), b * h))(fq, fk, vw, v1p, kmp, dn, dfk, dvw,
                                                              dvw if v1 is None else dv1, **args)
    # 4 warps at 64-row tiles: with 8, this kernel spills more (magnitude dropout), the other two less
    # (docs/benchmarks-gpu-triton.md, "Compiled for sm_90")
    launch(kern.squared_backward_q, (cdiv(tq, block), b * h))(fq, fk, vw, v1p, kmp, dn, dfq,
                                                             **{**args, "num_warps": 8 if block > 64 else 4})
    return dfq, dfk, dvw, dv1


squared_backward = torch.library.custom_op("kernel_attention::triton_squared_backward",
                                           mutates_args=())(_squared_backward)


@squared_backward.register_fake
def _(dn, fq, fk, vw, v1, km, filt, eps, drop, seed, block):
    return (torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(vw),
            fq.new_empty(0) if v1 is None else torch.empty_like(v1))


def _setup_context(ctx, inputs, output):
    fq, fk, vw, v1, km, *params = inputs
    ctx.params = params
    ctx.save_for_backward(fq, fk, vw, v1, km)


def _backward(ctx, dn):
    fq, fk, vw, v1, km = ctx.saved_tensors
    args = (dn, fq, fk, vw, v1, km, *ctx.params)
    dfq, dfk, dvw, dv1 = (_squared_backward if direct(*args) else squared_backward)(*args)
    return (dfq, dfk, dvw, None if v1 is None else dv1, None) + (None,) * len(ctx.params)


squared_forward.register_autograd(_backward, setup_context=_setup_context)
_Squared = eager_function("_Squared", _squared_forward, _setup_context, _backward)


def _warm(args: tuple, grad: bool) -> None:
    """The launches of a call of :func:`squared_forward` on ``args``, and with ``grad`` of its backward, for
    :func:`~kernel_attention.backends.triton_support.compile_check` (compiled, not run)."""
    n = _squared_forward(*args)
    if grad:
        _squared_backward(torch.empty_like(n), *args)


def _ratio(n: Tensor) -> Tensor:
    """n[..., :-1] / n[..., -1:], 0 for a row with no key (its numerator is 0 too; dividing by 1 there keeps the
    gradient finite)."""
    num, den = n[..., :-1], n[..., -1:]
    return num / torch.where(den > 0, den, torch.ones_like(den))


def triton_squared_smoother(p: Problem, tf: TileFilter, km: Tensor | None, block: int) -> Tensor:
    """The output (B, H, Tq, Dv) of ``p``, a kernel with :class:`SquaredForm`, differentiable in q, k, v and
    the kernel's parameters (module docstring); ``tf`` and ``km`` (B, H, Tk) int8 or None: the filter
    (:func:`~kernel_attention.backends.triton_filters.tile_filter`)."""
    b, h, tq, tk = p.shape
    v = p.v
    keep = None if km is None else km.view(b, h, 1, tk).bool()
    form = p.kernel.squared_form(p.q, p.k, key_log=kept_key_log(p, tf, keep))
    m = form.key_log.to(v.dtype)
    top = m.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # a slice that keeps no key
    w = torch.exp(m - top).unsqueeze(-1)                                # (B, H, Tk, 1), 0 at keys none keeps
    vw = torch.cat([v * w, w.expand(*v.shape[:-1], 1)], -1).expand(b, h, tk, v.shape[-1] + 1).contiguous()
    fq = form.q.to(v.dtype).expand(b, h, tq, form.q.shape[-1]).contiguous()
    fk = form.k.to(v.dtype).expand(b, h, tk, form.k.shape[-1]).contiguous()
    v1 = None
    if form.drop:
        if form.query_log is None:
            raise ValueError("SquaredForm with drop > 0 needs query_log: the dropped pairs lose the query's factor")
        v1 = torch.cat([v, torch.ones_like(v[..., :1])], -1).expand(b, h, tk, v.shape[-1] + 1).contiguous()
    args = (fq, fk, vw, v1, km, tf.args(), float(form.eps), float(form.drop), int(form.seed), block)
    if direct(*args):
        grad = differentiates(args)
        # what the kernels are specialised on: the tensors, the widths of the features and values, the filter's
        # kind and sparse pattern, dropout or not, the tiles (the offsets, eps, the seed and the lengths are
        # runtime scalars)
        key = ("squared", grad, fq.device, *signature(*args[:5]), fq.shape[-1], vw.shape[-1], tf.banded, tf.pattern,
               form.drop > 0, block)
        compile_check(key, lambda: _warm(args, grad))
        n = _Squared.apply(*args)
    else:
        n = squared_forward(*args)
    if not form.drop:
        return _ratio(n).to(v.dtype)
    # the kept pairs' share against the dropped pairs' per row, as squared.squared_smoother combines them
    n1, n2 = n[..., :vw.shape[-1]], n[..., vw.shape[-1]:]
    d1, d2 = n1[..., -1:], n2[..., -1:]
    tiny = torch.finfo(n.dtype).tiny
    c = (form.query_log.to(n.dtype) + top.to(n.dtype)).unsqueeze(-1)
    logit = c + d1.clamp_min(tiny).log() - d2.clamp_min(tiny).log()
    logit = torch.where(d2 > 0, torch.where(d1 > 0, logit, float("-inf")), float("inf"))
    r2 = _ratio(n2)
    return (r2 + torch.sigmoid(logit) * (_ratio(n1) - r2)).to(v.dtype)


def magnitude_keep_mask(seed: int, drop: float, shape, device=None) -> Tensor:
    """(B, H, Tq, Tk) bool: where the squared-form kernels keep a pair's magnitude for a call seeded by ``seed``
    with magnitude dropout ``drop`` (the mask they draw per tile and never store; for tests)."""
    b, h, tq, tk = shape
    keep = torch.zeros(b, h, tq, tk, dtype=torch.int8, device=device)
    block = 16
    kernels("triton_squared_kernels").magnitude_keep[(cdiv(tq, block), cdiv(tk, block), b * h)](
        keep, tq, tk, float(drop), int(seed), BM=block, BN=block)
    return keep.bool()
