r"""Triton kernels of the ``triton`` backend for a kernel in squared form (the implicit kernels): the product

    N_i = sum_j P_ij V'_j,     P_ij = (s_ij^2 + eps) · M_ij,     s_ij = <q'_i, k'_j>

over tiles of BM query rows and BN keys, accumulated in float32, with q' (B·H, Tq, F), k' (B·H, Tk, F),
V' = [w ∘ v, w] (B·H, Tk, W), W = Dv + 1, and M the filter (``MODE``, ``PAT`` and ``HAS_KM`` as in
:mod:`~kernel_attention.backends.triton_tiles`, whose tile ranges, tile skipping and pair masks the flash
kernels share).  No running maximum: the per-key factor w <= 1 is folded into V' by the caller, and P >= 0 is bounded by
the features.  N is (B·H, Tq, W) float32; the ratio N[:, :Dv] / N[:, Dv] is formed by the caller.

**Magnitude dropout** (``HAS_DROP``): the pair keeps its magnitude where D_ij = [u_ij >= drop], u_ij uniform in
[0, 1) from Philox seeded by the call's ``seed`` at the pair's element offset (b·H + h)·Tq·Tk + i·Tk + j
(:func:`_magnitude_keep`), so every tile of every pass draws the same D without storing it.  The kept and the
dropped pairs are summed apart, with V' and V1 = [v, 1] (B·H, Tk, W):

    N1_i = sum_j P_ij D_ij V'_j,   N2_i = sum_j P_ij (1 - D_ij) V1_j,   N = [N1, N2] (B·H, Tq, 2W)

and combined by the caller (:mod:`~kernel_attention.backends.squared`'s formula).

Backward, with dN (B·H, Tq, W or 2W) float32 and P, s, D recomputed per tile:

* ``squared_backward_kv`` (per key tile): dV'_j = sum_i P_ij D_ij dN1_i, dV1_j = sum_i P_ij (1 - D_ij) dN2_i,
  dk'_j = sum_i dS_ij q'_i;
* ``squared_backward_q`` (per query tile): dq'_i = sum_j dS_ij k'_j;

with dS_ij = 2 s_ij dP_ij M_ij, dP_ij = D_ij dN1_i · V'_j + (1 - D_ij) dN2_i · V1_j (D = 1 without dropout).
Tiles outside the filter (and key tiles of padding alone) are skipped, partial tiles masked per pair.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernel_attention.backends.triton_tiles import (_keep, _key_mask, _key_range, _query_range, _store_tile, _tile,
                                                    _visits)

__all__ = ["squared_forward", "squared_backward_kv", "squared_backward_q", "magnitude_keep"]


@triton.jit
def _magnitude_keep(seed, bh, offs_m, offs_n, Tq, Tk, drop):
    """(BM, BN) bool D: where the pair keeps its magnitude, u >= drop for u = Philox's uniform draw at the pair's
    element offset in (B·H, Tq, Tk), so any tile order draws the same mask."""
    offs = (bh * Tq + offs_m[:, None]) * Tk + offs_n[None, :]
    return tl.rand(seed, offs) >= drop


@triton.jit
def _columns(X, bh, offs, valid, T, NW, W, d, start):
    """Columns [start, start + W) of rows ``offs`` of the (B·H, T, NW) tensor X for program ``bh``: a (len(offs),
    len(d)) tile, 0 where a row is not ``valid`` or a column is past W (dN's halves dN1, dN2)."""
    return tl.load(X + bh * T * NW + offs[:, None] * NW + start + d[None, :], mask=valid[:, None] & (d[None, :] < W),
                   other=0.0)


@triton.jit
def _pairs(fq, fk, bh, offs_m, offs_n, Tq, Tk, OFF, DLO, DHI, STRIDE, SC, km, eps, drop, seed,
           MODE: tl.constexpr, PAT: tl.constexpr, HAS_KM: tl.constexpr, HAS_DROP: tl.constexpr,
           PREC: tl.constexpr):
    """(s, P1, P2, keep, D) of one tile, each (BM, BN): s = q' k'^T in float32; P1 = s^2 + eps where the filter
    keeps the pair and (with HAS_DROP) D keeps its magnitude, else 0; P2 = s^2 + eps where the filter keeps it and D
    drops it (0 without HAS_DROP)."""
    s = tl.dot(fq, tl.trans(fk), input_precision=PREC)
    keep = _keep(offs_m, offs_n, Tq, Tk, OFF, DLO, DHI, STRIDE, SC, km, MODE, PAT, HAS_KM)
    p = tl.where(keep, s * s + eps, 0.0)
    d = keep
    if HAS_DROP:
        d = _magnitude_keep(seed, bh, offs_m, offs_n, Tq, Tk, drop)
    p1 = tl.where(d, p, 0.0)
    return s, p1, p - p1, keep, d


@triton.jit
def squared_forward(FQ, FK, VW, V1, KM, N, Tq, Tk, F, W, eps, drop, seed, OFF, DLO, DHI, STRIDE, SC,
                    MODE: tl.constexpr, PAT: tl.constexpr, HAS_KM: tl.constexpr, HAS_DROP: tl.constexpr,
                    PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BF: tl.constexpr, BW: tl.constexpr):
    """N (B·H, Tq, W), or [N1, N2] (B·H, Tq, 2W) with HAS_DROP, for one tile of BM query rows; grid
    (cdiv(Tq, BM), B·H)."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1).to(tl.int64)
    offs_m = m0 + tl.arange(0, BM)
    df = tl.arange(0, BF)
    dw = tl.arange(0, BW)
    rows = offs_m < Tq
    nw = W
    if HAS_DROP:  # N = [N1, N2]
        nw = 2 * W
    fq = _tile(FQ, bh, offs_m, rows, Tq, F, df)
    acc = tl.zeros([BM, BW], tl.float32)
    acc2 = tl.zeros([BM, BW], tl.float32)
    lo, hi = _key_range(m0, Tk, OFF, DLO, DHI, BM, BN, MODE)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        cols = offs_n < Tk
        km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
        if (PAT == 0 and not HAS_KM) or _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
            fk = _tile(FK, bh, offs_n, cols, Tk, F, df)
            vw = _tile(VW, bh, offs_n, cols, Tk, W, dw)
            s, p1, p2, keep, d = _pairs(fq, fk, bh, offs_m, offs_n, Tq, Tk, OFF, DLO, DHI, STRIDE, SC, km, eps, drop,
                                        seed, MODE, PAT, HAS_KM, HAS_DROP, PREC)
            acc += tl.dot(p1.to(vw.dtype), vw, input_precision=PREC)
            if HAS_DROP:
                v1 = _tile(V1, bh, offs_n, cols, Tk, W, dw)
                acc2 += tl.dot(p2.to(v1.dtype), v1, input_precision=PREC)
    out = N + bh * Tq * nw + offs_m[:, None] * nw + dw[None, :]
    tl.store(out, acc, mask=rows[:, None] & (dw[None, :] < W))
    if HAS_DROP:
        tl.store(out + W, acc2, mask=rows[:, None] & (dw[None, :] < W))


@triton.jit
def squared_backward_kv(FQ, FK, VW, V1, KM, DN, DFK, DVW, DV1, Tq, Tk, F, W, eps, drop, seed, OFF, DLO, DHI,
                        STRIDE, SC, MODE: tl.constexpr, PAT: tl.constexpr, HAS_KM: tl.constexpr,
                        HAS_DROP: tl.constexpr, PREC: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, BF: tl.constexpr, BW: tl.constexpr):
    """dk' (B·H, Tk, F), dV' (B·H, Tk, W) and, with HAS_DROP, dV1 (B·H, Tk, W) for one tile of BN keys; grid
    (cdiv(Tk, BN), B·H)."""
    n0 = tl.program_id(0) * BN
    bh = tl.program_id(1).to(tl.int64)
    offs_n = n0 + tl.arange(0, BN)
    df = tl.arange(0, BF)
    dw = tl.arange(0, BW)
    cols = offs_n < Tk
    nw = W
    if HAS_DROP:  # dN = [dN1, dN2]
        nw = 2 * W
    fk = _tile(FK, bh, offs_n, cols, Tk, F, df)
    vw = _tile(VW, bh, offs_n, cols, Tk, W, dw).to(tl.float32)
    v1 = vw
    if HAS_DROP:
        v1 = _tile(V1, bh, offs_n, cols, Tk, W, dw).to(tl.float32)
    km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
    acc_k = tl.zeros([BN, BF], tl.float32)
    acc_v = tl.zeros([BN, BW], tl.float32)
    acc_v1 = tl.zeros([BN, BW], tl.float32)
    lo, hi = _query_range(n0, Tq, OFF, DLO, DHI, BM, BN, MODE)
    for m0 in range(lo, hi, BM):
        if (PAT == 0 and not HAS_KM) or _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
            offs_m = m0 + tl.arange(0, BM)
            rows = offs_m < Tq
            fq = _tile(FQ, bh, offs_m, rows, Tq, F, df)
            dn = _columns(DN, bh, offs_m, rows, Tq, nw, W, dw, 0)
            s, p1, p2, keep, d = _pairs(fq, fk, bh, offs_m, offs_n, Tq, Tk, OFF, DLO, DHI, STRIDE, SC, km, eps, drop,
                                        seed, MODE, PAT, HAS_KM, HAS_DROP, PREC)
            acc_v += tl.dot(tl.trans(p1), dn, input_precision=PREC)
            dp = tl.dot(dn, tl.trans(vw), input_precision=PREC)
            if HAS_DROP:
                dn2 = _columns(DN, bh, offs_m, rows, Tq, nw, W, dw, W)
                acc_v1 += tl.dot(tl.trans(p2), dn2, input_precision=PREC)
                dp = tl.where(d, dp, tl.dot(dn2, tl.trans(v1), input_precision=PREC))
            ds = tl.where(keep, 2.0 * s * dp, 0.0)
            acc_k += tl.dot(tl.trans(ds.to(fq.dtype)), fq, input_precision=PREC)
    _store_tile(DFK, bh, offs_n, cols, Tk, F, df, acc_k)
    _store_tile(DVW, bh, offs_n, cols, Tk, W, dw, acc_v)
    if HAS_DROP:
        _store_tile(DV1, bh, offs_n, cols, Tk, W, dw, acc_v1)


@triton.jit
def squared_backward_q(FQ, FK, VW, V1, KM, DN, DFQ, Tq, Tk, F, W, eps, drop, seed, OFF, DLO, DHI, STRIDE, SC,
                       MODE: tl.constexpr, PAT: tl.constexpr, HAS_KM: tl.constexpr, HAS_DROP: tl.constexpr,
                       PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BF: tl.constexpr, BW: tl.constexpr):
    """dq' (B·H, Tq, F) for one tile of BM query rows; grid (cdiv(Tq, BM), B·H)."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1).to(tl.int64)
    offs_m = m0 + tl.arange(0, BM)
    df = tl.arange(0, BF)
    dw = tl.arange(0, BW)
    rows = offs_m < Tq
    nw = W
    if HAS_DROP:  # dN = [dN1, dN2]
        nw = 2 * W
    fq = _tile(FQ, bh, offs_m, rows, Tq, F, df)
    dn = _columns(DN, bh, offs_m, rows, Tq, nw, W, dw, 0)
    dn2 = dn
    if HAS_DROP:
        dn2 = _columns(DN, bh, offs_m, rows, Tq, nw, W, dw, W)
    acc_q = tl.zeros([BM, BF], tl.float32)
    lo, hi = _key_range(m0, Tk, OFF, DLO, DHI, BM, BN, MODE)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        cols = offs_n < Tk
        km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
        if (PAT == 0 and not HAS_KM) or _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
            fk = _tile(FK, bh, offs_n, cols, Tk, F, df)
            vw = _tile(VW, bh, offs_n, cols, Tk, W, dw).to(tl.float32)
            s, p1, p2, keep, d = _pairs(fq, fk, bh, offs_m, offs_n, Tq, Tk, OFF, DLO, DHI, STRIDE, SC, km, eps, drop,
                                        seed, MODE, PAT, HAS_KM, HAS_DROP, PREC)
            dp = tl.dot(dn, tl.trans(vw), input_precision=PREC)
            if HAS_DROP:
                v1 = _tile(V1, bh, offs_n, cols, Tk, W, dw).to(tl.float32)
                dp = tl.where(d, dp, tl.dot(dn2, tl.trans(v1), input_precision=PREC))
            ds = tl.where(keep, 2.0 * s * dp, 0.0)
            acc_q += tl.dot(ds.to(fk.dtype), fk, input_precision=PREC)
    _store_tile(DFQ, bh, offs_m, rows, Tq, F, df, acc_q)


@triton.jit
def magnitude_keep(KEEP, Tq, Tk, drop, seed, BM: tl.constexpr, BN: tl.constexpr):
    """KEEP (B·H, Tq, Tk) int8: the magnitude dropout mask D that the kernels above draw for ``seed`` (for tests;
    the kernels never form it); grid (cdiv(Tq, BM), cdiv(Tk, BN), B·H)."""
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    bh = tl.program_id(2).to(tl.int64)
    d = _magnitude_keep(seed, bh, offs_m, offs_n, Tq, Tk, drop)
    tl.store(KEEP + bh * Tq * Tk + offs_m[:, None] * Tk + offs_n[None, :], d.to(tl.int8),
             mask=(offs_m[:, None] < Tq) & (offs_n[None, :] < Tk))
