r"""Shaw's clipped relative positions (Eq. 6) as fused attention on far key ranges plus a near window.

With distances clipped at c, the look-up-table term b_ij = L[i, clip(i - j, -c, c) + c] takes only
two values per query row outside the window |i - j| < c:

    b_ij = beta_past_i   = L[i, 2c]   for j <= i - c    (far past)
    b_ij = beta_future_i = L[i, 0]    for j >= i + c    (far future; not under a causal filter)

A per-row constant does not change a soft-max inside its key set, so for a block of query rows
[r0, r1) the smoother splits exactly into three key ranges:

    past     j <  r0 - c + 1       every pair has b = beta_past:    one SDPA call (rectangle, no mask)
    near     r0 - c + 1 <= j < r1 + c - 1   formed explicitly with its b_ij   (rows x (rows + 2c - 2))
    future   j >= r1 + c - 1       every pair has b = beta_future:  one SDPA call (full filter only)

merged by log-sum-exp: with a_r the range's log-normaliser (+ its beta), lse = logsumexp_r a_r,
w_r = exp(a_r - lse), out = sum_r w_r out_r.  Nothing of size T x T is formed; the far ranges run
on the fused kernel without a mask, so no work is spent on masked tiles.

Under a causal filter there is no future range, and the far past of every row is one causal SDPA call
on the shifted sequences (q[c:] against k[:T-c]), which is cheaper than a rectangle per block; the
explicit part is then only the band 0 <= i - j < c.

Backward: the flash backward of a far range, called with grad w_r dO and with the *merged* output in
place of its own, yields exactly the full problem's dS = P (dP - rowsum(dO out)) on that range
(P_ij = w_r P^r_ij), hence its dq, dk, dv.  The bias gradient of a far range is the range sum of dS,
d beta_r = w_r (dO · out_r - dO · out); the near window's dS is formed explicitly and scattered into dL.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_attention.backends.base import BACKENDS, Backend, Problem, pad_last, sdpa_features
from kernel_attention.backends.first_order import first_order
from kernel_attention.backends.policy import policy
from kernel_attention.positions.difference_index import DifferenceIndex
from kernel_attention.kernels.capabilities import sdpa_layout

__all__ = ["BandedBackend", "shaw_clip", "banded_clip", "shaw_banded"]

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

def shaw_clip(index: Tensor | DifferenceIndex, tq: int, tk: int) -> int | None:
    """c when ``index`` (B|1, Tq, Tk) is exactly clip(i - j, -c, c) + c (Shaw's table on the default
    positions of self-attention), else None."""
    if isinstance(index, DifferenceIndex):  # from its vectors: clip(a_i - c_j) + c with a_i - c_j = i - j
        return index.clip if index.clip is not None and tq == tk and index.offset() == 0 else None
    if tq != tk or index.dim() != 3:
        return None
    c = int(index[0, 0, 0])
    if c < 1:
        return None
    ar = torch.arange(tq, device=index.device)
    expected = (ar[:, None] - ar[None, :]).clamp_(-c, c).add_(c)
    return c if bool((index == expected).all()) else None


def banded_why_not(p: Problem) -> str | None:
    """None when :func:`shaw_banded` runs ``p``: Shaw's table alone on the default self-attention positions,
    a kernel with SDPA features and no key bias, a full or causal filter, no dropout, on the CPU, and a
    sequence long enough (T > 4c) for the far ranges to carry the work; else why not."""
    t = p.terms
    if p.need_weights:
        return "need_weights=True: only dense forms the (Tq, Tk) weights"
    if p.q.device.type != "cpu":
        return "the flash kernel it calls per key range is the CPU's"
    if p.dropout_p > 0:
        return "dropout acts on the weights, which are merged across key ranges"
    if (t is None or len(t.relative) != 1 or t.relative_factors or t.value or t.bias is not None
            or t.key_bias is not None or t.q_feat is not None):
        return "it runs Shaw's table (position='shaw') alone, without a value table or other terms"
    if not (p.full or p.causal):
        return f"filter {p.filter!r} is neither full nor causal"
    if sdpa_layout(p.kernel) != "features":
        return f"kernel {p.kernel.name!r} has no SDPA features without a key bias"
    b, h, tq, tk = p.shape
    logits, index = t.relative[0]
    c = shaw_clip(index, tq, tk)
    if c is None or logits.shape[-1] != 2 * c + 1:
        return "the table's index is not clip(i - j) + c on the default self-attention positions"
    if tq <= 4 * c:
        return f"T={tq} is not above 4 x clip={4 * c}, so the far key ranges would carry little of the work"
    return None


def banded_clip(p: Problem) -> int | None:
    """Shaw's clip c when :func:`shaw_banded` runs ``p`` (:func:`banded_why_not`), else None."""
    if banded_why_not(p) is not None:
        return None
    return shaw_clip(p.terms.relative[0][1], *p.shape[2:])


@BACKENDS.register("banded")
class BandedBackend(Backend):
    """Shaw's clipped table (Eq. 6): keys farther than the clip share one bias per row and run on the
    fused CPU kernel without a mask; the keys within the clip are formed explicitly (module docstring)."""

    name = "banded"
    traceable = False  # a tensor index is compared with clip(i - j) + c entry by entry

    def supports(self, p: Problem) -> str | None:
        return banded_why_not(p)

    def describe(self, p: Problem) -> str:
        c = banded_clip(p)
        far = ("one causal SDPA call on the shifted sequences" if p.causal else
               "two SDPA calls per block of rows (the keys before and after its window)")
        return (f"shaw clipped at {c}: keys farther than {c} (one bias per row) as {far}, the keys within "
                f"{c - 1} formed explicitly, merged by log-sum-exp")

    def run(self, p: Problem):
        qf, kf, scale, _ = sdpa_features(p)
        pol = policy(p.q.device)
        rows = pol.banded_rows_causal if p.causal else pol.banded_rows_full
        return shaw_banded(qf, kf, p.v, p.terms.relative[0][0].to(qf.dtype), banded_clip(p), p.causal, scale,
                           rows), None


def _blocks(t: int, c: int, causal: bool, rows: int):
    """Per block of query rows: (rows, near keys, table index clip(i - j) + c of the near pairs, the
    mask of the near pairs or None, past keys or None, future keys or None).  Causal: the near pairs
    are the band 0 <= i - j < c and the far past is not per block (one shifted causal call)."""
    step = max(rows, 2 * c)
    for r0 in range(0, t, step):
        r1 = min(t, r0 + step)
        lo, hi = max(0, r0 - c + 1), (r1 if causal else min(t, r1 + c - 1))
        rel = torch.arange(r0, r1)[:, None] - torch.arange(lo, hi)[None, :]
        if causal:
            yield slice(r0, r1), slice(lo, hi), rel.clamp(-c, c) + c, (rel >= 0) & (rel < c), None, None
        else:
            yield (slice(r0, r1), slice(lo, hi), rel.clamp(-c, c) + c, None,
                   slice(0, lo) if lo > 0 else None, slice(hi, t) if hi < t else None)


def _near_logits(qf, kf, L, scale, rows, cols, idx, keep):
    """(B, H, rows, cols) logits of the near window (-inf where the causal filter drops the key)."""
    b, h = qf.shape[0], qf.shape[1]
    s = torch.matmul(qf[..., rows, :], kf[..., cols, :].transpose(-1, -2)).mul_(scale)
    s.add_(torch.gather(L[..., rows, :].expand(b, h, -1, -1), -1, idx.to(L.device).expand(b, h, *idx.shape)))
    return s if keep is None else s.masked_fill_(~keep.to(s.device), float("-inf"))


class _ShawBanded(torch.autograd.Function):
    @staticmethod
    def forward(ctx, c: int, causal: bool, scale: float, rows: int, qf, kf, v, L):
        ctx.rows = rows
        b, h, t, dv = v.shape
        d = max(qf.shape[-1], dv)  # the CPU flash kernel wants one head size for q, k and v
        qp, kp, vp = pad_last(qf, d), pad_last(kf, d), pad_last(v, d)
        out, lse = v.new_empty(b, h, t, dv), v.new_empty(b, h, t)
        # Each far range's own output and log-normaliser (without beta), kept for the backward pass.
        sides = ("past",) if causal else ("past", "future")
        far = {side: (v.new_zeros(b, h, t, dv), v.new_full((b, h, t), float("-inf"))) for side in sides}
        shifted = causal and t > c
        if shifted:  # j <= i - c for every row i >= c
            o, l = _flash(qp[..., c:, :], kp[..., :t - c, :], vp[..., :t - c, :], 0.0, True, scale=scale)
            far["past"][0][..., c:, :], far["past"][1][..., c:] = o[..., :dv], l
        for rows, cols, idx, keep, past, future in _blocks(t, c, causal, ctx.rows):
            s = _near_logits(qf, kf, L, scale, rows, cols, idx, keep)
            a_near = torch.logsumexp(s, -1)  # the diagonal is always near: finite
            parts = [(torch.matmul(torch.exp(s - a_near.unsqueeze(-1)), v[..., cols, :]), a_near)]
            if shifted:
                parts.append((far["past"][0][..., rows, :], far["past"][1][..., rows] + L[..., rows, 2 * c]))
            for side, keys, col in (("past", past, 2 * c), ("future", future, 0)):
                if keys is None:
                    continue
                o, l = _flash(qp[..., rows, :], kp[..., keys, :], vp[..., keys, :], 0.0, False, scale=scale)
                far[side][0][..., rows, :], far[side][1][..., rows] = o[..., :dv], l
                parts.append((o[..., :dv], l + L[..., rows, col]))
            a = torch.stack([a_r for _, a_r in parts])
            lse_r = torch.logsumexp(a, 0)
            w = torch.exp(a - lse_r)
            out[..., rows, :] = sum(w[i].unsqueeze(-1) * o_r for i, (o_r, _) in enumerate(parts))
            lse[..., rows] = lse_r
        ctx.c, ctx.causal, ctx.scale, ctx.shifted = c, causal, scale, shifted
        ctx.save_for_backward(qf, kf, v, L, out, lse, *far["past"], *far.get("future", (None, None)))
        return out

    @staticmethod
    @first_order
    def backward(ctx, g):
        c, causal, scale = ctx.c, ctx.causal, ctx.scale
        qf, kf, v, L, out, lse, o_past, l_past, o_future, l_future = ctx.saved_tensors
        b, h, t, dv = v.shape
        d = max(qf.shape[-1], dv)
        qp, kp, vp = pad_last(qf, d), pad_last(kf, d), pad_last(v, d)
        g = g.contiguous()
        delta = (g * out).sum(-1)  # rowsum(dO * out): the D of the flash backward
        dq, dk, dvv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(v)
        dL = torch.zeros(b, h, t, L.shape[-1], dtype=L.dtype, device=L.device)
        if ctx.shifted:
            l_r = l_past[..., c:]
            w = torch.exp(l_r + L[..., c:, 2 * c] - lse[..., c:])
            dL[..., c:, 2 * c] = w * ((g[..., c:, :] * o_past[..., c:, :]).sum(-1) - delta[..., c:])
            gq, gk, gv = _flash_backward(pad_last(w.unsqueeze(-1) * g[..., c:, :], d), qp[..., c:, :],
                                         kp[..., :t - c, :], vp[..., :t - c, :],
                                         pad_last(out[..., c:, :], d).contiguous(), l_r.contiguous(), 0.0, True,
                                         scale=scale)
            dq[..., c:, :] += gq[..., :qf.shape[-1]]
            dk[..., :t - c, :] += gk[..., :kf.shape[-1]]
            dvv[..., :t - c, :] += gv[..., :dv]
        for rows, cols, idx, keep, past, future in _blocks(t, c, causal, ctx.rows):
            g_r, delta_r, lse_r = g[..., rows, :], delta[..., rows], lse[..., rows]
            for keys, col, o_far, l_far in ((past, 2 * c, o_past, l_past), (future, 0, o_future, l_future)):
                if keys is None:
                    continue
                l_r = l_far[..., rows]
                w = torch.exp(l_r + L[..., rows, col] - lse_r)
                dL[..., rows, col] = w * ((g_r * o_far[..., rows, :]).sum(-1) - delta_r)
                gq, gk, gv = _flash_backward(pad_last(w.unsqueeze(-1) * g_r, d), qp[..., rows, :], kp[..., keys, :],
                                             vp[..., keys, :], pad_last(out[..., rows, :], d).contiguous(),
                                             l_r.contiguous(), 0.0, False, scale=scale)
                dq[..., rows, :] += gq[..., :qf.shape[-1]]
                dk[..., keys, :] += gk[..., :kf.shape[-1]]
                dvv[..., keys, :] += gv[..., :dv]
            p = _near_logits(qf, kf, L, scale, rows, cols, idx, keep).sub_(lse_r.unsqueeze(-1)).exp_()
            dvv[..., cols, :] += torch.matmul(p.transpose(-1, -2), g_r)
            ds = torch.matmul(g_r, v[..., cols, :].transpose(-1, -2)).sub_(delta_r.unsqueeze(-1)).mul_(p)
            dq[..., rows, :] += torch.matmul(ds, kf[..., cols, :]).mul_(scale)
            dk[..., cols, :] += torch.matmul(ds.transpose(-1, -2), qf[..., rows, :]).mul_(scale)
            dL[..., rows, :].scatter_add_(-1, idx.to(ds.device).expand(b, h, *idx.shape), ds)
        if L.shape[0] == 1 and b != 1:
            dL = dL.sum(0, keepdim=True)
        return None, None, None, None, dq, dk, dvv, dL


def shaw_banded(qf: Tensor, kf: Tensor, v: Tensor, L: Tensor, c: int, causal: bool, scale: float,
                rows: int = 64) -> Tensor:
    """softmax(scale · qf kf^T + L[i, clip(i - j) + c]) v over all keys (``causal``: j <= i).

    qf, kf (B, H, T, D'), v (B, H, T, Dv), L (B|1, H, T, 2c + 1) the table logits; returns (B, H, T, Dv).
    CPU (PyTorch's flash kernel); see the module docstring for the decomposition."""
    return _ShawBanded.apply(c, causal, scale, rows, qf, kf, v, L)
