r"""Shaw's clipped table per tile, for the flash kernels of the ``triton`` backend
(:mod:`~kernel_attention.backends.triton_kernels`).

A pair (i, j) reads row idx_ij = clip(o + i - j, -c, c) + c of a per-row table X (B·H, Tq, W), W = 2c + 1: Shaw's
logits L[i, idx_ij] (Transformer Dissection Eq. 6) and, with the value table, the gradient dHv[i, idx_ij]; the
forward's Hv and the backward's dL sum a tile's values per table row.  Every pair of a tile far enough from the
diagonal reads one row, 2c (all distances >= c) or 0 (all <= -c), so the kernels' loops run in three segments
(:func:`_near_tiles` over the keys of a query tile, :func:`_near_query_tiles` over the queries of a key tile):
the far tiles on either side take that one column per row (:func:`_add_table` with ``COL`` >= 0) and sum their
rows into a vector, the near tiles gather per pair and sum per table row (:func:`_onto_table`).  No loop inside
the far loops, so Triton pipelines them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _shaw_index(offs_m, offs_n, SOFF, C: tl.constexpr):
    """(BM, BN): the table row clip(o + i - j, -c, c) + c of each pair."""
    return tl.minimum(tl.maximum(SOFF + offs_m[:, None] - offs_n[None, :], -C), C) + C


@triton.jit
def _add_table(x, X, bh, offs_m, offs_n, Tq, Tk, SOFF, C: tl.constexpr, W: tl.constexpr, COL: tl.constexpr):
    """x (BM, BN) plus X[bh, i, idx_ij] of a (B·H, Tq, W) per-row table (0 outside the tensors): gathered per pair
    (COL < 0), or, for a far tile, whose pairs all read one column COL (0 or 2c), that column loaded once per row."""
    if COL < 0:
        inb = (offs_m[:, None] < Tq) & (offs_n[None, :] < Tk)
        idx = _shaw_index(offs_m, offs_n, SOFF, C)
        return x + tl.load(X + bh * Tq * W + offs_m[:, None] * W + idx, mask=inb, other=0.0)
    else:
        return x + tl.load(X + bh * Tq * W + offs_m * W + COL, mask=offs_m < Tq, other=0.0)[:, None]


@triton.jit
def _onto_table(acc, x, offs_m, offs_n, m0, n0, SOFF, C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BW: tl.constexpr):
    """acc (BM, BW) plus x (BM, BN) summed per table row, acc[i, w] += sum_{j: idx_ij = w} x_ij, for a near tile:
    a loop over the table rows clip(d) + c of its distances d in [o + m0 - (n0 + BN - 1), o + m0 + BM - 1 - n0]."""
    idx = _shaw_index(offs_m, offs_n, SOFF, C)
    wcol = tl.arange(0, BW)
    w_lo = tl.minimum(tl.maximum(SOFF + m0 - (n0 + BN - 1), -C), C) + C
    w_hi = tl.minimum(tl.maximum(SOFF + m0 + BM - 1 - n0, -C), C) + C + 1
    for wc in range(w_lo, w_hi):
        col = tl.sum(tl.where(idx == wc, x, 0.0), 1)
        acc += tl.where(wcol[None, :] == wc, col[:, None], 0.0)
    return acc


@triton.jit
def _split_tiles(lo, hi, x, y, STEP: tl.constexpr):
    """(a, b): a loop over the tiles starting at lo + k·STEP below hi, in three segments: [lo, a) the tiles starting
    at or before x, [b, hi) those starting at or after y, [a, b) the rest."""
    a = tl.where(x >= lo, lo + ((x - lo) // STEP + 1) * STEP, lo)
    b = tl.where(y > lo, lo + ((y - lo + STEP - 1) // STEP) * STEP, lo)
    a = tl.minimum(a, hi)
    return a, tl.minimum(tl.maximum(b, a), hi)


@triton.jit
def _near_tiles(m0, lo, hi, SOFF, C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    """(a, b): the key tiles [lo, hi) of a query tile at m0 in three segments by the rows of Shaw's table their pairs
    fall on: [lo, a) every distance o + i - j >= c (row 2c), [a, b) several rows, [b, hi) every distance <= -c
    (row 0); (hi, hi), one segment, unless SPLIT (no table)."""
    if SPLIT:
        return _split_tiles(lo, hi, SOFF + m0 - (BN - 1) - C, SOFF + m0 + BM - 1 + C, BN)
    else:
        return hi, hi


@triton.jit
def _near_query_tiles(n0, lo, hi, SOFF, C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    """(a, b): the query tiles [lo, hi) of a key tile at n0 in three segments, as :func:`_near_tiles`: [lo, a) every
    distance <= -c (row 0), [a, b) several rows, [b, hi) every distance >= c (row 2c); (hi, hi) unless SPLIT."""
    if SPLIT:
        return _split_tiles(lo, hi, n0 - (BM - 1) - C - SOFF, n0 + BN - 1 + C - SOFF, BM)
    else:
        return hi, hi


@triton.jit
def _segment(SEG: tl.constexpr, lo, a, b, hi):
    """[start, end) of segment SEG of a loop that :func:`_near_tiles` or :func:`_near_query_tiles` split at a, b."""
    start = lo if SEG == 0 else (a if SEG == 1 else b)
    end = a if SEG == 0 else (b if SEG == 1 else hi)
    return start, end
