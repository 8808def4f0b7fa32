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

The filter is computed per tile (:mod:`~kernel_attention.backends.triton_tiles`): tiles outside it are never
visited, partial ones masked per pair; with a band filter alone, each loop reads every tile of its range, fixed at
compile time, so that Triton pipelines its loads.

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

With Shaw's table every loop runs in three segments, the tiles far before and far after the diagonal (each reading
one column of the table) and the near ones (:mod:`~kernel_attention.backends.triton_shaw`).

All tensors are contiguous with the batch and head folded into one leading axis (B·H), except k and v, of B·H / G
heads when G query heads share each (grouped-query attention: ``_bwd_kv`` then writes dk and dv per query head,
and the caller sums each group), R (HR, Rlen, DR) with HR = 1 (shared by the heads) or H, and the bias (strides
SB0..SB3 of its batch, head, row and key).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernel_attention.backends.triton_shaw import _add_table, _near_query_tiles, _near_tiles, _onto_table, _segment
from kernel_attention.backends.triton_tiles import (_keep, _key_mask, _key_range, _query_range, _store_tile, _tile,
                                                    _visits)

__all__ = ["flash_forward", "flash_backward_kv", "flash_backward_q"]


@triton.jit
def _heads(H, G, RSTRIDE):
    """The program's batch·head ``bh`` (axis 1 of the grid, int64), the offset of its head in Transformer-XL's
    R (RSTRIDE = 0 when the heads share R), and the key/value head of query head bh (G query heads per key/value
    head, grouped-query attention)."""
    bh = tl.program_id(1).to(tl.int64)
    return bh, (bh % H) * RSTRIDE, (bh // H) * (H // G) + (bh % H) // G


@triton.jit
def _onto_window(x, BM: tl.constexpr, BN: tl.constexpr, WP: tl.constexpr):
    """x (BM, BN) on the tile's window of diagonals (BM, WP): column w of row i holds x[i, j] with
    (i - m0) - (j - n0) + BN - 1 = w, 0 where that pair is outside the tile."""
    ji = tl.arange(0, BM)[:, None] - tl.arange(0, WP)[None, :] + (BN - 1)
    inw = (ji >= 0) & (ji < BN)
    return tl.where(inw, tl.gather(x, tl.minimum(tl.maximum(ji, 0), BN - 1), axis=1), 0.0)


@triton.jit
def _logits(q, k, bh, m0, n0, offs_m, offs_n, H, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR, XBASE, SOFF,
            BIAS, SB0, SB1, SB2, SB3, OFF, DLO, DHI, STRIDE, SC, km,
            HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, C: tl.constexpr, W: tl.constexpr,
            HAS_XL: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WP: tl.constexpr,
            BDR: tl.constexpr, MODE: tl.constexpr, PAT: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
            COL: tl.constexpr):
    """The tile's logits in base 2, log2(e) · s (BM, BN), -inf where the filter drops the pair; and the
    window of R rows the tile meets (WP, BDR) (zeros unless HAS_XL).  COL: the column of Shaw's table that every
    pair of the tile reads (a far tile), -1 when they read several."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
    if HAS_KB:
        kb = tl.load(KB + bh * Tk + offs_n, mask=offs_n < Tk, other=0.0)
        s += kb[None, :]
    if HAS_SHAW:
        s = _add_table(s, L, bh, offs_m, offs_n, Tq, Tk, SOFF, C, W, COL)
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
def flash_forward(Q, K, V, KB, KM, L, QV, R, BIAS, O, LSE, HV,
                  H, G, Tq, Tk, DK, DV, DR, RSTRIDE, Rlen, scale, OFF, DLO, DHI, STRIDE, SC, SOFF, XBASE,
                  SB0, SB1, SB2, SB3,
                  HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, HAS_VAL: tl.constexpr, C: tl.constexpr,
                  W: tl.constexpr, HAS_XL: tl.constexpr, HAS_BIAS: tl.constexpr, MODE: tl.constexpr,
                  PAT: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                  BDR: tl.constexpr, WP: tl.constexpr, BW: tl.constexpr):
    """out (B·H, Tq, DV), lse2 (B·H, Tq) and, with HAS_VAL, Hv (B·H, Tq, W) for one tile of BM query rows;
    grid (cdiv(Tq, BM), B·H)."""
    m0 = tl.program_id(0) * BM
    bh, roff, bkv = _heads(H, G, RSTRIDE)
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
    acc_h = tl.zeros([BM, BW], tl.float32)  # Hv of the near tiles, in units of 2^m at the end of their segment
    far_hi = tl.zeros([BM], tl.float32)      # Hv's row 2c from the far tiles before the diagonal, ...
    far_lo = tl.zeros([BM], tl.float32)      # ... its row 0 from those after it
    lo, hi = _key_range(m0, Tk, OFF, DLO, DHI, BM, BN, MODE)
    a, b = _near_tiles(m0, lo, hi, SOFF, C, BM, BN, HAS_SHAW or HAS_VAL)
    m_hi = m_i
    m_near = m_i
    # with Shaw's table, three loops: the tiles far before the diagonal, the near ones, the far ones after it; every
    # pair of a far tile reads one column of the table, so no gather and no loop inside the loop (Triton pipelines it)
    for seg in tl.static_range(3 if HAS_SHAW or HAS_VAL else 1):
        start, end = _segment(seg, lo, a, b, hi)
        for n0 in range(start, end, BN):
            offs_n = n0 + tl.arange(0, BN)
            cols = offs_n < Tk
            km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
            if (PAT == 0 and not HAS_KM) or _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
                k = _tile(K, bkv, offs_n, cols, Tk, DK, dk)
                v = _tile(V, bkv, offs_n, cols, Tk, DV, dv)
                s, rw = _logits(q, k, bh, m0, n0, offs_m, offs_n, H, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR,
                                XBASE, SOFF, BIAS, SB0, SB1, SB2, SB3, OFF, DLO, DHI, STRIDE, SC, km, HAS_KB, HAS_SHAW,
                                C, W, HAS_XL, HAS_BIAS, BM, BN, WP, BDR, MODE, PAT, HAS_KM, PREC,
                                2 * C if seg == 0 else (-1 if seg == 1 else 0))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no kept key yet: 2^(-inf) = 0
                alpha = tl.exp2(m_i - m_safe)
                p = tl.exp2(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
                if HAS_VAL:
                    if seg == 0:
                        far_hi = far_hi * alpha + tl.sum(p, 1)
                    elif seg == 1:
                        acc_h = _onto_table(acc_h * alpha[:, None], p, offs_m, offs_n, m0, n0, SOFF, C, BM, BN, BW)
                    else:
                        far_lo = far_lo * alpha + tl.sum(p, 1)
                m_i = m_new
        if seg == 0:
            m_hi = m_i
        if seg == 1:
            m_near = m_i
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.log2(l_safe))
    if HAS_VAL:
        # the earlier segments' sums to the final maximum (2^(-inf) = 0 where a segment kept no key of the row)
        m_end = tl.where(m_i == float("-inf"), 0.0, m_i)
        acc_h = acc_h * tl.exp2(m_near - m_end)[:, None]
        acc_h += tl.where(wcol[None, :] == 2 * C, (far_hi * tl.exp2(m_hi - m_end))[:, None], 0.0)
        acc_h += tl.where(wcol[None, :] == 0, far_lo[:, None], 0.0)
    _store_tile(O, bh, offs_m, rows, Tq, DV, dv, out)
    tl.store(LSE + bh * Tq + offs_m, lse, mask=rows)
    if HAS_VAL:
        _store_tile(HV, bh, offs_m, rows, Tq, W, wcol, acc_h / l_safe[:, None])


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
                      H, G, Tq, Tk, DK, DV, DR, RSTRIDE, Rlen, scale, OFF, DLO, DHI, STRIDE, SC, SOFF, XBASE,
                      SB0, SB1, SB2, SB3,
                      HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, HAS_VAL: tl.constexpr, C: tl.constexpr,
                      W: tl.constexpr, HAS_XL: tl.constexpr, HAS_BIAS: tl.constexpr, MODE: tl.constexpr,
                      PAT: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                      BDR: tl.constexpr, WP: tl.constexpr, BW: tl.constexpr):
    """dk (B·H, Tk, DK), dv (B·H, Tk, DV) and dkb (B·H, Tk) (float32) for one tile of BN keys; grid
    (cdiv(Tk, BN), B·H).  GH: dHv (B·H, Tq, W) float32 with HAS_VAL."""
    n0 = tl.program_id(0) * BN
    bh, roff, bkv = _heads(H, G, RSTRIDE)
    offs_n = n0 + tl.arange(0, BN)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    dr = tl.arange(0, BDR)
    cols = offs_n < Tk
    k = _tile(K, bkv, offs_n, cols, Tk, DK, dk)
    v = _tile(V, bkv, offs_n, cols, Tk, DV, dv)
    km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
    acc_k = tl.zeros([BN, BDK], tl.float32)
    acc_v = tl.zeros([BN, BDV], tl.float32)
    acc_b = tl.zeros([BN], tl.float32)
    lo, hi = _query_range(n0, Tq, OFF, DLO, DHI, BM, BN, MODE)
    a, b = _near_query_tiles(n0, lo, hi, SOFF, C, BM, BN, HAS_SHAW or HAS_VAL)
    # with Shaw's table, the far query tiles (one column of the table per tile) apart, as in the forward
    for seg in tl.static_range(3 if HAS_SHAW or HAS_VAL else 1):
        start, end = _segment(seg, lo, a, b, hi)
        for m0 in range(start, end, BM):
            if (PAT == 0 and not HAS_KM) or _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
                offs_m = m0 + tl.arange(0, BM)
                q, qv, do, lse, delta = _query_rows(Q, QV, DO, LSE, DELTA, bh, offs_m, Tq, DK, DR, DV, dk, dr, dv,
                                                    HAS_XL)
                # annotated: without it Triton 3.6 passes the name on as a runtime value, which the backward
                # cannot compile with (3.9 can)
                col: tl.constexpr = 0 if seg == 0 else (-1 if seg == 1 else 2 * C)
                s, rw = _logits(q, k, bh, m0, n0, offs_m, offs_n, H, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR,
                                XBASE, SOFF, BIAS, SB0, SB1, SB2, SB3, OFF, DLO, DHI, STRIDE, SC, km, HAS_KB, HAS_SHAW,
                                C, W, HAS_XL, HAS_BIAS, BM, BN, WP, BDR, MODE, PAT, HAS_KM, PREC, col)
                p = tl.exp2(s - lse[:, None])
                acc_v += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
                dp = tl.dot(do, tl.trans(v), input_precision=PREC)
                if HAS_VAL:
                    dp = _add_table(dp, GH, bh, offs_m, offs_n, Tq, Tk, SOFF, C, W, col)
                ds = p * (dp - delta[:, None])
                acc_k += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
                acc_b += tl.sum(ds, 0)
    _store_tile(DK_, bh, offs_n, cols, Tk, DK, dk, acc_k * scale)
    _store_tile(DV_, bh, offs_n, cols, Tk, DV, dv, acc_v)
    if HAS_KB:
        tl.store(DKB + bh * Tk + offs_n, acc_b, mask=cols)


@triton.jit
def flash_backward_q(Q, K, V, KB, KM, L, QV, R, BIAS, GH, DO, LSE, DELTA, DQ, DL, DQV, DRT, DBIAS,
                     H, G, Tq, Tk, DK, DV, DR, RSTRIDE, Rlen, scale, OFF, DLO, DHI, STRIDE, SC, SOFF, XBASE,
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
    bh, roff, bkv = _heads(H, G, RSTRIDE)
    offs_m = m0 + tl.arange(0, BM)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    dr = tl.arange(0, BDR)
    rows = offs_m < Tq
    q, qv, do, lse, delta = _query_rows(Q, QV, DO, LSE, DELTA, bh, offs_m, Tq, DK, DR, DV, dk, dr, dv, HAS_XL)
    acc_q = tl.zeros([BM, BDK], tl.float32)
    acc_l = tl.zeros([BM, BW], tl.float32)  # dL of the near tiles
    far_hi = tl.zeros([BM], tl.float32)      # dL's row 2c from the far tiles before the diagonal, ...
    far_lo = tl.zeros([BM], tl.float32)      # ... its row 0 from those after it
    acc_qv = tl.zeros([BM, BDR], tl.float32)
    wcol = tl.arange(0, BW)
    wwin = tl.arange(0, WP)
    lo, hi = _key_range(m0, Tk, OFF, DLO, DHI, BM, BN, MODE)
    a, b = _near_tiles(m0, lo, hi, SOFF, C, BM, BN, HAS_SHAW or HAS_VAL)
    # with Shaw's table, the far tiles before and after the diagonal apart, as in the forward
    for seg in tl.static_range(3 if HAS_SHAW or HAS_VAL else 1):
        start, end = _segment(seg, lo, a, b, hi)
        for n0 in range(start, end, BN):
            offs_n = n0 + tl.arange(0, BN)
            cols = offs_n < Tk
            km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
            if (PAT == 0 and not HAS_KM) or _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT):
                k = _tile(K, bkv, offs_n, cols, Tk, DK, dk)
                v = _tile(V, bkv, offs_n, cols, Tk, DV, dv)
                col: tl.constexpr = 2 * C if seg == 0 else (-1 if seg == 1 else 0)
                s, rw = _logits(q, k, bh, m0, n0, offs_m, offs_n, H, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR,
                                XBASE, SOFF, BIAS, SB0, SB1, SB2, SB3, OFF, DLO, DHI, STRIDE, SC, km, HAS_KB, HAS_SHAW,
                                C, W, HAS_XL, HAS_BIAS, BM, BN, WP, BDR, MODE, PAT, HAS_KM, PREC, col)
                p = tl.exp2(s - lse[:, None])
                dp = tl.dot(do, tl.trans(v), input_precision=PREC)
                if HAS_VAL:
                    dp = _add_table(dp, GH, bh, offs_m, offs_n, Tq, Tk, SOFF, C, W, col)
                ds = p * (dp - delta[:, None])
                acc_q += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
                if HAS_SHAW:
                    if seg == 0:
                        far_hi += tl.sum(ds, 1)
                    elif seg == 1:
                        acc_l = _onto_table(acc_l, ds, offs_m, offs_n, m0, n0, SOFF, C, BM, BN, BW)
                    else:
                        far_lo += tl.sum(ds, 1)
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
    _store_tile(DQ, bh, offs_m, rows, Tq, DK, dk, acc_q * scale)
    if HAS_SHAW:
        acc_l += tl.where(wcol[None, :] == 2 * C, far_hi[:, None], 0.0) + tl.where(wcol[None, :] == 0, far_lo[:, None],
                                                                                    0.0)
        _store_tile(DL, bh, offs_m, rows, Tq, W, wcol, acc_l)
    if HAS_XL:
        _store_tile(DQV, bh, offs_m, rows, Tq, DR, dr, acc_qv)
