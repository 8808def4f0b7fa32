r"""The implicit kernels as k / sum k, without a logarithm or an exponential per pair.

The implicit kernels of Song et al. (2021, Eqs. 12-16) are, per head (:class:`SquaredForm`),

    k(q_i, k_j) = c_i · (s_ij^2 + eps) · exp(m_j),     s_ij = <phi_q(q_i), phi(k_j)>

(phi_q = phi / n, c_i = exp(m(q_i)) constant along a row).  Their soft-max of log k is k / sum_j k, so
with w_j = exp(m_j - max_kept m) and V' = [w ∘ v, w] (Tk, Dv + 1), for each block of query rows R and
the span C of keys they may see (filter M):

    N_R = P V'_C,   P = (s_RC^2 + eps) ⊙ M_RC,     out_R = N_R[:, :Dv] / N_R[:, Dv]

One product of width F (= 2R random features) for s, one of width Dv + 1 for N and a square per pair:
the blocked soft-max path instead forms log(s^2 + eps) + m per pair and exponentiates it again.  The
backward pass recomputes s per block:

    dV'_C += P^T dN_R,   dP = dN_R V'_C^T,   dS = 2 s ⊙ dP ⊙ M,
    dphi_q[R] = dS phi[C],   dphi[C] += dS^T phi_q[R]

V' and the division are formed outside the block loop with autograd (their cost is linear in T).  A
query whose filtered set is empty has N_R = 0 and gets a zero output and zero gradient.

**Range.**  w_j underflows where m_j lies far below the largest kept m.  :func:`key_spread` measures
max - min of m over the keys some query keeps; :func:`squared_route` takes this path only while it is
at most ``MAX_SPREAD`` = 40 (then every kept w is at least e^-40 and the smallest kernel value, about
eps · e^-40 = 4e-23, is a normal float32 or bfloat16 number) and otherwise leaves the soft-max path,
which has no such limit (Lp magnitudes with small p, whose norms grow like D^(2/p), need it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_attention.backends.base import Problem
from kernel_attention.kernels import SquaredForm

__all__ = ["MAX_SPREAD", "masked_key_log", "key_spread", "squared_route", "squared_smoother"]

#: Largest max - min of the per-key log factor over kept keys that this path accepts (module docstring).
MAX_SPREAD = 40.0

#: dtypes whose exponent range holds eps · e^-MAX_SPREAD (float16's smallest normal is 6e-5).
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def masked_key_log(key_log: Tensor, keep: Tensor | None) -> Tensor:
    """``key_log`` (B, H, Tk) with -inf at the keys that no query keeps (``keep`` broadcastable to
    (B, H, Tq, Tk)): the factor's range, and the maximum that :func:`squared_smoother` subtracts, are
    over the kept keys alone."""
    if keep is None:
        return key_log
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    return key_log.masked_fill(~keep.any(-2), float("-inf"))


def key_spread(m: Tensor) -> float:
    """max - min of a masked key log ``m`` (B, H, Tk) over its finite entries, the largest over
    (B, H); 0 where a (B, H) slice keeps no key."""
    m = m.detach()
    hi = m.amax(-1)
    lo = torch.where(torch.isinf(m), torch.full_like(m, float("inf")), m).amin(-1)
    spread = torch.where(torch.isinf(hi), torch.zeros_like(hi), hi - lo)
    return float(spread.max()) if spread.numel() else 0.0


def squared_route(p: Problem) -> tuple[Tensor | None, str | None]:
    """(m, None) when ``p`` can run on this path, m = :func:`masked_key_log` of the kernel's per-key
    log factor (with its gradient; pass it to :meth:`Kernel.squared_form`); (None, "") when the kernel
    has no :class:`SquaredForm`; otherwise (None, why not, in words), which the ``fused`` backend adds
    to its description."""
    if not p.kernel.has_squared_form():
        return None, ""
    t = p.terms
    if p.q.device.type != "cpu":
        return None, "measured on the CPU only"
    if t is not None and (t.relative or t.relative_factors or t.bias is not None or t.value
                          or t.key_bias is not None or t.q_feat is not None):
        return None, "positional terms enter log k"
    if p.dropout_p > 0:
        return None, "dropout acts on the soft-max weights"
    if getattr(p.kernel, "drops_magnitude", False):
        return None, "magnitude dropout acts on each pair's log k"
    if p.q.dtype not in DTYPES:
        return None, f"dtype {p.q.dtype} cannot hold eps · e^-{MAX_SPREAD:g}"
    m = masked_key_log(p.kernel.squared_key_log(p.k), p.keep)
    spread = key_spread(m)
    if spread > MAX_SPREAD:
        return None, (f"the per-key log factor spans {spread:.3g} (more than {MAX_SPREAD:g}), so its "
                      f"exponentials would underflow")
    return m, None


def _block_weights(fq: Tensor, fk: Tensor, keep: Tensor | None, eps: float, rows: slice, cols: slice):
    """(s, P, the block's mask or None) for one block."""
    s = torch.matmul(fq[..., rows, :], fk[..., cols, :].transpose(-1, -2))
    p = torch.addcmul(s.new_full((), eps), s, s)  # s^2 + eps in one pass
    kb = None
    if keep is not None:
        kb = keep[..., rows, cols]
        if bool(kb.all()):
            kb = None
        else:
            p.masked_fill_(~kb, 0.0)
    return s, p, kb


class _SquaredProduct(torch.autograd.Function):
    """N = ((phi_q phi^T)^2 + eps) ⊙ M  V', block by block (module docstring): (B, H, Tq, Dv + 1)."""

    @staticmethod
    def forward(ctx, blocks, keep, eps, fq, fk, vw):
        b, h, tq = fq.shape[0], fq.shape[1], fq.shape[2]
        out = vw.new_zeros(max(b, vw.shape[0]), h, tq, vw.shape[-1])
        for r0, r1, lo, hi in blocks:
            if hi <= lo:
                continue
            rows, cols = slice(r0, r1), slice(lo, hi)
            _, p, _ = _block_weights(fq, fk, keep, eps, rows, cols)
            out[..., rows, :] = torch.matmul(p, vw[..., cols, :])
        ctx.blocks, ctx.keep, ctx.eps = blocks, keep, eps
        ctx.save_for_backward(fq, fk, vw)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the backward below is not itself differentiated
    def backward(ctx, g):
        fq, fk, vw = ctx.saved_tensors
        dfq, dfk, dvw = torch.zeros_like(fq), torch.zeros_like(fk), torch.zeros_like(vw)
        for r0, r1, lo, hi in ctx.blocks:
            if hi <= lo:
                continue
            rows, cols = slice(r0, r1), slice(lo, hi)
            s, p, kb = _block_weights(fq, fk, ctx.keep, ctx.eps, rows, cols)
            gr = g[..., rows, :]
            dvw[..., cols, :] += torch.matmul(p.transpose(-1, -2), gr)
            ds = torch.matmul(gr * 2.0, vw[..., cols, :].transpose(-1, -2)).mul_(s)  # 2 on the (rows, Dv+1) side
            if kb is not None:
                ds.masked_fill_(~kb, 0.0)
            dfq[..., rows, :] = torch.matmul(ds, fk[..., cols, :])
            dfk[..., cols, :] += torch.matmul(ds.transpose(-1, -2), fq[..., rows, :])
        return None, None, None, dfq, dfk, dvw


def squared_smoother(form: SquaredForm, v: Tensor, keep: Tensor | None, blocks: list) -> Tensor:
    """The smoother of a kernel in :class:`SquaredForm`: v (B, H, Tk, Dv), ``keep`` the 4-d filter mask
    (or None) and ``blocks`` [(r0, r1, lo, hi)] from :func:`~kernel_attention.backends.chunked.plan_blocks`.
    Returns (B, H, Tq, Dv).  ``form.key_log`` must be masked (:func:`masked_key_log`) and its
    :func:`key_spread` at most ``MAX_SPREAD``: :func:`squared_route` checks both."""
    m = form.key_log.to(v.dtype)
    top = m.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # a slice that keeps no key
    w = torch.exp(m - top).unsqueeze(-1)                                # (B, H, Tk, 1), 0 at dropped keys
    vw = torch.cat([v * w, w.expand(*v.shape[:-1], 1)], -1)
    n = _SquaredProduct.apply(blocks, keep, form.eps, form.q.to(v.dtype), form.k.to(v.dtype), vw)
    num, den = n[..., :-1], n[..., -1:]
    # den = 0 only where no key is kept (then num = 0); dividing by 1 there keeps the gradient finite
    return num / torch.where(den > 0, den, torch.ones_like(den))
