r"""The ``triton`` backend's path for a kernel in squared form (the implicit kernels, :class:`SquaredForm`):

    k(q_i, k_j) = c_i · (<q'_i, k'_j>^2 + eps) · exp(m_j),     out_i = sum_j k_ij v_j / sum_j k_ij

normalised as k / sum k (no soft-max), c_i cancelling.  As on the CPU's ``squared`` backend
(:mod:`~kernel_attention.backends.squared`), with w_j = exp(m_j - max_kept m) <= 1 and V' = [w ∘ v, w]
(B, H, Tk, Dv + 1) formed with torch ops (their autograd carries the gradient to m, the key log):

    N_i = sum_j (s_ij^2 + eps) M_ij V'_j  (B, H, Tq, Dv + 1) float32,     out_i = N_i[:Dv] / N_i[Dv]

(0 for a row with no kept key).  N and its gradients for q', k', V' are Triton kernels over tiles
(:mod:`~kernel_attention.backends.triton_squared_kernels`), registered as two operators with fake
implementations (``kernel_attention::triton_squared_forward``, ``::triton_squared_backward``); no (Tq, Tk)
tensor is formed.  The filter (full, causal, local, each with or without padding) is the one of the
exp-family kernels (:func:`~kernel_attention.backends.triton_flash.triton_why_not`), with the same tile
skipping.

**Range.**  m is masked to the keys some query keeps and its spread (max - min) must be at most
:data:`~kernel_attention.backends.squared.MAX_SPREAD`, as on the CPU path: the check reads the spread back
to the host, so it is not made while ``torch.compile`` traces (the path refuses there).  float16 is refused
(its exponent range does not hold eps · e^-MAX_SPREAD).  Magnitude dropout (training with
``magnitude_dropout`` > 0) is not drawn in these kernels.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from kernel_attention.backends.base import Problem
from kernel_attention.backends.squared import MAX_SPREAD, key_spread
from kernel_attention.kernels.capabilities import has_squared_form

__all__ = ["squared_why_not", "kept_key_log", "squared_forward", "squared_backward", "triton_squared_smoother"]

FULL, CAUSAL, LOCAL = 0, 1, 2  # the sequence filter (triton_kernels' MODE)
_DTYPES = (torch.float32, torch.bfloat16)
_KERNELS = None


def _kernels():
    """The kernel module, imported on first use (TRITON_INTERPRET is read then, as for triton_kernels)."""
    global _KERNELS
    if _KERNELS is None:
        from kernel_attention.backends import triton_squared_kernels

        _KERNELS = triton_squared_kernels
    return _KERNELS


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, (n - 1).bit_length()))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kept_key_log(p: Problem, mode: int, km: Tensor | None) -> Tensor:
    """The kernel's per-key log factor m (B, H, Tk), -inf at the keys no query keeps under the sequence filter
    ``mode`` and the key mask ``km`` (B|1, H|1, 1, Tk) bool or None; formed from the key positions alone, no
    (Tq, Tk) mask."""
    b, h, tq, tk = p.shape
    m = p.kernel.squared_key_log(p.k).expand(b, h, tk)
    j = torch.arange(tk, device=m.device)
    kept = torch.ones(tk, dtype=torch.bool, device=m.device) if tq > 0 else torch.zeros_like(j, dtype=torch.bool)
    if mode == LOCAL:
        off, win = tk - tq, p.filter.window
        kept = kept & (j >= off - win) & (j <= tq - 1 + off + win)
    if mode == CAUSAL:
        kept = kept & (j <= tq - 1 + tk - tq)
    if km is not None:
        kept = kept & km.reshape(km.shape[0], km.shape[1], tk)
    return m.masked_fill(~kept, float("-inf"))


def squared_why_not(p: Problem, mode: int, km: Tensor | None) -> str | None:
    """None when the squared path runs ``p`` (a kernel with :class:`SquaredForm`, the filter already checked);
    otherwise why not."""
    t = p.terms
    if t is not None and (t.relative or t.relative_factors or t.bias is not None or t.value
                          or t.key_bias is not None or t.q_feat is not None):
        return "the squared form (implicit kernels) takes no positional terms: they enter log k"
    if getattr(p.kernel, "drops_magnitude", False):
        return ("magnitude dropout (training with magnitude_dropout > 0) is not drawn in its squared-form "
                "kernels; use eval mode, magnitude_dropout=0 or backend='squared'")
    if p.q.dtype not in _DTYPES:
        return f"dtype {p.q.dtype}: the squared form takes float32 or bfloat16 (eps · e^-{MAX_SPREAD:g} underflows)"
    if torch.compiler.is_compiling():
        return "the squared form's key-log range is read back to the host, which torch.compile does not trace"
    spread = key_spread(kept_key_log(p, mode, km))
    if spread > MAX_SPREAD:
        return (f"the per-key log factor spans {spread:.3g} (more than {MAX_SPREAD:g}), so its exponentials "
                f"would underflow")
    return None


# The kernels as two operators with fake implementations.  Inputs are contiguous: fq (B, H, Tq, F), fk (B, H,
# Tk, F), vw (B, H, Tk, W) of one dtype; km (B, H, Tk) int8 or None; n and dn (B, H, Tq, W) float32.

def _launch(fq, fk, vw, km, mode, off, win, eps, block) -> dict:
    return dict(Tq=fq.shape[2], Tk=fk.shape[2], F=fq.shape[-1], W=vw.shape[-1], eps=eps, OFF=off, WIN=win,
                MODE=mode, HAS_KM=km is not None, PREC="ieee" if fq.dtype == torch.float32 else "tf32",
                BM=block, BN=block, BF=_pow2(fq.shape[-1]), BW=_pow2(vw.shape[-1]),
                num_warps=8 if block > 64 else 4)


@torch.library.custom_op("kernel_attention::triton_squared_forward", mutates_args=())
def squared_forward(fq: Tensor, fk: Tensor, vw: Tensor, km: Optional[Tensor], mode: int, off: int, win: int,
                    eps: float, block: int) -> Tensor:
    """N (B, H, Tq, W) float32: N_i = sum_j (<fq_i, fk_j>^2 + eps) M_ij vw_j."""
    b, h, tq, _ = fq.shape
    n = torch.empty(b, h, tq, vw.shape[-1], dtype=torch.float32, device=fq.device)
    _kernels().squared_forward[(_cdiv(tq, block), b * h)](
        fq, fk, vw, fq if km is None else km, n, **_launch(fq, fk, vw, km, mode, off, win, eps, block))
    return n


@squared_forward.register_fake
def _(fq, fk, vw, km, mode, off, win, eps, block):
    b, h, tq, _ = fq.shape
    return fq.new_empty(b, h, tq, vw.shape[-1], dtype=torch.float32)


@torch.library.custom_op("kernel_attention::triton_squared_backward", mutates_args=())
def squared_backward(dn: Tensor, fq: Tensor, fk: Tensor, vw: Tensor, km: Optional[Tensor], mode: int, off: int,
                     win: int, eps: float, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """(dfq, dfk, dvw), the gradients of :func:`squared_forward`'s inputs given dN."""
    kern = _kernels()
    b, h, tq, _ = fq.shape
    tk = fk.shape[2]
    dn = dn.float().contiguous()
    args = _launch(fq, fk, vw, km, mode, off, win, eps, block)
    kmp = fq if km is None else km
    dfq, dfk, dvw = torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(vw)
    kern.squared_backward_kv[(_cdiv(tk, block), b * h)](fq, fk, vw, kmp, dn, dfk, dvw, **args)
    kern.squared_backward_q[(_cdiv(tq, block), b * h)](fq, fk, vw, kmp, dn, dfq, **args)
    return dfq, dfk, dvw


@squared_backward.register_fake
def _(dn, fq, fk, vw, km, mode, off, win, eps, block):
    return torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(vw)


def _setup_context(ctx, inputs, output):
    fq, fk, vw, km, *params = inputs
    ctx.params = params
    ctx.save_for_backward(fq, fk, vw, km)


def _backward(ctx, dn):
    fq, fk, vw, km = ctx.saved_tensors
    dfq, dfk, dvw = squared_backward(dn, fq, fk, vw, km, *ctx.params)
    return (dfq, dfk, dvw, None) + (None,) * len(ctx.params)


squared_forward.register_autograd(_backward, setup_context=_setup_context)


def triton_squared_smoother(p: Problem, mode: int, km: Tensor | None, block: int) -> Tensor:
    """The output (B, H, Tq, Dv) of ``p``, a kernel with :class:`SquaredForm`, differentiable in q, k, v and
    the kernel's parameters (module docstring); ``mode`` and ``km`` (B|1, H|1, 1, Tk) bool or None: the filter
    (:func:`~kernel_attention.backends.triton_flash._filter`)."""
    b, h, tq, tk = p.shape
    v = p.v
    form = p.kernel.squared_form(p.q, p.k, key_log=kept_key_log(p, mode, km))
    m = form.key_log.to(v.dtype)
    top = m.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # a slice that keeps no key
    w = torch.exp(m - top).unsqueeze(-1)                                # (B, H, Tk, 1), 0 at keys none keeps
    vw = torch.cat([v * w, w.expand(*v.shape[:-1], 1)], -1).expand(b, h, tk, v.shape[-1] + 1).contiguous()
    fq = form.q.to(v.dtype).expand(b, h, tq, form.q.shape[-1]).contiguous()
    fk = form.k.to(v.dtype).expand(b, h, tk, form.k.shape[-1]).contiguous()
    if km is not None:
        km = km.expand(b, h, 1, tk).reshape(b, h, tk).to(torch.int8).contiguous()
    n = squared_forward(fq, fk, vw, km, mode, tk - tq, p.filter.window if mode == LOCAL else 0, float(form.eps),
                        block)
    num, den = n[..., :-1], n[..., -1:]
    # 0 for a row with no kept key (then num = 0 too; dividing by 1 there keeps the gradient finite)
    return (num / torch.where(den > 0, den, torch.ones_like(den))).to(v.dtype)
