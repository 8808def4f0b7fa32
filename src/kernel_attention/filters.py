r"""Set filtering functions M(x_q, S_k) (Transformer Dissection, Section 2.2.4).

A filter decides which keys each query may see.  It is materialised as a boolean mask of shape
(Tq, Tk) -- or (B, 1, Tq, Tk) when it depends on the batch -- where ``True`` means *the key takes part*,
the convention of :func:`torch.nn.functional.scaled_dot_product_attention`.

Sequence filters compare positions on one axis.  When there are fewer queries than keys (a
Transformer-XL memory in front of the segment, or incremental decoding) queries are aligned to the
*lower right*: query i sits at key position ``i + (Tk - Tq)``, as ``torch.nn.attention.bias.causal_lower_right``.

Filters compose: ``a & b`` keeps keys both keep (intersection of the sets), ``a | b`` keeps keys either
keeps (union); the spec ``"causal&local:window=8"`` reads the same (``&`` binds tighter than ``|``).
They also say what they are (``kind``) so that fast paths can be chosen without looking at the mask.

===============  ======================================================================
name             M(x_q, S) for query i (aligned position p = i + Tk - Tq), key j
===============  ======================================================================
full             every key                                        (encoder self-attention)
padding          every key that is not padding (needs ``key_mask``)
cross            every encoder key that is not padding            (encoder-decoder attention)
causal           j <= p                                           (decoder self-attention, S_1)
memory           j <= p; with same_length also j > p - mem_len    (Transformer-XL, S_1 + S_mem)
local            |p - j| <= window
strided          j <= p and ((p - j) < stride or (p - j) % stride == 0)       (Child et al.)
fixed            j <= p and (j // stride == p // stride or j % stride >= stride - c)
===============  ======================================================================
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from kernel_attention.registry import Param, Registry, SpecError

__all__ = ["Filter", "FILTERS", "make_filter", "Full", "Padding", "Causal", "Memory", "Local", "Strided",
           "Fixed", "MaskFilter", "And", "Or"]


class Filter:
    """A set filtering function.  Subclasses implement :meth:`mask`.

    ``kind`` is ``"full"`` when every key is kept, ``"causal"`` for the lower-right causal set, and
    ``None`` otherwise; ``needs_key_mask`` says the filter reads the batch's padding mask.
    """

    name = "filter"
    kind: str | None = None
    needs_key_mask = False
    #: each query's kept keys are one range of positions (so the intersection of two such filters is one too)
    contiguous = False

    @property
    def by_spec(self) -> bool:
        """Whether the mask is a function of the filter's spec and (Tq, Tk) alone, given no call-time
        key mask: no tensor of its own, no padding of the batch (so a mask built for it can be kept, under
        :attr:`spec_key`).  A subclass with attributes counts only where it defines a ``__repr__``, which must
        then name every attribute its mask reads."""
        return not self.needs_key_mask and (type(self).__repr__ is not Filter.__repr__ or not vars(self))

    @property
    def spec_key(self) -> tuple:
        """What a kept mask of a :attr:`by_spec` filter is filed under: its class and its repr."""
        return type(self), repr(self)

    def mask(self, tq: int, tk: int, device=None, key_mask: Tensor | None = None) -> Tensor:
        """Boolean (Tq, Tk) or (B, 1, Tq, Tk); True = the key takes part."""
        raise NotImplementedError

    def row_bounds(self, tq: int, tk: int, device=None) -> tuple[Tensor, Tensor] | None:
        """``(lo, hi)``, (Tq,) int64 each: per query, the first kept key and one past the last (lo >= hi: the
        query keeps none), read off the filter's rule without forming its (Tq, Tk) mask; None where the rule
        does not give them (a mask tensor, padding).  What a block plan and ``explain`` need of a mask."""
        return None

    def __and__(self, other: "Filter") -> "Filter":
        return And(self, make_filter(other))

    def __or__(self, other: "Filter") -> "Filter":
        return Or(self, make_filter(other))

    def __repr__(self) -> str:
        return self.name


def _grid(tq: int, tk: int, device) -> tuple[Tensor, Tensor]:
    """Aligned query positions p (Tq, 1) and key positions j (1, Tk)."""
    p = torch.arange(tk - tq, tk, device=device).unsqueeze(1)
    j = torch.arange(tk, device=device).unsqueeze(0)
    return p, j


def _positions(tq: int, tk: int, device) -> Tensor:
    """Aligned query positions p, (Tq,) int64."""
    return torch.arange(tk - tq, tk, device=device)


def _clip(lo: Tensor, hi: Tensor, tk: int) -> tuple[Tensor, Tensor]:
    return lo.clamp(0, tk), hi.clamp(0, tk)


def _causal_rows(p: Tensor, lo: Tensor, tk: int) -> tuple[Tensor, Tensor]:
    """Bounds of a subset of the causal set that keeps the diagonal: ``lo`` to p; none for p < 0."""
    keeps = p >= 0
    return _clip(torch.where(keeps, lo, 0), torch.where(keeps, p + 1, 0), tk)


FILTERS = Registry("filter", base=Filter)


@FILTERS.register("full")
class Full(Filter):
    """Every key takes part (encoder self-attention)."""

    name, kind = "full", "full"
    contiguous = True

    def mask(self, tq, tk, device=None, key_mask=None):
        return torch.ones(tq, tk, dtype=torch.bool, device=device)

    def row_bounds(self, tq, tk, device=None):
        return torch.zeros(tq, dtype=torch.long, device=device), torch.full((tq,), tk, device=device)


@FILTERS.register("padding")
class Padding(Filter):
    """Every key that is not padding.  ``key_mask`` (B, Tk), True = real token, comes with the batch
    or is fixed at construction (``Padding(key_mask)``)."""

    name = "padding"
    needs_key_mask = True

    def __init__(self, key_mask: Tensor | None = None):
        self.key_mask = key_mask

    @property
    def by_spec(self) -> bool:
        return not self.needs_key_mask and self.key_mask is None

    def mask(self, tq, tk, device=None, key_mask=None):
        km = self.key_mask if self.key_mask is not None else key_mask
        if km is None:
            raise ValueError("filter 'padding' needs a key mask: pass key_mask=(B, Tk) bool, True = real token")
        if km.dtype != torch.bool or km.dim() != 2 or km.shape[1] != tk:
            raise ValueError(f"filter 'padding': key_mask must be bool of shape (B, {tk}), got "
                             f"{tuple(km.shape)} {km.dtype}")
        return km[:, None, None, :].expand(km.shape[0], 1, tq, tk).to(device)

    @classmethod
    def from_lengths(cls, lengths: Tensor, tk: int) -> "Padding":
        """Padding filter for sequences of the given lengths (B,) padded to Tk."""
        return cls(torch.arange(tk, device=lengths.device)[None, :] < lengths[:, None])


@FILTERS.register("cross")
class Cross(Padding):
    """Encoder-decoder attention: every encoder key that is not padding (no key mask = all keys)."""

    name = "cross"
    needs_key_mask = False
    contiguous = True

    def row_bounds(self, tq, tk, device=None):
        return Full.row_bounds(self, tq, tk, device) if self.key_mask is None else None

    def mask(self, tq, tk, device=None, key_mask=None):
        if self.key_mask is None and key_mask is None:
            return torch.ones(tq, tk, dtype=torch.bool, device=device)
        return super().mask(tq, tk, device, key_mask)


@FILTERS.register("causal")
class Causal(Filter):
    """Decoder self-attention S_1: key j is kept when j <= p (lower-right aligned)."""

    name, kind = "causal", "causal"
    contiguous = True

    def mask(self, tq, tk, device=None, key_mask=None):
        p, j = _grid(tq, tk, device)
        return j <= p

    def row_bounds(self, tq, tk, device=None):
        p = _positions(tq, tk, device)
        return _clip(torch.zeros_like(p), p + 1, tk)


@FILTERS.register("memory", [
    Param("same_length", bool, False, doc="every query sees the same number of keys (TXL evaluation)"),
    Param("mem_len", int, None, optional=True, check=lambda x: x >= 1,
          rule=">= 1, with same_length: the keys each query sees; default Tk - Tq, the memory present"),
])
class Memory(Filter):
    """Transformer-XL: the segment's causal set plus the cached memory, S_1 + S_mem.

    Keys are ``[memory; segment]`` (Tk = M + Tq).  Query i sees j <= i + M.  With ``same_length``
    (Transformer-XL's evaluation setting) it also drops the oldest keys so that every query sees the
    same number of keys (``mem_len`` when the memory is full): exactly TXL's
    ``triu(ones, 1 + mlen) + tril(ones, -mask_shift_len)``.
    """

    name = "memory"
    contiguous = True

    def __init__(self, same_length: bool = False, mem_len: int | None = None):
        if mem_len is not None and not same_length:
            raise SpecError(f"filter 'memory': mem_len={mem_len} sets the window of same_length=true; without it "
                            f"every query sees the whole memory given (Tk - Tq keys): drop mem_len or add "
                            f"same_length=true")
        self.same_length, self.mem_len = same_length, mem_len
        self.kind = None if same_length else "causal"

    def shift(self, tq: int, tk: int) -> int:
        """With ``same_length``: key j is dropped for query i when j <= i - shift, TXL's ``mask_shift_len``
        (``mask_len = klen - mem_len``; shift = qlen - mask_len, or qlen when mask_len <= 0)."""
        mem_len = tk - tq if self.mem_len is None else self.mem_len
        if mem_len <= 0:
            why = (f"mem_len={mem_len}" if self.mem_len is not None else
                   f"no memory given (Tq = {tq}, Tk = {tk}) and no mem_len")
            raise ValueError(f"filter {self!r}: {why}, so every query would see no key; give the layer a memory "
                             f"or set mem_len >= 1")
        mask_len = tk - mem_len
        return tq - mask_len if mask_len > 0 else tq

    def mask(self, tq, tk, device=None, key_mask=None):
        p, j = _grid(tq, tk, device)
        keep = j <= p
        if self.same_length:
            i = torch.arange(tq, device=device).unsqueeze(1)
            keep = keep & (j > i - self.shift(tq, tk))
        return keep

    def row_bounds(self, tq, tk, device=None):
        p = _positions(tq, tk, device)
        if not self.same_length:
            return _clip(torch.zeros_like(p), p + 1, tk)
        return _clip(torch.arange(tq, device=device) - self.shift(tq, tk) + 1, p + 1, tk)

    def __repr__(self):
        return f"memory(same_length={self.same_length}, mem_len={self.mem_len})"


@FILTERS.register("local", [Param("window", int, check=lambda x: x >= 0, rule=">= 0")])
class Local(Filter):
    """Keys within ``window`` positions of the query, |p - j| <= window (compose with causal for a
    one-sided window)."""

    name = "local"
    contiguous = True

    def __init__(self, window: int):
        self.window = window

    def mask(self, tq, tk, device=None, key_mask=None):
        p, j = _grid(tq, tk, device)
        # comparisons of the (Tq, 1) and (1, Tk) positions: one byte per pair, no (Tq, Tk) int64 distances
        return (j >= p - self.window) & (j <= p + self.window)

    def row_bounds(self, tq, tk, device=None):
        p = _positions(tq, tk, device)
        return _clip(p - self.window, p + self.window + 1, tk)

    def __repr__(self):
        return f"local(window={self.window})"


@FILTERS.register("strided", [Param("stride", int, check=lambda x: x >= 1, rule=">= 1")])
class Strided(Filter):
    """Sparse Transformer strided pattern (Child et al. 2019): the previous ``stride`` positions and
    every ``stride``-th position before them; a subset of S_1."""

    name = "strided"

    def __init__(self, stride: int):
        self.stride = stride

    def mask(self, tq, tk, device=None, key_mask=None):
        p, j = _grid(tq, tk, device)
        # (p - j) % stride == 0 as p % stride == j % stride: bool (Tq, Tk) only, no int64 distances
        return (j <= p) & ((j > p - self.stride) | (p % self.stride == j % self.stride))

    def row_bounds(self, tq, tk, device=None):
        # the first kept key: p mod stride (the pattern's earliest) or the recent window's start
        p = _positions(tq, tk, device)
        lo = torch.minimum(p.remainder(self.stride), (p - self.stride + 1).clamp(min=0))
        return _causal_rows(p, lo, tk)

    def __repr__(self):
        return f"strided(stride={self.stride})"


@FILTERS.register("fixed", [
    Param("stride", int, check=lambda x: x >= 1, rule=">= 1"),
    Param("c", int, 1, check=lambda x: x >= 1, rule=">= 1, <= stride"),
])
class Fixed(Filter):
    """Sparse Transformer fixed pattern (Child et al. 2019): the query's own block of ``stride``
    positions, plus the last ``c`` positions of every block ("summary" cells); a subset of S_1."""

    name = "fixed"

    def __init__(self, stride: int, c: int = 1):
        if c > stride:
            raise SpecError(f"filter 'fixed': c={c} must be <= stride={stride}")
        self.stride, self.c = stride, c

    def mask(self, tq, tk, device=None, key_mask=None):
        p, j = _grid(tq, tk, device)
        same_block = (j // self.stride) == (p // self.stride)
        summary = (j % self.stride) >= (self.stride - self.c)
        return (j <= p) & (same_block | summary)

    def row_bounds(self, tq, tk, device=None):
        # the first kept key: the query's block start, or the first summary cell (stride - c) when it is behind p
        p = _positions(tq, tk, device)
        start = p.div(self.stride, rounding_mode="floor") * self.stride
        first = self.stride - self.c
        lo = torch.where(p >= first, start.clamp(max=first), start)
        return _causal_rows(p, lo, tk)

    def __repr__(self):
        return f"fixed(stride={self.stride}, c={self.c})"


class MaskFilter(Filter):
    """A user's boolean mask, broadcastable to (B, H, Tq, Tk), True = the key takes part."""

    name = "mask"

    def __init__(self, mask: Tensor):
        if mask.dtype != torch.bool:
            raise TypeError(f"MaskFilter needs a bool mask (True = the key takes part), got {mask.dtype}; a float "
                            f"mask (added to log k) goes to attention(..., mask=) or a layer call's mask=")
        self.tensor = mask

    by_spec = False

    def mask(self, tq, tk, device=None, key_mask=None):
        last = tuple(self.tensor.shape[-2:])
        if not last or any(a not in (1, b) for a, b in zip(reversed(last), (tk, tq))):
            raise ValueError(f"mask of shape {tuple(self.tensor.shape)} does not broadcast to (..., Tq={tq}, "
                             f"Tk={tk})")
        return self.tensor.to(device)


class _Combined(Filter):
    op = "?"

    def __init__(self, a: Filter, b: Filter):
        self.a, self.b = a, b
        self.needs_key_mask = a.needs_key_mask or b.needs_key_mask

    @property
    def by_spec(self) -> bool:
        return self.a.by_spec and self.b.by_spec

    def __repr__(self):
        return f"({self.a!r} {self.op} {self.b!r})"


class And(_Combined):
    """Intersection: keys that both filters keep."""

    op = "&"

    def __init__(self, a, b):
        super().__init__(a, b)
        kinds = {a.kind, b.kind}
        # full & X == X, so the intersection keeps the other side's kind.
        self.kind = (kinds - {"full"}).pop() if "full" in kinds and len(kinds) == 2 else (
            a.kind if a.kind == b.kind else None)
        self.contiguous = a.contiguous and b.contiguous

    def mask(self, tq, tk, device=None, key_mask=None):
        return self.a.mask(tq, tk, device, key_mask) & self.b.mask(tq, tk, device, key_mask)

    def row_bounds(self, tq, tk, device=None):
        # full & X is X; two ranges intersect in a range; other intersections are not told by their bounds
        if "full" in (self.a.kind, self.b.kind):
            return (self.b if self.a.kind == "full" else self.a).row_bounds(tq, tk, device)
        a, b = self.a.row_bounds(tq, tk, device), self.b.row_bounds(tq, tk, device)
        if a is None or b is None or not self.contiguous:
            return None
        return torch.maximum(a[0], b[0]), torch.minimum(a[1], b[1])


class Or(_Combined):
    """Union: keys that either filter keeps."""

    op = "|"

    def __init__(self, a, b):
        super().__init__(a, b)
        self.kind = "full" if "full" in (a.kind, b.kind) else (a.kind if a.kind == b.kind else None)

    def mask(self, tq, tk, device=None, key_mask=None):
        return self.a.mask(tq, tk, device, key_mask) | self.b.mask(tq, tk, device, key_mask)

    def row_bounds(self, tq, tk, device=None):
        # a union's first and last kept keys are those of the side that keeps any, the extremes of both
        a, b = self.a.row_bounds(tq, tk, device), self.b.row_bounds(tq, tk, device)
        if a is None or b is None:
            return None
        (la, ha), (lb, hb) = a, b
        ea, eb = la >= ha, lb >= hb
        lo = torch.minimum(la.masked_fill(ea, tk), lb.masked_fill(eb, tk))
        return lo, torch.maximum(ha.masked_fill(ea, 0), hb.masked_fill(eb, 0))


def make_filter(spec, **params) -> Filter:
    """A filter from a :class:`Filter`, a bool tensor, a name/spec, or a composed string
    ``"causal&local:window=8|strided:stride=4"`` (``&`` binds tighter than ``|``).  ``params`` are a named
    filter's parameters: ``make_filter("local", window=8)`` is ``make_filter("local:window=8")``."""
    if params:
        if not isinstance(spec, (str, Mapping)) or isinstance(spec, str) and ("|" in spec or "&" in spec):
            raise SpecError(f"filter parameters as keywords go with one filter's name, not {spec!r}: write them in "
                            f"the spec ('local:window=8&causal')")
        spec = FILTERS.with_params(spec, params)[0]
    if isinstance(spec, Filter):
        return spec
    if isinstance(spec, Tensor):
        return MaskFilter(spec)
    if isinstance(spec, str) and ("|" in spec or "&" in spec):
        operands = [s.strip() for alt in spec.split("|") for s in alt.split("&")]
        if not all(operands):
            raise SpecError(f"filter expression {spec!r} has an empty operand: write filters joined by & "
                            f"(both keep a key) and | (either does), e.g. 'causal&local:window=8|strided:stride=4'")
        result = None
        for alt in spec.split("|"):
            parts = [make_filter(s.strip()) for s in alt.split("&")]
            term = parts[0]
            for p in parts[1:]:
                term = And(term, p)
            result = term if result is None else Or(result, term)
        return result
    return FILTERS.create(spec)
