r"""What the Triton kernels of the ``triton`` backend (:mod:`~kernel_attention.backends.triton_kernels`,
:mod:`~kernel_attention.backends.triton_squared_kernels`) share: loading and storing a tile, and the filter
computed per tile.

The filter keeps a pair where its band, its sparse pattern and, with ``HAS_KM``, the key mask (padding) all keep
it (:mod:`~kernel_attention.backends.triton_filters`), with d = i + off - j, off = Tk - Tq:

    MODE = 1   DLO <= d <= DHI                       PAT = 1   d < s or d % s == 0  (strided)
    HAS_KM     km[b, j]                              PAT = 2   j // s == p // s or j % s >= s - c  (fixed)

Tiles outside the band are never visited (:func:`_key_range`, :func:`_query_range`), nor a tile the pattern
cannot keep (:func:`_tile_meets`) nor a key tile whose mask is all False; partial tiles are masked per pair.
Without a pattern or a key mask every tile of the band's range is read, which each kernel's loop fixes at compile
time (``PAT == 0 and not HAS_KM``) rather than testing it per tile with :func:`_visits`: with no branch around a
tile's loads, Triton pipelines them (the next tiles are copied while the current one computes).

:func:`filter_keep` writes the pairs the kernels keep as a mask, for tests.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = ["INTERPRETED", "filter_keep"]

#: whether the kernels were built for Triton's interpreter (TRITON_INTERPRET=1 when this module, which every kernel
#: module imports, was first imported): they then run on CPU tensors, one program after the other
INTERPRETED = (bool(triton.knobs.runtime.interpret) if hasattr(triton, "knobs")  # Triton >= 3.4
               else os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes"))


@triton.jit
def _tile(X, bh, offs, valid, T, D, d):
    """Rows ``offs`` of the (B·H, T, D) tensor X for program ``bh``, columns ``d``: a (len(offs), len(d)) tile,
    0 where a row is not ``valid`` or a column is past D."""
    return tl.load(X + bh * T * D + offs[:, None] * D + d[None, :], mask=valid[:, None] & (d[None, :] < D),
                   other=0.0)


@triton.jit
def _store_tile(X, bh, offs, valid, T, D, d, x):
    """Write the tile x (len(offs), len(d)), in X's dtype, to the rows and columns of the (B·H, T, D) tensor X that
    :func:`_tile` reads: the ``valid`` rows, the columns below D."""
    tl.store(X + bh * T * D + offs[:, None] * D + d[None, :], x.to(X.dtype.element_ty),
             mask=valid[:, None] & (d[None, :] < D))


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
def _visits(m0, n0, km, OFF, DLO, DHI, STRIDE, SC, BM: tl.constexpr, BN: tl.constexpr, PAT: tl.constexpr):
    """Whether a tile in the band's range is read: the pattern may keep a pair of it and a key of it is real."""
    return _tile_meets(m0, n0, OFF, DLO, DHI, STRIDE, SC, BM, BN, PAT) & (tl.max(km.to(tl.int32), 0) > 0)


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
