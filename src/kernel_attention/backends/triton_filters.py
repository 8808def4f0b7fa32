r"""The filters of the ``triton`` backend's kernels: a call's filter read as a band, a sparse pattern and a key
mask, which the kernels compute per tile from the pair's indices (no (Tq, Tk) mask is formed).

With off = Tk - Tq (queries aligned to the lower right: query i sits at key position p = i + off) and the pair's
distance d = p - j, a pair is kept when each part keeps it:

===========  ==========================================================  =========================================
part         keeps (i, j) when                                           from the filters
===========  ==========================================================  =========================================
band         lo <= d <= hi (either side open)                            causal, memory, local
pattern      strided: d < s or d % s == 0                                strided (Sparse Transformer, Child et al.)
             fixed:   j // s == p // s or j % s >= s - c                 fixed (its "summary" cells)
key mask     km[b, h, j]                                                 padding, cross, a call's key mask
===========  ==========================================================  =========================================

causal is the band d >= 0; local:window=w is -w <= d <= w; memory is causal, and with ``same_length`` also
d <= off + shift - 1 (Transformer-XL's j > i - shift, :class:`~kernel_attention.filters.Memory`); strided and
fixed are d >= 0 with their pattern (on d >= 0 the remainders and quotients of C's truncating division, which the
kernels use, equal Python's).  An intersection (``&``) of these intersects the bands and the key masks and keeps
at most one pattern.  A union other than one that keeps every key, a boolean mask tensor, and two patterns in one
intersection are not computed per tile.

The kernels skip a key tile outside the band (its range of d), one of padding alone, and one whose range of
distances and of blocks the pattern never keeps (:func:`~kernel_attention.backends.triton_tiles._tile_meets`);
partial tiles are masked per pair.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from kernel_attention.backends.base import Problem, key_only_mask
from kernel_attention.filters import And, Causal, Fixed, Local, MaskFilter, Memory, Padding, Strided

__all__ = ["TileFilter", "tile_filter", "kept_keys", "kept_key_log", "OPEN", "NO_PATTERN", "STRIDED", "FIXED"]

#: an open side of the band: |d| never reaches it (kernel arguments are 32-bit; d + OPEN stays below 2^31)
OPEN = 1 << 30
NO_PATTERN, STRIDED, FIXED = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class TileFilter:
    """The band lo <= d <= hi (None: open), the sparse pattern (``NO_PATTERN``, ``STRIDED`` or ``FIXED``, with
    its ``stride`` s and ``c``) and off = Tk - Tq; ``names`` are the filters it came from, for
    :meth:`~kernel_attention.backends.triton_flash.TritonBackend.describe`."""

    off: int
    lo: int | None = None
    hi: int | None = None
    pattern: int = NO_PATTERN
    stride: int = 1
    c: int = 0
    names: tuple = ()

    @property
    def banded(self) -> bool:
        return self.lo is not None or self.hi is not None

    def args(self) -> list[int]:
        """[banded, off, lo, hi, pattern, stride, c]: the kernels' filter arguments (open sides as -+OPEN)."""
        return [int(self.banded), self.off, -OPEN if self.lo is None else self.lo,
                OPEN if self.hi is None else self.hi, self.pattern, self.stride, self.c]

    def meet(self, lo: int | None = None, hi: int | None = None, **kw) -> "TileFilter":
        """This filter intersected with the band [lo, hi] (and a pattern in ``kw``)."""
        lo = self.lo if lo is None else lo if self.lo is None else max(self.lo, lo)
        hi = self.hi if hi is None else hi if self.hi is None else min(self.hi, hi)
        return dataclasses.replace(self, lo=lo, hi=hi, **kw)


def _leaves(f) -> list:
    """The filters an intersection is made of (a filter that is no intersection: itself)."""
    return _leaves(f.a) + _leaves(f.b) if isinstance(f, And) else [f]


def _and(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    return b if a is None else a if b is None else a & b


def _as_key_mask(km: Tensor | None) -> Tensor | None:
    """A (B, Tk) key mask as (B, 1, 1, Tk), the kernels' (B|1, H|1, 1, Tk) layout."""
    return None if km is None else km[:, None, None, :]


def tile_filter(p: Problem) -> tuple[TileFilter, Tensor | None] | str:
    """(the band and pattern, the key mask (B|1, H|1, 1, Tk) bool or None) whose intersection is ``p``'s filter,
    or why ``p``'s filter is not such an intersection.  Shapes, types and the filters' parameters only; formed
    once per call (``p.memo``: the backends' checks and their run both read it)."""
    if "tile_filter" not in p.memo:
        p.memo["tile_filter"] = _tile_filter(p)
    return p.memo["tile_filter"]


def _tile_filter(p: Problem) -> tuple[TileFilter, Tensor | None] | str:
    b, h, tq, tk = p.shape
    tf = TileFilter(off=tk - tq)
    if p.full:
        return tf, None
    if p.key_only:  # padding alone, or a mask tensor of the key alone
        return dataclasses.replace(tf, names=("padding",)), key_only_mask(p)
    f = p.filter
    if f is None:
        return "a mask without its filter is not computed per tile"
    km = None
    for leaf in _leaves(f):
        if isinstance(leaf, Padding):  # padding and cross: their own key mask, else the call's
            own = leaf.key_mask if leaf.key_mask is not None else p.key_mask if leaf.needs_key_mask else None
            km = _and(km, own)
            tf = dataclasses.replace(tf, names=tf.names + ("padding",) * (own is not None))
        elif leaf.kind == "full" and not leaf.needs_key_mask:
            continue
        elif isinstance(leaf, Local):
            tf = tf.meet(-leaf.window, leaf.window, names=tf.names + (f"local(window={leaf.window})",))
        elif isinstance(leaf, Memory) and leaf.same_length:
            tf = tf.meet(0, tf.off + leaf.shift(tq, tk) - 1, names=tf.names + (repr(leaf),))
        elif isinstance(leaf, (Strided, Fixed)):
            if tf.pattern != NO_PATTERN:
                return f"filter {f!r}: two sparse patterns in one intersection"
            pattern, c = (STRIDED, 0) if isinstance(leaf, Strided) else (FIXED, leaf.c)
            tf = tf.meet(0, None, pattern=pattern, stride=leaf.stride, c=c, names=tf.names + (repr(leaf),))
        elif isinstance(leaf, (Causal, Memory)) or (leaf.kind == "causal" and not leaf.needs_key_mask):
            tf = tf.meet(0, None, names=tf.names + ("causal",))
        elif isinstance(leaf, MaskFilter):
            return "a boolean mask tensor is not computed per tile"
        else:
            return (f"filter {f!r}: {leaf!r} is not full, causal, memory, local, strided, fixed or padding (nor an "
                    f"intersection of them)")
    if p.key_mask is not None and not f.needs_key_mask:  # functional.resolve_mask: the filter & the key mask
        km = _and(km, p.key_mask)
        tf = dataclasses.replace(tf, names=tf.names + ("padding",))
    return tf, _as_key_mask(km)


def kept_keys(tf: TileFilter, tq: int, tk: int, device=None) -> Tensor:
    """(Tk,) bool: the keys that some query keeps under the band and pattern of ``tf`` (not the key mask), from
    each key's range of distances, O(Tk): key j meets the queries at p in [pa, pb] = [max(off, j + lo),
    min(Tq - 1 + off, j + hi)], d in [pa - j, pb - j]."""
    _, off, lo, hi, pattern, s, c = tf.args()
    j = torch.arange(tk, device=device)
    pa = torch.clamp(j + lo, min=off)
    pb = torch.clamp(j + hi, max=tq - 1 + off)
    kept = pa <= pb
    da, db = pa - j, pb - j  # the pattern's band has lo >= 0, so da >= 0 below
    if pattern == STRIDED:  # d < s, or a multiple of s in [da, db]
        kept &= (da < s) | ((da + s - 1) // s * s <= db)
    if pattern == FIXED:  # a summary key, or a query in j's own block (p >= j, so p <= the block's last key)
        kept &= (j % s >= s - c) | (pa <= j // s * s + s - 1)
    return kept


def kept_key_log(p: Problem, tf: TileFilter, km: Tensor | None) -> Tensor:
    """The kernel's per-key log factor m (B, H, Tk), -inf at the keys no query keeps under the band and pattern
    ``tf`` and the key mask ``km`` (B|1, H|1, 1, Tk) bool or None; formed from the key positions alone, no
    (Tq, Tk) mask.  ``tf`` and ``km`` are :func:`tile_filter`'s for ``p``, so the result is formed once per call
    (``p.memo``: the range check and the run both read it)."""
    if "kept_key_log" not in p.memo:
        p.memo["kept_key_log"] = _kept_key_log(p, tf, km)
    return p.memo["kept_key_log"]


def _kept_key_log(p: Problem, tf: TileFilter, km: Tensor | None) -> Tensor:
    b, h, tq, tk = p.shape
    m = p.kernel.squared_key_log(p.k).expand(b, h, tk)
    kept = kept_keys(tf, tq, tk, m.device)
    if km is not None:
        kept = kept & km.reshape(km.shape[0], km.shape[1], tk)
    return m.masked_fill(~kept, float("-inf"))
