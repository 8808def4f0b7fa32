r"""Triton kernels of the ``triton`` backend for a kernel in squared form (the implicit kernels): the product

    N_i = sum_j P_ij V'_j,     P_ij = (s_ij^2 + eps) · M_ij,     s_ij = <q'_i, k'_j>

over tiles of BM query rows and BN keys, accumulated in float32, with q' (B·H, Tq, F), k' (B·H, Tk, F),
V' = [w ∘ v, w] (B·H, Tk, W), W = Dv + 1, and M the filter (``MODE`` and ``HAS_KM`` as in
:mod:`~kernel_attention.backends.triton_kernels`, whose tile ranges and pair masks these kernels share).  No
running maximum: the per-key factor w <= 1 is folded into V' by the caller, and P >= 0 is bounded by the
features.  N is (B·H, Tq, W) float32; the ratio N[:, :Dv] / N[:, Dv] is formed by the caller.

Backward, with dN (B·H, Tq, W) float32 and P, s recomputed per tile:

* ``squared_backward_kv`` (per key tile): dV'_j = sum_i P_ij dN_i, dk'_j = sum_i dS_ij q'_i;
* ``squared_backward_q`` (per query tile): dq'_i = sum_j dS_ij k'_j;

with dS_ij = 2 s_ij (dN_i · V'_j) M_ij.  Tiles outside the filter (and key tiles of padding alone) are
skipped, partial tiles masked per pair.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernel_attention.backends.triton_kernels import _keep, _key_mask, _key_range, _query_range, _tile

__all__ = ["squared_forward", "squared_backward_kv", "squared_backward_q"]


@triton.jit
def _pairs(fq, fk, offs_m, offs_n, Tq, Tk, OFF, WIN, km, eps, MODE: tl.constexpr, HAS_KM: tl.constexpr,
           PREC: tl.constexpr):
    """(s, P, keep) of one tile, each (BM, BN): s = q' k'^T in float32, P = s^2 + eps where kept, else 0."""
    s = tl.dot(fq, tl.trans(fk), input_precision=PREC)
    keep = _keep(offs_m, offs_n, Tq, Tk, OFF, WIN, km, MODE, HAS_KM)
    return s, tl.where(keep, s * s + eps, 0.0), keep


@triton.jit
def squared_forward(FQ, FK, VW, KM, N, Tq, Tk, F, W, eps, OFF, WIN,
                    MODE: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BF: tl.constexpr, BW: tl.constexpr):
    """N (B·H, Tq, W) for one tile of BM query rows; grid (cdiv(Tq, BM), B·H)."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1).to(tl.int64)
    offs_m = m0 + tl.arange(0, BM)
    df = tl.arange(0, BF)
    dw = tl.arange(0, BW)
    rows = offs_m < Tq
    fq = _tile(FQ, bh, offs_m, rows, Tq, F, df)
    acc = tl.zeros([BM, BW], tl.float32)
    lo, hi = _key_range(m0, Tk, OFF, WIN, BM, BN, MODE)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        cols = offs_n < Tk
        km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
        if tl.max(km.to(tl.int32), 0) > 0:  # a key tile with no kept key (all padding) is skipped
            fk = _tile(FK, bh, offs_n, cols, Tk, F, df)
            vw = _tile(VW, bh, offs_n, cols, Tk, W, dw)
            s, p, keep = _pairs(fq, fk, offs_m, offs_n, Tq, Tk, OFF, WIN, km, eps, MODE, HAS_KM, PREC)
            acc += tl.dot(p.to(vw.dtype), vw, input_precision=PREC)
    tl.store(N + bh * Tq * W + offs_m[:, None] * W + dw[None, :], acc, mask=rows[:, None] & (dw[None, :] < W))


@triton.jit
def squared_backward_kv(FQ, FK, VW, KM, DN, DFK, DVW, Tq, Tk, F, W, eps, OFF, WIN,
                        MODE: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, BF: tl.constexpr, BW: tl.constexpr):
    """dk' (B·H, Tk, F) and dV' (B·H, Tk, W) for one tile of BN keys; grid (cdiv(Tk, BN), B·H)."""
    n0 = tl.program_id(0) * BN
    bh = tl.program_id(1).to(tl.int64)
    offs_n = n0 + tl.arange(0, BN)
    df = tl.arange(0, BF)
    dw = tl.arange(0, BW)
    cols = offs_n < Tk
    fk = _tile(FK, bh, offs_n, cols, Tk, F, df)
    vw = _tile(VW, bh, offs_n, cols, Tk, W, dw).to(tl.float32)
    km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
    acc_k = tl.zeros([BN, BF], tl.float32)
    acc_v = tl.zeros([BN, BW], tl.float32)
    lo, hi = _query_range(n0, Tq, OFF, WIN, BM, BN, MODE)
    if tl.max(km.to(tl.int32), 0) == 0:  # no real key in the tile: nothing to visit
        hi = lo
    for m0 in range(lo, hi, BM):
        offs_m = m0 + tl.arange(0, BM)
        rows = offs_m < Tq
        fq = _tile(FQ, bh, offs_m, rows, Tq, F, df)
        dn = _tile(DN, bh, offs_m, rows, Tq, W, dw)
        s, p, keep = _pairs(fq, fk, offs_m, offs_n, Tq, Tk, OFF, WIN, km, eps, MODE, HAS_KM, PREC)
        acc_v += tl.dot(tl.trans(p), dn, input_precision=PREC)
        dp = tl.dot(dn, tl.trans(vw), input_precision=PREC)
        ds = tl.where(keep, 2.0 * s * dp, 0.0)
        acc_k += tl.dot(tl.trans(ds.to(fq.dtype)), fq, input_precision=PREC)
    tl.store(DFK + bh * Tk * F + offs_n[:, None] * F + df[None, :], acc_k.to(DFK.dtype.element_ty),
             mask=cols[:, None] & (df[None, :] < F))
    tl.store(DVW + bh * Tk * W + offs_n[:, None] * W + dw[None, :], acc_v.to(DVW.dtype.element_ty),
             mask=cols[:, None] & (dw[None, :] < W))


@triton.jit
def squared_backward_q(FQ, FK, VW, KM, DN, DFQ, Tq, Tk, F, W, eps, OFF, WIN,
                       MODE: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BF: tl.constexpr, BW: tl.constexpr):
    """dq' (B·H, Tq, F) for one tile of BM query rows; grid (cdiv(Tq, BM), B·H)."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1).to(tl.int64)
    offs_m = m0 + tl.arange(0, BM)
    df = tl.arange(0, BF)
    dw = tl.arange(0, BW)
    rows = offs_m < Tq
    fq = _tile(FQ, bh, offs_m, rows, Tq, F, df)
    dn = _tile(DN, bh, offs_m, rows, Tq, W, dw)
    acc_q = tl.zeros([BM, BF], tl.float32)
    lo, hi = _key_range(m0, Tk, OFF, WIN, BM, BN, MODE)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        cols = offs_n < Tk
        km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
        if tl.max(km.to(tl.int32), 0) > 0:
            fk = _tile(FK, bh, offs_n, cols, Tk, F, df)
            vw = _tile(VW, bh, offs_n, cols, Tk, W, dw).to(tl.float32)
            s, p, keep = _pairs(fq, fk, offs_m, offs_n, Tq, Tk, OFF, WIN, km, eps, MODE, HAS_KM, PREC)
            dp = tl.dot(dn, tl.trans(vw), input_precision=PREC)
            ds = tl.where(keep, 2.0 * s * dp, 0.0)
            acc_q += tl.dot(ds.to(fk.dtype), fk, input_precision=PREC)
    tl.store(DFQ + bh * Tq * F + offs_m[:, None] * F + df[None, :], acc_q.to(DFQ.dtype.element_ty),
             mask=rows[:, None] & (df[None, :] < F))
