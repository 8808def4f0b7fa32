r"""Triton kernels of the ``triton`` backend: a flash-attention forward and backward over tiles of BM query
rows and BN keys, on the SDPA features of an exp-family kernel with additive terms formed per tile.

The logit of a pair, in natural units, is

    s_ij = scale · <q'_i, k'_j> + kb_j + L[i, clip(o_s + i - j, -c, c) + c] + qv_i · R[base + i - j]

(key bias; Shaw's clipped table, Transformer Dissection Eq. 6; Transformer-XL's relative term, Eq. 5), each
present or not (``HAS_KB``, ``HAS_SHAW``, ``HAS_XL``), and the filter keeps a pair where its sequence
filter (``MODE``) and, with ``HAS_KM``, the key mask (padding) both keep it:

    FULL     every key              CAUSAL   j <= i + off
    LOCAL    |i + off - j| <= win   HAS_KM   km[b, j]

with off = Tk - Tq (lower-right alignment).  Tiles outside the filter's span are never visited (the
sequence filter's, from the tile's coordinates; a key tile whose mask is all False); partial tiles are
masked per pair.

Forward (one program per (query tile, batch·head)): online soft-max in base 2 (p = 2^(log2(e)·s - m)),
writes out (B·H, Tq, Dv) and the row log-sum-exp lse2 = m + log2(l) (B·H, Tq), +inf for a row with no
kept key (its output is 0 and, since 2^(s - inf) = 0, so is every gradient through it).

Backward: dS_ij = P_ij (dO_i · v_j - delta_i), delta_i = dO_i · out_i, with P recomputed per tile from lse2:

* ``_bwd_kv`` (per key tile): dv_j = sum_i P_ij dO_i, dk_j = scale · sum_i dS_ij q'_i, dkb_j = sum_i dS_ij;
* ``_bwd_q`` (per query tile): dq_i = scale · sum_j dS_ij k'_j; dL[i, w] = sum_{j: idx_ij = w} dS_ij;
  dqv_i = sum_j dS_ij R[base + i - j]; dR[r] += sum_{i - j = r - base} dS_ij qv_i (atomic adds of each
  tile's window of R rows, in float32).

Transformer-XL's term for a tile of rows [m0, m0 + BM) and keys [n0, n0 + BN) meets the BM + BN - 1
distances r = rlo + w, rlo = base + m0 - n0 - (BN - 1), w = (i - m0) - (j - n0) + BN - 1: the tile forms
the (BM, WP) products qv · R[rlo:rlo + WP]^T (WP = the next power of two) and gathers column w of each
pair; its backward gathers dS back onto the window (j - n0 = (i - m0) - w + BN - 1).

All tensors are contiguous with the batch and head folded into one leading axis (B·H), except R
(HR, Rlen, DR) with HR = 1 (shared by the heads) or H.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = ["INTERPRETED", "FULL", "CAUSAL", "LOCAL", "flash_forward", "flash_backward_kv",
           "flash_backward_q"]

#: whether the kernels below were built for Triton's interpreter (TRITON_INTERPRET=1 when this module was
#: first imported): they then run on CPU tensors, one program after the other
INTERPRETED = (bool(triton.knobs.runtime.interpret) if hasattr(triton, "knobs")  # Triton >= 3.4
               else os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes"))

FULL, CAUSAL, LOCAL = 0, 1, 2

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
def _keep(offs_m, offs_n, Tq, Tk, OFF, WIN, km, MODE: tl.constexpr, HAS_KM: tl.constexpr):
    """(BM, BN) bool: the pair is in range and kept by the filter."""
    keep = (offs_m[:, None] < Tq) & (offs_n[None, :] < Tk)
    if MODE == 1:
        keep = keep & (offs_n[None, :] <= offs_m[:, None] + OFF)
    if MODE == 2:
        dist = offs_m[:, None] + OFF - offs_n[None, :]
        keep = keep & (dist <= WIN) & (dist >= -WIN)
    if HAS_KM:
        keep = keep & (km[None, :] != 0)
    return keep


@triton.jit
def _logits(q, k, bh, m0, n0, offs_m, offs_n, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR, XBASE, SOFF,
            OFF, WIN, km,
            HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, C: tl.constexpr, W: tl.constexpr,
            HAS_XL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WP: tl.constexpr, BDR: tl.constexpr,
            MODE: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr):
    """The tile's logits in base 2, log2(e) · s (BM, BN), -inf where the filter drops the pair; and the
    window of R rows the tile meets (WP, BDR) (zeros unless HAS_XL)."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
    if HAS_KB:
        kb = tl.load(KB + bh * Tk + offs_n, mask=offs_n < Tk, other=0.0)
        s += kb[None, :]
    if HAS_SHAW:
        idx = tl.minimum(tl.maximum(SOFF + offs_m[:, None] - offs_n[None, :], -C), C) + C
        inb = (offs_m[:, None] < Tq) & (offs_n[None, :] < Tk)
        s += tl.load(L + bh * Tq * W + offs_m[:, None] * W + idx, mask=inb, other=0.0)
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
    keep = _keep(offs_m, offs_n, Tq, Tk, OFF, WIN, km, MODE, HAS_KM)
    return tl.where(keep, s * 1.4426950408889634, float("-inf")), rw


@triton.jit
def _key_range(m0, Tk, OFF, WIN, BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr):
    """[lo, hi) of the key tiles a query tile starting at m0 meets (lo a multiple of BN)."""
    lo = m0 * 0
    hi = m0 * 0 + Tk
    if MODE == 1:
        hi = tl.minimum(hi, m0 + BM + OFF)
    if MODE == 2:
        lo = tl.maximum(lo, m0 + OFF - WIN)
        hi = tl.minimum(hi, m0 + BM + OFF + WIN)
    return (lo // BN) * BN, hi


@triton.jit
def _query_range(n0, Tq, OFF, WIN, BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr):
    """[lo, hi) of the query tiles a key tile starting at n0 meets (lo a multiple of BM)."""
    lo = n0 * 0
    hi = n0 * 0 + Tq
    if MODE == 1:
        lo = tl.maximum(lo, n0 - OFF)
    if MODE == 2:
        lo = tl.maximum(lo, n0 - OFF - WIN)
        hi = tl.minimum(hi, n0 + BN - OFF + WIN)
    return (lo // BM) * BM, hi


@triton.jit
def flash_forward(Q, K, V, KB, KM, L, QV, R, O, LSE,
                  H, Tq, Tk, DK, DV, DR, RSTRIDE, Rlen, scale, OFF, WIN, SOFF, XBASE,
                  HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, C: tl.constexpr, W: tl.constexpr,
                  HAS_XL: tl.constexpr, MODE: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                  BDR: tl.constexpr, WP: tl.constexpr):
    """out (B·H, Tq, DV) and lse2 (B·H, Tq) for one tile of BM query rows; grid (cdiv(Tq, BM), B·H)."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1).to(tl.int64)
    roff = (bh % H) * RSTRIDE  # R's head: RSTRIDE = 0 when the heads share it
    offs_m = m0 + tl.arange(0, BM)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    dr = tl.arange(0, BDR)
    rows = offs_m < Tq
    q = _tile(Q, bh, offs_m, rows, Tq, DK, dk)
    qv = q
    if HAS_XL:
        qv = _tile(QV, bh, offs_m, rows, Tq, DR, dr)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    lo, hi = _key_range(m0, Tk, OFF, WIN, BM, BN, MODE)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        cols = offs_n < Tk
        km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
        if tl.max(km.to(tl.int32), 0) > 0:  # a key tile with no kept key (all padding) is skipped
            k = _tile(K, bh, offs_n, cols, Tk, DK, dk)
            v = _tile(V, bh, offs_n, cols, Tk, DV, dv)
            s, rw = _logits(q, k, bh, m0, n0, offs_m, offs_n, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR, XBASE,
                            SOFF, OFF, WIN, km, HAS_KB, HAS_SHAW, C, W, HAS_XL, BM, BN, WP, BDR, MODE, HAS_KM, PREC)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no kept key yet: 2^(-inf) = 0
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m_i = m_new
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.log2(l_safe))
    tl.store(O + bh * Tq * DV + offs_m[:, None] * DV + dv[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None] & (dv[None, :] < DV))
    tl.store(LSE + bh * Tq + offs_m, lse, mask=rows)


@triton.jit
def flash_backward_kv(Q, K, V, KB, KM, L, QV, R, DO, LSE, DELTA, DK_, DV_, DKB,
                      H, Tq, Tk, DK, DV, DR, RSTRIDE, Rlen, scale, OFF, WIN, SOFF, XBASE,
                      HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, C: tl.constexpr, W: tl.constexpr,
                      HAS_XL: tl.constexpr, MODE: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                      BDR: tl.constexpr, WP: tl.constexpr):
    """dk (B·H, Tk, DK), dv (B·H, Tk, DV) and dkb (B·H, Tk) (float32) for one tile of BN keys; grid
    (cdiv(Tk, BN), B·H)."""
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
    lo, hi = _query_range(n0, Tq, OFF, WIN, BM, BN, MODE)
    if tl.max(km.to(tl.int32), 0) == 0:  # no real key in the tile: nothing to visit
        hi = lo
    for m0 in range(lo, hi, BM):
        offs_m = m0 + tl.arange(0, BM)
        rows = offs_m < Tq
        q = _tile(Q, bh, offs_m, rows, Tq, DK, dk)
        qv = q
        if HAS_XL:
            qv = _tile(QV, bh, offs_m, rows, Tq, DR, dr)
        do = _tile(DO, bh, offs_m, rows, Tq, DV, dv)
        lse = tl.load(LSE + bh * Tq + offs_m, mask=rows, other=float("inf"))
        delta = tl.load(DELTA + bh * Tq + offs_m, mask=rows, other=0.0)
        s, rw = _logits(q, k, bh, m0, n0, offs_m, offs_n, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR, XBASE,
                        SOFF, OFF, WIN, km, HAS_KB, HAS_SHAW, C, W, HAS_XL, BM, BN, WP, BDR, MODE, HAS_KM, PREC)
        p = tl.exp2(s - lse[:, None])
        acc_v += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
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
def flash_backward_q(Q, K, V, KB, KM, L, QV, R, DO, LSE, DELTA, DQ, DL, DQV, DRT,
                     H, Tq, Tk, DK, DV, DR, RSTRIDE, Rlen, scale, OFF, WIN, SOFF, XBASE,
                     HAS_KB: tl.constexpr, HAS_SHAW: tl.constexpr, C: tl.constexpr, W: tl.constexpr,
                     HAS_XL: tl.constexpr, MODE: tl.constexpr, HAS_KM: tl.constexpr, PREC: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                     BDR: tl.constexpr, WP: tl.constexpr, BW: tl.constexpr):
    """dq (B·H, Tq, DK), Shaw's dL (B·H, Tq, W) and Transformer-XL's dqv (B·H, Tq, DR) for one tile of BM
    query rows, and its atomic adds into dR (HR, Rlen, DR) (float32); grid (cdiv(Tq, BM), B·H)."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1).to(tl.int64)
    roff = (bh % H) * RSTRIDE  # R's head: RSTRIDE = 0 when the heads share it
    offs_m = m0 + tl.arange(0, BM)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    dr = tl.arange(0, BDR)
    rows = offs_m < Tq
    q = _tile(Q, bh, offs_m, rows, Tq, DK, dk)
    qv = q
    if HAS_XL:
        qv = _tile(QV, bh, offs_m, rows, Tq, DR, dr)
    do = _tile(DO, bh, offs_m, rows, Tq, DV, dv)
    lse = tl.load(LSE + bh * Tq + offs_m, mask=rows, other=float("inf"))
    delta = tl.load(DELTA + bh * Tq + offs_m, mask=rows, other=0.0)
    acc_q = tl.zeros([BM, BDK], tl.float32)
    acc_l = tl.zeros([BM, BW], tl.float32)
    acc_qv = tl.zeros([BM, BDR], tl.float32)
    wcol = tl.arange(0, BW)
    wwin = tl.arange(0, WP)
    lo, hi = _key_range(m0, Tk, OFF, WIN, BM, BN, MODE)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        cols = offs_n < Tk
        km = _key_mask(KM, bh, offs_n, cols, Tk, HAS_KM)
        if tl.max(km.to(tl.int32), 0) > 0:
            k = _tile(K, bh, offs_n, cols, Tk, DK, dk)
            v = _tile(V, bh, offs_n, cols, Tk, DV, dv)
            s, rw = _logits(q, k, bh, m0, n0, offs_m, offs_n, Tq, Tk, scale, KB, L, qv, R, roff, Rlen, DR, XBASE,
                            SOFF, OFF, WIN, km, HAS_KB, HAS_SHAW, C, W, HAS_XL, BM, BN, WP, BDR, MODE, HAS_KM, PREC)
            p = tl.exp2(s - lse[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision=PREC)
            ds = p * (dp - delta[:, None])
            acc_q += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
            if HAS_SHAW:
                # the table columns this tile meets: clip(d) + c for d in [dmin, dmax]
                idx = tl.minimum(tl.maximum(SOFF + offs_m[:, None] - offs_n[None, :], -C), C) + C
                w_lo = tl.minimum(tl.maximum(SOFF + m0 - (n0 + BN - 1), -C), C) + C
                w_hi = tl.minimum(tl.maximum(SOFF + m0 + BM - 1 - n0, -C), C) + C + 1
                for wc in range(w_lo, w_hi):
                    col = tl.sum(tl.where(idx == wc, ds, 0.0), 1)
                    acc_l += tl.where(wcol[None, :] == wc, col[:, None], 0.0)
            if HAS_XL:
                # dS onto the tile's window of distances: column w holds pair (i, j - n0 = i - m0 - w + BN - 1)
                ji = tl.arange(0, BM)[:, None] - wwin[None, :] + (BN - 1)
                inw = (ji >= 0) & (ji < BN)
                dqr = tl.where(inw, tl.gather(ds, tl.minimum(tl.maximum(ji, 0), BN - 1), axis=1), 0.0)
                acc_qv += tl.dot(dqr.to(rw.dtype), rw, input_precision=PREC)
                drw = tl.dot(tl.trans(dqr).to(qv.dtype), qv, input_precision=PREC)  # (WP, BDR)
                r = XBASE + m0 - n0 - (BN - 1) + wwin
                tl.atomic_add(DRT + roff + r[:, None] * DR + dr[None, :], drw,
                              mask=((r >= 0) & (r < Rlen))[:, None] & (dr[None, :] < DR))
    tl.store(DQ + bh * Tq * DK + offs_m[:, None] * DK + dk[None, :], (acc_q * scale).to(DQ.dtype.element_ty),
             mask=rows[:, None] & (dk[None, :] < DK))
    if HAS_SHAW:
        tl.store(DL + bh * Tq * W + offs_m[:, None] * W + wcol[None, :], acc_l,
                 mask=rows[:, None] & (wcol[None, :] < W))
    if HAS_XL:
        tl.store(DQV + bh * Tq * DR + offs_m[:, None] * DR + dr[None, :], acc_qv.to(DQV.dtype.element_ty),
                 mask=rows[:, None] & (dr[None, :] < DR))
