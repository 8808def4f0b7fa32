r"""Triton kernels of the ``triton`` backend: a flash-attention forward and backward over tiles of BM query
rows and BN keys, on the SDPA features of an exp-family kernel with additive terms formed per tile.

The logit of a pair, in natural units, is

    s_ij = scale · <q'_i, k'_j> + kb_j + L[i, idx_ij] + qv_i · R[base + i - j] + bias[b, h, i, j],
    idx_ij = clip(o_s + i - j, -c, c) + c

(key bias; Shaw's clipped table, Transformer Dissection Eq. 6; Transformer-XL's relative term, Eq. 5; a user's
float mask, read per tile through its strides, 0 where it is broadcast), each present or not (``HAS_KB``,
``HAS_SHAW``, ``HAS_XL``, ``HAS_BIAS``).  With ``HAS_VAL`` (Shaw's value table a^V) the forward also writes the
row's weights summed per table row, the histogram Hv[i, w] = sum_{j: idx_ij = w} P_ij (B·H, Tq, 2c + 1), from
which the caller adds Hv a^V to the output.

The filter keeps a pair where its band, its sparse pattern and, with ``HAS_KM``, the key mask (padding) all keep
it (:mod:`~kernel_attention.backends.triton_filters`), with d = i + off - j, off = Tk - Tq:

    MODE = 1   DLO <= d <= DHI                       PAT = 1   d < s or d % s == 0  (strided)
    HAS_KM     km[b, j]                              PAT = 2   j // s == p // s or j % s >= s - c  (fixed)

Tiles outside the band are never visited (:func:`_key_range`, :func:`_query_range`), nor a tile the pattern
cannot keep (:func:`_tile_meets`) nor a key tile whose mask is all False; partial tiles are masked per pair.
Without a pattern or a key mask every tile of the band's range is read, which each loop fixes at compile time
(``PAT == 0 and not HAS_KM``) rather than testing it per tile: with no branch around a tile's loads, Triton
pipelines them (the next tiles are copied while the current one computes).

Forward (one program per (query tile, batch·head)): online soft-max in base 2 (p = 2^(log2(e)·s - m)),
writes out (B·H, Tq, Dv) and the row log-sum-exp lse2 = m + log2(l) (B·H, Tq), +inf for a row with no
kept key (its output is 0 and, since 2^(s - inf) = 0, so is every gradient through it).

Backward: dS_ij = P_ij (dP_ij - delta_i) with dP_ij = dO_i · v_j + dHv[i, idx_ij] and delta_i = sum_j P_ij dP_ij =
dO_i · out_i + dHv_i · Hv_i (formed by the caller), P recomputed per tile from lse2:

* ``_bwd_kv`` (per key tile): dv_j = sum_i P_ij dO_i, dk_j = scale · sum_i dS_ij q'_i, dkb_j = sum_i dS_ij;
* ``_bwd_q`` (per query tile): dq_i = scale · sum_j dS_ij k'_j; dL[i, w] = sum_{j: idx_ij = w} dS_ij;
  dqv_i = sum_j dS_ij R[base + i - j]; dR[r] += sum_{i - j = r - base} dS_ij qv_i (atomic adds of each
  tile's window of R rows, in float32); dbias = dS (B·H, Tq, Tk) where the bias has a gradient.

Transformer-XL's term for a tile of rows [m0, m0 + BM) and keys [n0, n0 + BN) meets the BM + BN - 1
distances r = rlo + w, rlo = base + m0 - n0 - (BN - 1), w = (i - m0) - (j - n0) + BN - 1: the tile forms
the (BM, WP) products qv · R[rlo:rlo + WP]^T (WP = the next power of two) and gathers column w of each
pair; its backward gathers dS back onto the window (j - n0 = (i - m0) - w + BN - 1).

All tensors are contiguous with the batch and head folded into one leading axis (B·H), except R
(HR, Rlen, DR) with HR = 1 (shared by the heads) or H, and the bias (strides SB0..SB3 of its batch, head,
row and key).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = ["INTERPRETED", "flash_forward", "flash_backward_kv", "flash_backward_q", "filter_keep"]

#: whether the kernels below were built for Triton's interpreter (TRITON_INTERPRET=1 when this module was
#: first imported): they then run on CPU tensors, one program after the other
INTERPRETED = (bool(triton.knobs.runtime.interpret) if hasattr(triton, "knobs")  # Triton >= 3.4
               else os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes"))

LOG2E = 1.4426950408889634


@triton.jit
def _tile(X, bh, offs, valid, T, D, d):
    """Rows ``offs`` of the (B·H, T, D) tensor X for program ``bh``, columns ``d``: a (len(offs), len(d)) tile,
    0 where a row is not ``valid`` or a column is past D."""
    return tl.load(X + bh * T * D + offs[:, None] * D + d[None, :], mask=valid[:, None] & (d[None, :] < D),
                   other=0.0)


@triton.jit
def _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM: tl.constexpr):
    """int8 (BN,): 1 where the key exists and (with a padding mask KM (B·H, Tk)) is real."""
    km = cols.to(tl.int8)
    if HAS_KM:
        km = tl.load(KM + bh * Tk + offs_n, mask=cols, other=0)
    return km


@triton.jit
def _keep(offs_m, offs_n, Tq, Tk, OFF, DLO, DHI, STRIDE, SC, km, MODE: tl.constexpr, PAT: tl.constexpr,
          HAS_KM: tl.constexpr):
    """(BM, BN) bool: the pair is in range and kept by the filter (module docstring)."""
    keep = (offs_m[:, None] < Tq) & (offs_n[None, :] < Tk)
    if MODE == 1:
        d = offs_m[:, None] + OFF - offs_n[None, :]
        keep = keep & (d >= DLO) & (d <= DHI)
        # a pattern comes with DLO >= 0: d, p and j are >= 0 where it decides
        if PAT == 1:
            keep = keep & ((d < STRIDE) | (d % STRIDE == 0))
        if PAT == 2:
            p = offs_m[:, None] + OFF
            j = offs_n[None, :]
            keep = keep & ((j // STRIDE == p // STRIDE) | (j % STRIDE >= STRIDE - SC))
    if HAS_KM:
        keep = keep & (km[None, :] != 0)
    return keep


@triton.jit
def _tile_meets(m0, n0, OFF, DLO, DHI, STRIDE, SC, BM: tl.constexpr, BN: tl.constexpr, PAT: tl.constexpr):
    """Whether the tile of rows [m0, m0 + BM) and keys [n0, n0 + BN) may hold a pair that the pattern keeps
    (always without one): strided, a distance in the tile's range [lo, hi] below s or a multiple of s; fixed, a
    summary key among the tile's keys at or before its last query, or a block that its queries and keys share."""
    meets = (m0 + n0) * 0 == 0
    if PAT == 1:
        lo = tl.maximum(m0 + OFF - (n0 + BN - 1), DLO)
        hi = tl.minimum(m0 + BM - 1 + OFF - n0, DHI)
        meets = (lo <= hi) & ((lo < STRIDE) | (hi // STRIDE * STRIDE >= lo))
    if PAT == 2:
        pa = tl.maximum(m0 + OFF, 0)
        pb = m0 + BM - 1 + OFF
        r = n0 % STRIDE
        first = tl.where(r >= STRIDE - SC, n0, n0 + STRIDE - SC - r)  # the first summary key >= n0
        summary = (first <= n0 + BN - 1) & (first <= pb)
        block = (pa // STRIDE <= (n0 + BN - 1) // STRIDE) & (pb // STRIDE >= n0 // STRIDE)
        meets = summary | block
    return meets


@triton.jit
def _key_range(m0, Tk, OFF, DLO, DHI, BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr):
    """[lo, hi) of the key tiles a query tile starting at m0 meets under the band (lo a multiple of BN)."""
    lo = m0 * 0
    hi = m0 * 0 + Tk
    if MODE == 1:
        lo = tl.maximum(lo, m0 + OFF - DHI)
        hi = tl.minimum(hi, m0 + BM + OFF - DLO)
    return (lo // BN) * BN, hi


@triton.jit
def _query_range(n0, Tq, OFF, DLO, DHI, BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr):
    """[lo, hi) of the query tiles a key tile starting at n0 meets under the band (lo a multiple of BM)."""
    lo = n0 * 0
    hi = n0 * 0 + Tq
    if MODE == 1:
        lo = tl.maximum(lo, n0 - OFF + DLO)
        hi = tl.minimum(hi, n0 + BN - OFF + DHI)
    return (lo // BM) * BM, hi


@triton.jit
def _shaw_index(offs_m, offs_n, SOFF, C: tl.constexpr):
    """(BM, BN): the table row clip(o + i - j, -c, c) + c of each pair."""
    return tl.minimum(tl.maximum(SOFF + offs_m[:, None] - offs_n[None, :], -C), C) + C


@triton.jit
def _row_table(X, bh, offs_m, offs_n, idx, Tq, Tk, W: tl.constexpr):
    """X[bh, i, idx_ij] (BM, BN) of a (B·H, Tq, W) per-row table (0 outside the tensors)."""
    inb = (offs_m[:, None] < Tq) & (offs_n[None, :] < Tk)
    return tl.load(X + bh * Tq * W + offs_m[:, None] * W + idx, mask=inb, other=0.0)


@triton.jit
def _onto_window(x, BM: tl.constexpr, BN: tl.constexpr, WP: tl.constexpr):
    """x (BM, BN) on the tile's window of diagonals (BM, WP): column w of row i holds x[i, j] with
    (i - m0) - (j - n0) + BN - 1 = w, 0 where that pair is outside the tile."""
    ji = tl.arange(0, BM)[:, None] - tl.arange(0, WP)[None, :] + (BN - 1)
    inw = (ji >= 0) & (ji < BN)
    return tl.where(inw, tl.gather(x, tl.minimum(tl.maximum(ji, 0), BN - 1), axis=1), 0.0)


@triton.jit
def _onto_table(acc, x, m0, n0, SOFF, C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr,
                WP: tl.constexpr):
    """acc (BM, BW) plus x (BM, BN) summed per table row: acc[i, w] += sum_{j: idx_ij = w} x_ij.  x goes onto the
    tile's window of diagonals (:func:`_onto_window`), whose column u is the distance o + m0 - n0 - (BN - 1) + u,
    and a (WP, BW) 0/1 product sums each column onto its table row clip(d, -c, c) + c: no loop inside the key loop,
    whose loads Triton then pipelines.  The product runs in three tf32 passes (tf32x3), float32's accuracy."""
    d = SOFF + m0 - n0 - (BN - 1) + tl.arange(0, WP)
    onto = (tl.minimum(tl.maximum(d, -C), C) + C)[:, None] == tl.arange(0, BW)[None, :]
    return acc + tl.dot(_onto_window(x, BM, BN, WP), onto.to(tl.float32), input_precision="tf32x3")


@triton.jit
def _logits(q, k, bh, m0, n0, offs_m, offs_n, H, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR, XBASE, SOFF,
            BIAS, SB0, SB1, SB2, SB3, OFF, DLO, DHI, STRIDE, SC, km,
            HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, C: tl.constexpr, W: tl.constexpr,
            HAS_XL: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WP: tl.constexpr,
            BDR: tl.constexpr, MODE: tl.constexpr, PAT: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr):
    """The tile's logits in base 2, log2(e) · s (BM, BN), -inf where the filter drops the pair; and the
    window of R rows the tile meets (WP, BDR) (zeros unless HAS_XL)."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
    if HAS_KB:
        kb = tl.load(KB + bh * Tk + offs_n, mask=offs_n < Tk, other=0.0)
        s += kb[None, :]
    if HAS_SHAW:
        s += _row_table(L, bh, offs_m, offs_n, _shaw_index(offs_m, offs_n, SOFF, C), Tq, Tk, W)
    if HAS_XL:
        r = XBASE + m0 - n0 - (BN - 1) + tl.arange(0, WP)
        dr = tl.arange(0, BDR)
        rmask = (r >= 0) & (r < Rlen)
        rw = tl.load(R + roff + r[:, None] * DR + dr[None, :], mask=rmask[:, None] & (dr[None, :] < DR), other=0.0)
        qr = tl.dot(qv, tl.trans(rw), input_precision=PREC)  # (BM, WP): qv_i · R[rlo + w]
        wi = tl.arange(0, BM)[:, None] - tl.arange(0, BN)[None, :] + (BN - 1)
        s += tl.gather(qr, wi, axis=1)
    else:
        rw = tl.zeros([WP, BDR], q.dtype)
    if HAS_BIAS:
        inb = (offs_m[:, None] < Tq) & (offs_n[None, :] < Tk)
        s += tl.load(BIAS + (bh // H) * SB0 + (bh % H) * SB1 + offs_m[:, None] * SB2 + offs_n[None, :] * SB3,
                     mask=inb, other=0.0)
    keep = _keep(offs_m, offs_n, Tq, Tk, OFF, DLO, DHI, STRIDE, SC, km, MODE, PAT, HAS_KM)
    return tl.where(keep, s * 1.4426950408889634, float("-inf")), rw


@triton.jit
def _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM: tl.constexpr, BN: tl.constexpr, PAT: tl.constexpr):
    """Whether a tile in the band's range is read: the pattern may keep a pair of it and a key of it is real."""
    return _tile_meets(m0, n0, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT) & (tl.max(km.to(tl.int32), 0) > 0)


@triton.jit
def flash_forward(Q, K, V, KB, KM, L, QV, R, BIAS, O, LSE, HV,
                  H, Tq, Tk, DK, DV, DR, RSTRIDE, Rlen, scale, OFF, DLO, DHI, STRIDE, SC, SOFF, XBASE,
                  SB0, SB1, SB2, SB3,
                  HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, HAS_VAL: tl.constexpr, C: tl.constexpr,
                  W: tl.constexpr, HAS_XL: tl.constexpr, HAS_BIAS: tl.constexpr, MODE: tl.constexpr,
                  PAT: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                  BDR: tl.constexpr, WP: tl.constexpr, BW: tl.constexpr):
    """out (B·H, Tq, DV), lse2 (B·H, Tq) and, with HAS_VAL, Hv (B·H, Tq, W) for one tile of BM query rows;
    grid (cdiv(Tq, BM), B·H)."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1).to(tl.int64)
    roff = (bh % H) * RSTRIDE  # R's head: RSTRIDE = 0 when the heads share it
    offs_m = m0 + tl.arange(0, BM)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    dr = tl.arange(0, BDR)
    wcol = tl.arange(0, BW)
    rows = offs_m < Tq
    q = _tile(Q, bh, offs_m, rows, Tq, DK, dk)
    qv = q
    if HAS_XL:
        qv = _tile(QV, bh, offs_m, rows, Tq, DR, dr)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    acc_h = tl.zeros([BM, BW], tl.float32)
    lo, hi = _key_range(m0, Tk, OFF, DLO, DHI, BM, BN, MODE)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        cols = offs_n < Tk
        km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
        if (PAT == 0 and not HAS_KM) or _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
            k = _tile(K, bh, offs_n, cols, Tk, DK, dk)
            v = _tile(V, bh, offs_n, cols, Tk, DV, dv)
            s, rw = _logits(q, k, bh, m0, n0, offs_m, offs_n, H, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR, XBASE,
                            SOFF, BIAS, SB0, SB1, SB2, SB3, OFF, DLO, DHI, STRIDE, SC, km, HAS_KB, HAS_SHAW, C, W,
                            HAS_XL, HAS_BIAS, BM, BN, WP, BDR, MODE, PAT, HAS_KM, PREC)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no kept key yet: 2^(-inf) = 0
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            if HAS_VAL:
                acc_h = _onto_table(acc_h * alpha[:, None], p, m0, n0, SOFF, C, BM, BN, BW, WP)
            m_i = m_new
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.log2(l_safe))
    tl.store(O + bh * Tq * DV + offs_m[:, None] * DV + dv[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None] & (dv[None, :] < DV))
    tl.store(LSE + bh * Tq + offs_m, lse, mask=rows)
    if HAS_VAL:
        tl.store(HV + bh * Tq * W + offs_m[:, None] * W + wcol[None, :], acc_h / l_safe[:, None],
                 mask=rows[:, None] & (wcol[None, :] < W))


@triton.jit
def _query_rows(Q, QV, DO, LSE, DELTA, bh, offs_m, Tq, DK, DR, DV, dk, dr, dv, HAS_XL: tl.constexpr):
    """What the backward reads of the query rows ``offs_m``: q' (BM, BDK), qv (BM, BDR) (q' unless HAS_XL), dO
    (BM, BDV), lse2 and delta (BM,) (+inf and 0 past Tq)."""
    rows = offs_m < Tq
    q = _tile(Q, bh, offs_m, rows, Tq, DK, dk)
    qv = q
    if HAS_XL:
        qv = _tile(QV, bh, offs_m, rows, Tq, DR, dr)
    do = _tile(DO, bh, offs_m, rows, Tq, DV, dv)
    lse = tl.load(LSE + bh * Tq + offs_m, mask=rows, other=float("inf"))
    delta = tl.load(DELTA + bh * Tq + offs_m, mask=rows, other=0.0)
    return q, qv, do, lse, delta


@triton.jit
def flash_backward_kv(Q, K, V, KB, KM, L, QV, R, BIAS, GH, DO, LSE, DELTA, DK_, DV_, DKB,
                      H, Tq, Tk, DK, DV, DR, RSTRIDE, Rlen, scale, OFF, DLO, DHI, STRIDE, SC, SOFF, XBASE,
                      SB0, SB1, SB2, SB3,
                      HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, HAS_VAL: tl.constexpr, C: tl.constexpr,
                      W: tl.constexpr, HAS_XL: tl.constexpr, HAS_BIAS: tl.constexpr, MODE: tl.constexpr,
                      PAT: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                      BDR: tl.constexpr, WP: tl.constexpr, BW: tl.constexpr):
    """dk (B·H, Tk, DK), dv (B·H, Tk, DV) and dkb (B·H, Tk) (float32) for one tile of BN keys; grid
    (cdiv(Tk, BN), B·H).  GH: dHv (B·H, Tq, W) float32 with HAS_VAL."""
    n0 = tl.program_id(0) * BN
    bh = tl.program_id(1).to(tl.int64)
    roff = (bh % H) * RSTRIDE  # R's head: RSTRIDE = 0 when the heads share it
    offs_n = n0 + tl.arange(0, BN)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    dr = tl.arange(0, BDR)
    cols = offs_n < Tk
    k = _tile(K, bh, offs_n, cols, Tk, DK, dk)
    v = _tile(V, bh, offs_n, cols, Tk, DV, dv)
    km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
    acc_k = tl.zeros([BN, BDK], tl.float32)
    acc_v = tl.zeros([BN, BDV], tl.float32)
    acc_b = tl.zeros([BN], tl.float32)
    lo, hi = _query_range(n0, Tq, OFF, DLO, DHI, BM, BN, MODE)
    for m0 in range(lo, hi, BM):
        if (PAT == 0 and not HAS_KM) or _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
            offs_m = m0 + tl.arange(0, BM)
            q, qv, do, lse, delta = _query_rows(Q, QV, DO, LSE, DELTA, bh, offs_m, Tq, DK, DR, DV, dk, dr, dv, HAS_XL)
            s, rw = _logits(q, k, bh, m0, n0, offs_m, offs_n, H, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR, XBASE,
                            SOFF, BIAS, SB0, SB1, SB2, SB3, OFF, DLO, DHI, STRIDE, SC, km, HAS_KB, HAS_SHAW, C, W,
                            HAS_XL, HAS_BIAS, BM, BN, WP, BDR, MODE, PAT, HAS_KM, PREC)
            p = tl.exp2(s - lse[:, None])
            acc_v += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
            dp = tl.dot(do, tl.trans(v), input_precision=PREC)
            if HAS_VAL:
                dp += _row_table(GH, bh, offs_m, offs_n, _shaw_index(offs_m, offs_n, SOFF, C), Tq, Tk, W)
            ds = p * (dp - delta[:, None])
            acc_k += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
            acc_b += tl.sum(ds, 0)
    tl.store(DK_ + bh * Tk * DK + offs_n[:, None] * DK + dk[None, :], (acc_k * scale).to(DK_.dtype.element_ty),
             mask=cols[:, None] & (dk[None, :] < DK))
    tl.store(DV_ + bh * Tk * DV + offs_n[:, None] * DV + dv[None, :], acc_v.to(DV_.dtype.element_ty),
             mask=cols[:, None] & (dv[None, :] < DV))
    if HAS_KB:
        tl.store(DKB + bh * Tk + offs_n, acc_b, mask=cols)


@triton.jit
def flash_backward_q(Q, K, V, KB, KM, L, QV, R, BIAS, GH, DO, LSE, DELTA, DQ, DL, DQV, DRT, DBIAS,
                     H, Tq, Tk, DK, DV, DR, RSTRIDE, Rlen, scale, OFF, DLO, DHI, STRIDE, SC, SOFF, XBASE,
                     SB0, SB1, SB2, SB3,
                     HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, HAS_VAL: tl.constexpr, C: tl.constexpr,
                     W: tl.constexpr, HAS_XL: tl.constexpr, HAS_BIAS: tl.constexpr, MODE: tl.constexpr,
                     PAT: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                     BDR: tl.constexpr, WP: tl.constexpr, BW: tl.constexpr, HAS_DBIAS: tl.constexpr):
    """dq (B·H, Tq, DK), Shaw's dL (B·H, Tq, W), Transformer-XL's dqv (B·H, Tq, DR) and, with HAS_DBIAS, the
    bias's dS (B·H, Tq, Tk) (float32, left as it is in skipped tiles) for one tile of BM query rows, and its atomic
    adds into dR (HR, Rlen, DR) (float32); grid (cdiv(Tq, BM), B·H)."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1).to(tl.int64)
    roff = (bh % H) * RSTRIDE  # R's head: RSTRIDE = 0 when the heads share it
    offs_m = m0 + tl.arange(0, BM)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    dr = tl.arange(0, BDR)
    rows = offs_m < Tq
    q, qv, do, lse, delta = _query_rows(Q, QV, DO, LSE, DELTA, bh, offs_m, Tq, DK, DR, DV, dk, dr, dv, HAS_XL)
    acc_q = tl.zeros([BM, BDK], tl.float32)
    acc_l = tl.zeros([BM, BW], tl.float32)
    acc_qv = tl.zeros([BM, BDR], tl.float32)
    wcol = tl.arange(0, BW)
    wwin = tl.arange(0, WP)
    lo, hi = _key_range(m0, Tk, OFF, DLO, DHI, BM, BN, MODE)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        cols = offs_n < Tk
        km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
        if (PAT == 0 and not HAS_KM) or _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
            k = _tile(K, bh, offs_n, cols, Tk, DK, dk)
            v = _tile(V, bh, offs_n, cols, Tk, DV, dv)
            s, rw = _logits(q, k, bh, m0, n0, offs_m, offs_n, H, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR, XBASE,
                            SOFF, BIAS, SB0, SB1, SB2, SB3, OFF, DLO, DHI, STRIDE, SC, km, HAS_KB, HAS_SHAW, C, W,
                            HAS_XL, HAS_BIAS, BM, BN, WP, BDR, MODE, PAT, HAS_KM, PREC)
            p = tl.exp2(s - lse[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision=PREC)
            if HAS_VAL:
                dp += _row_table(GH, bh, offs_m, offs_n, _shaw_index(offs_m, offs_n, SOFF, C), Tq, Tk, W)
            ds = p * (dp - delta[:, None])
            acc_q += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
            if HAS_SHAW:
                acc_l = _onto_table(acc_l, ds, m0, n0, SOFF, C, BM, BN, BW, WP)
            if HAS_XL:
                dqr = _onto_window(ds, BM, BN, WP)  # dS onto the tile's window of distances
                acc_qv += tl.dot(dqr.to(rw.dtype), rw, input_precision=PREC)
                drw = tl.dot(tl.trans(dqr).to(qv.dtype), qv, input_precision=PREC)  # (WP, BDR)
                r = XBASE + m0 - n0 - (BN - 1) + wwin
                tl.atomic_add(DRT + roff + r[:, None] * DR + dr[None, :], drw,
                              mask=((r >= 0) & (r < Rlen))[:, None] & (dr[None, :] < DR))
            if HAS_DBIAS:
                tl.store(DBIAS + bh * Tq * Tk + offs_m[:, None] * Tk + offs_n[None, :], ds,
                         mask=rows[:, None] & cols[None, :])
    tl.store(DQ + bh * Tq * DK + offs_m[:, None] * DK + dk[None, :], (acc_q * scale).to(DQ.dtype.element_ty),
             mask=rows[:, None] & (dk[None, :] < DK))
    if HAS_SHAW:
        tl.store(DL + bh * Tq * W + offs_m[:, None] * W + wcol[None, :], acc_l,
                 mask=rows[:, None] & (wcol[None, :] < W))
    if HAS_XL:
        tl.store(DQV + bh * Tq * DR + offs_m[:, None] * DR + dr[None, :], acc_qv.to(DQV.dtype.element_ty),
                 mask=rows[:, None] & (dr[None, :] < DR))


@triton.jit
def filter_keep(KM, KEEP, Tq, Tk, OFF, DLO, DHI, STRIDE, SC, MODE: tl.constexpr, PAT: tl.constexpr,
                HAS_KM: tl.constexpr, BY_KEYS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """KEEP (B·H, Tq, Tk) int8: 1 at the pairs the kernels keep, written over the tiles they visit, so a pair of a
    skipped tile stays as it was (0): the filter's mask as the kernels see it, for tests.  One program per query
    tile (the forward's and ``_bwd_q``'s walk) or, with BY_KEYS, per key tile (``_bwd_kv``'s); grid (tiles,
    B·H)."""
    bh = tl.program_id(1).to(tl.int64)
    if BY_KEYS:
        n0 = tl.program_id(0) * BN
        offs_n = n0 + tl.arange(0, BN)
        km = _key_mask(KM, bh, offs_n, offs_n < Tk, Tk, HAS_KM)
        lo, hi = _query_range(n0, Tq, OFF, DLO, DHI, BM, BN, MODE)
        for m0 in range(lo, hi, BM):
            if _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
                offs_m = m0 + tl.arange(0, BM)
                keep = _keep(offs_m, offs_n, Tq, Tk, OFF, DLO, DHI, STRIDE, SC, km, MODE, PAT, HAS_KM)
                tl.store(KEEP + bh * Tq * Tk + offs_m[:, None] * Tk + offs_n[None, :], keep.to(tl.int8),
                         mask=(offs_m[:, None] < Tq) & (offs_n[None, :] < Tk))
    else:
        m0 = tl.program_id(0) * BM
        offs_m = m0 + tl.arange(0, BM)
        lo, hi = _key_range(m0, Tk, OFF, DLO, DHI, BM, BN, MODE)
        for n0 in range(lo, hi, BN):
            offs_n = n0 + tl.arange(0, BN)
            km = _key_mask(KM, bh, offs_n, offs_n < Tk, Tk, HAS_KM)
            if _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
                keep = _keep(offs_m, offs_n, Tq, Tk, OFF, DLO, DHI, STRIDE, SC, km, MODE, PAT, HAS_KM)
                tl.store(KEEP + bh * Tq * Tk + offs_m[:, None] * Tk + offs_n[None, :], keep.to(tl.int8),
                         mask=(offs_m[:, None] < Tq) & (offs_n[None, :] < Tk))
