r"""How positions t enter the kernel (Transformer Dissection, Section 2.2.2 and Eq. 9).

x = (f, t): f is the non-positional feature, t the position.  A positional scheme is built per
attention layer and is handed f and the integer positions at *every* layer, so f and t stay separate
through the whole network.  It acts in one (or both) of two places:

* ``inputs(f, pos)``: before the projections -- the direct sum f + t of Eq. 4;
* ``terms(q, k, pos_q, pos_k)``: a positional factor of a product kernel, returned as
  :class:`~kernel_attention.smoother.PositionalTerms` holding log k_T.

With d the per-head dimension, r = t_q - t_k the relative distance (per axis) and q, k the per-head
projected features:

========  ====================================================================  ==================
name      kernel                                                                 paper
========  ====================================================================  ==================
none      k_F(f_q, f_k)                                                          sets (X = F)
absolute  k_F(f_q + t_q, f_k + t_k), t sinusoidal or learned                     Eq. 4, Vaswani
shaw      k_F(f_q, f_k) · exp(q·a^K_{clip(r)} / sqrt(d))                         Eq. 6, Shaw et al.
xl        k_F(f_q, f_k) · exp((u·k + (q + v)·W_R R_r) / sqrt(d))                 Eq. 5, Dai et al.
product   k_F(f_q, f_k) · exp(<t_q W_T, t_k W_T> / sqrt(d))                      Eq. 9, Tsai et al.
========  ====================================================================  ==================

With several position axes (e.g. height x width), ``shaw``, ``xl`` and ``product`` multiply one
positional kernel per axis (their logs add); ``absolute`` gives each axis its share of the encoding.
Relative schemes never build a (T, T, d) tensor: they project the R distinct distances once, form
(Tq, R) logits and read them at an index of the pairs; for integer positions that index is a
:class:`~kernel_attention.positions.difference_index.DifferenceIndex`, t_q - t_k kept as the two position
vectors and formed a block of pairs at a time, so no (T, T) tensor either.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from kernel_attention.positions.difference_index import DifferenceIndex
from kernel_attention.positions.encodings import as_positions, make_encoding, sinusoid_range
from kernel_attention.registry import Param, Registry
from kernel_attention.smoother import PositionalTerms

__all__ = ["PositionScheme", "POSITIONS", "make_position", "NoPosition", "AbsolutePosition", "ShawPosition",
           "XLPosition", "ProductPosition", "relative_distance"]


def relative_distance(pos_q: Tensor, pos_k: Tensor) -> Tensor:
    """t_q - t_k per axis: (Bp, Tq, A), (Bp, Tk, A) -> (Bp, Tq, Tk, A)."""
    return pos_q[:, :, None, :] - pos_k[:, None, :, :]


def _integral(x: Tensor) -> bool:
    return not x.is_floating_point() or bool((x == x.round()).all())


def _pair_index(pq: Tensor, pk: Tensor, shift: int = 0, clip: int | None = None,
                offset: int | None = None) -> DifferenceIndex | Tensor:
    """Row of a table for each (query, key) pair of one axis, pq (Bp, Tq) and pk (Bp, Tk): t_q - t_k - shift, or
    clip(t_q - t_k, -clip, clip) + clip.  Integer positions give a :class:`DifferenceIndex` (O(Tq + Tk), no
    (Tq, Tk) tensor); others the materialised (Bp, Tq, Tk) index, the distances truncated to integers.
    ``offset``: the positions are the defaults, t_q = offset + i and t_k = j (:meth:`PositionScheme.terms`)."""
    if offset is not None:
        return DifferenceIndex(pq.long() - shift, pk.long(), clip, known_offset=offset - shift)
    if _integral(pq) and _integral(pk):
        return DifferenceIndex(pq.long() - shift, pk.long(), clip)
    d = pq[:, :, None] - pk[:, None, :]
    return d.long() - shift if clip is None else d.clamp(-clip, clip).long() + clip


def _distance_range(pq: Tensor, pk: Tensor) -> tuple[int, int]:
    """lo, hi: the least and greatest (truncated) t_q - t_k over the pairs of each sequence of one axis."""
    if not (_integral(pq) and _integral(pk)):
        d = (pq[:, :, None] - pk[:, None, :]).long()
        return int(d.min()), int(d.max())
    pq, pk = pq.long(), pk.long()
    # min (t_q - t_k) = min t_q - max t_k, and the same for the max: O(Tq + Tk)
    return int((pq.min(-1).values - pk.max(-1).values).min()), int((pq.max(-1).values - pk.min(-1).values).max())


class PositionScheme(nn.Module):
    """Base class.  ``absolute``: whether the scheme changes the inputs (direct sum);
    ``relative_value``: whether it can add a relative term to the value function; ``reads_positions``:
    whether :meth:`inputs` or :meth:`terms` read the positions (a layer then forms the defaults)."""

    name = "none"
    relative_value = False
    reads_positions = True

    def __init__(self, d_model: int, n_heads: int, d_head: int, axes: int = 1):
        super().__init__()
        self.d_model, self.n_heads, self.d_head, self.axes = d_model, n_heads, d_head, axes

    def inputs(self, f: Tensor, pos: Tensor) -> Tensor:
        """Features entering the projections: (B, T, d_model) -> (B, T, d_model)."""
        return f

    def terms(self, q: Tensor, k: Tensor, pos_q: Tensor, pos_k: Tensor,
              offset: int | None = None) -> PositionalTerms | None:
        """log k_T for per-head q (B, H, Tq, d), k (B, H_kv, Tk, d) (H_kv dividing H: grouped-query attention,
        key head h // (H / H_kv) serving query head h); positions (Bp, T, A) integer.

        ``offset``: when not None, the positions are the defaults of one axis, t_k = j and t_q = offset + i
        (:func:`default_positions`), which the scheme then need not read: no value goes back to the host,
        so ``torch.compile`` traces it without a guard on the data."""
        return None


POSITIONS = Registry("position", base=PositionScheme)


@POSITIONS.register("none")
class NoPosition(PositionScheme):
    """No positional information: the kernel sees f alone (X = F; sets, or Table 3's "no PE")."""

    reads_positions = False


@POSITIONS.register("absolute", [
    Param("encoding", str, "sinusoidal", choices=("sinusoidal", "learned")),
    Param("max_len", int, 1024, check=lambda x: x > 0, rule="> 0; learned encodings only"),
])
class AbsolutePosition(PositionScheme):
    """Direct sum (Eq. 4): the kernel sees f + t, t sinusoidal (Vaswani) or learned (Gehring, fairseq)."""

    name = "absolute"

    def __init__(self, d_model, n_heads, d_head, axes=1, encoding="sinusoidal", max_len=1024):
        super().__init__(d_model, n_heads, d_head, axes)
        self.encoding = make_encoding(encoding, d_model, axes, max_len)

    def inputs(self, f, pos):
        return f + self.encoding(pos, f.dtype)


@POSITIONS.register("shaw", [
    Param("clip", int, 16, check=lambda x: x >= 1, rule=">= 1; relative distances are clipped to [-clip, clip]"),
])
class ShawPosition(PositionScheme):
    """Look-up table (Eq. 6, Shaw et al. 2018): log L = q·a^K_{clip(t_q - t_k)} / sqrt(d).

    a^K has 2·clip + 1 rows of size d, shared across heads (as in tensor2tensor), one table per axis.
    A large ``clip`` gives Transformer Dissection's reading (a table as wide as the sequence); 16 or
    20 gives Shaw's.  With ``value_position="relative"`` a second table a^V adds
    sum_j p_ij a^V_{clip(t_q - t_k)} to the output, as in Shaw et al.
    """

    name = "shaw"
    relative_value = True

    def __init__(self, d_model, n_heads, d_head, axes=1, clip=16, value_position="none"):
        super().__init__(d_model, n_heads, d_head, axes)
        self.clip = clip
        self.key_tables = nn.ParameterList(nn.Parameter(torch.randn(2 * clip + 1, d_head) * d_head ** -0.5)
                                           for _ in range(axes))
        self.value_tables = None
        if value_position == "relative":
            self.value_tables = nn.ParameterList(nn.Parameter(torch.randn(2 * clip + 1, d_head) * d_head ** -0.5)
                                                 for _ in range(axes))

    def reach(self, tq: int, tk: int, offset: int | None) -> int:
        """The clip c' <= c the tables are read at: on the default positions (``offset`` given) whose distances
        offset + i - j all lie within ±c' for c' < c, the 2c' + 1 middle rows of a table hold every row a pair
        reads, and clip(r, -c', c') + c' picks the same row of them as clip(r, -c, c) + c of the whole table;
        so the (Tq, 2c' + 1) logits are formed, not (Tq, 2c + 1).  c' is 2^n - 1 (few specialisations of a
        kernel compiled per clip, over lengths).  c otherwise, and under ``torch.compile``: there the cut would
        guard on the lengths (a graph per length under ``dynamic=True``)."""
        if offset is None or torch.compiler.is_compiling():
            return self.clip
        need = max(1, tk - 1 - offset, offset + tq - 1)
        return min(self.clip, (1 << need.bit_length()) - 1)

    def index(self, pos_q: Tensor, pos_k: Tensor, offset: int | None = None,
              clip: int | None = None) -> list[DifferenceIndex | Tensor]:
        """Row of the table for each (query, key) pair, per axis: (Bp, Tq, Tk) in [0, 2·clip], a
        :class:`DifferenceIndex` for integer positions (no (Tq, Tk) tensor); ``clip`` defaults to the scheme's."""
        return [_pair_index(pos_q[..., a], pos_k[..., a], clip=clip or self.clip, offset=offset)
                for a in range(pos_q.shape[-1])]

    def terms(self, q, k, pos_q, pos_k, offset=None):
        c = self.reach(pos_q.shape[1], pos_k.shape[1], offset)
        idx = self.index(pos_q, pos_k, offset, clip=c)
        rows = slice(self.clip - c, self.clip + c + 1)
        scale = 1.0 / math.sqrt(q.shape[-1])
        rel = [(torch.matmul(q, table[rows].to(q.dtype).t()) * scale, idx[a])
               for a, table in enumerate(self.key_tables)]
        value = []
        if self.value_tables is not None:
            value = [(table[rows], idx[a]) for a, table in enumerate(self.value_tables)]
        return PositionalTerms(relative=rel, value=value)


@POSITIONS.register("xl", [
    Param("clamp_len", int, None, optional=True, check=lambda x: x > 0,
          rule="> 0; distances beyond it use the embedding of clamp_len (TXL evaluation)"),
])
class XLPosition(PositionScheme):
    r"""Transformer-XL product kernel (Eq. 5; Dai et al. 2019, ``RelPartialLearnableMultiHeadAttn``):

        log k = [ q·k  +  u·k  +  (q + v)·W_R R_{t_q - t_k} ] / sqrt(d)

    The content term q·k is the feature kernel k_F (exp by default; any kernel can replace it); this
    scheme contributes the rest: the global content bias u·k and the position term with the global
    position bias v.  R is the sinusoid of the relative distance (d_model features), W_R a per-layer
    projection without bias.  u and v are (H, d) and, as in Transformer-XL, shared by all layers when a
    model calls :meth:`share_biases`.  Computing the (Tq, R) position logits and gathering them is the
    same as TXL's ``_rel_shift`` (tested against it).
    """

    name = "xl"

    def __init__(self, d_model, n_heads, d_head, axes=1, clamp_len=None):
        super().__init__(d_model, n_heads, d_head, axes)
        self.clamp_len = clamp_len
        self.r_net = nn.ModuleList(nn.Linear(d_model, n_heads * d_head, bias=False) for _ in range(axes))
        self.u = nn.Parameter(torch.randn(n_heads, d_head) * 0.02)
        self.v = nn.Parameter(torch.randn(n_heads, d_head) * 0.02)

    def share_biases(self, u: nn.Parameter, v: nn.Parameter) -> None:
        """Use the given (H, d) biases, e.g. one pair shared by every layer of a model."""
        if u.shape != (self.n_heads, self.d_head) or v.shape != (self.n_heads, self.d_head):
            raise ValueError(f"xl biases must have shape ({self.n_heads}, {self.d_head})")
        self.u, self.v = u, v

    def terms(self, q, k, pos_q, pos_k, offset=None):
        d = q.shape[-1]
        scale = 1.0 / math.sqrt(d)
        # u·k as a product and a sum, not an einsum: the einsum's backward is an outer product through bmm and a
        # permuting copy (docs/benchmarks.md, "Figures behind the design")
        u = (self.u.to(q.dtype) * scale).view(k.shape[1], -1, 1, d)  # (H_kv, H / H_kv, 1, d): u by key head
        key_bias = (k.unsqueeze(2) * u).sum(-1).flatten(1, 2).unsqueeze(-2)  # (B, H, 1, Tk)
        qv = torch.add((self.v.to(q.dtype) * scale)[None, :, None, :], q, alpha=scale)  # (q + v)·scale, one pass
        rel = []
        for a, r_net in enumerate(self.r_net):
            if offset is not None:  # t_q - t_k = offset + i - j
                lo, hi = offset - (pos_k.shape[1] - 1), offset + pos_q.shape[1] - 1
            else:
                lo, hi = _distance_range(pos_q[..., a], pos_k[..., a])
            r = r_net(sinusoid_range(lo, hi, self.d_model, q.dtype, q.device, self.clamp_len))  # (R, H·d)
            r = r.view(-1, self.n_heads, d).transpose(0, 1)  # (H, R, d)
            # (Tq, R) logits are formed by whoever consumes the terms, a block of rows at a time.
            rel.append((qv, r, _pair_index(pos_q[..., a], pos_k[..., a], shift=lo, offset=offset)))
        return PositionalTerms(key_bias=key_bias, relative_factors=rel)


@POSITIONS.register("product", [
    Param("encoding", str, "sinusoidal", choices=("sinusoidal", "learned")),
    Param("max_len", int, 1024, check=lambda x: x > 0, rule="> 0; learned encodings only"),
])
class ProductPosition(PositionScheme):
    r"""Symmetric product kernel (Eq. 9, Tsai et al. 2019): k = k_F(f_q, f_k) · k_T(t_q, t_k), an exponential
    kernel on the positions:

        k_T(t_q, t_k) = exp(<t_q W_T, t_k W_T> / sqrt(d)).

    Here t is the absolute sinusoid (d_model features), W_T shared by the query and key sides (symmetric, so
    k_T is a valid kernel); no u/v biases.  One W_T per axis, their kernels multiplied.  In
    encoder-decoder attention t_q is the decoder position and t_k the encoder position.
    """

    name = "product"

    def __init__(self, d_model, n_heads, d_head, axes=1, encoding="sinusoidal", max_len=1024):
        super().__init__(d_model, n_heads, d_head, axes)
        # Each axis has a full d_model encoding of its own coordinate (hence axes=1 per encoder).
        self.encodings = nn.ModuleList(make_encoding(encoding, d_model, 1, max_len) for _ in range(axes))
        self.w_t = nn.ModuleList(nn.Linear(d_model, n_heads * d_head, bias=False) for _ in range(axes))

    def project(self, pos: Tensor, dtype) -> Tensor:
        """t W_T for every axis, concatenated: (Bp, T, A) -> (Bp, H, T, A·d)."""
        parts = []
        for a, (enc, w) in enumerate(zip(self.encodings, self.w_t)):
            t = w(enc(pos[..., a:a + 1], dtype))  # (Bp, T, H·d)
            parts.append(t.view(t.shape[0], t.shape[1], self.n_heads, self.d_head).transpose(1, 2))
        return torch.cat(parts, dim=-1)

    def terms(self, q, k, pos_q, pos_k, offset=None):
        scale = 1.0 / math.sqrt(q.shape[-1])
        k_feat = self.project(pos_k, q.dtype)
        if offset is not None:  # default positions: the queries are the keys' tail in self-attention
            tq, tk = pos_q.shape[1], pos_k.shape[1]
            tail = offset if offset == tk - tq and pos_q.shape[0] == pos_k.shape[0] else None
        else:
            tail = _tail_rows(pos_q, pos_k)
        q_feat = k_feat[..., tail:, :] if tail is not None else self.project(pos_q, q.dtype)
        return PositionalTerms(q_feat=q_feat * scale, k_feat=k_feat)


def _tail_rows(pos_q: Tensor, pos_k: Tensor) -> int | None:
    """r when ``pos_q`` (Bp, Tq, A) is a view of the rows r: of ``pos_k`` (Bp, Tk, A), r = Tk - Tq, as in
    self-attention with default positions (:func:`default_positions`); else None.  Read from the views'
    storage and strides, not by comparing values, which would wait for the device."""
    tq, tk = pos_q.shape[-2], pos_k.shape[-2]
    if pos_q.shape[0] != pos_k.shape[0] or pos_q.shape[-1] != pos_k.shape[-1] or tq > tk:
        return None
    if pos_q.stride()[1:] != pos_k.stride()[1:] or (pos_q.shape[0] > 1 and pos_q.stride(0) != pos_k.stride(0)):
        return None
    if pos_q.untyped_storage().data_ptr() != pos_k.untyped_storage().data_ptr():
        return None
    r = tk - tq
    return r if pos_q.storage_offset() == pos_k.storage_offset() + r * pos_k.stride(-2) else None


def make_position(spec, *, d_model: int, n_heads: int, d_head: int, axes: int = 1,
                  value_position: str = "none", **params) -> PositionScheme:
    """A positional scheme from its spec, sized for one attention layer; ``params`` are the scheme's
    parameters (``make_position("shaw", clip=3, ...)`` is ``make_position("shaw:clip=3", ...)``)."""
    if isinstance(spec, PositionScheme):
        return spec
    spec = POSITIONS.with_params(spec, params)[0]
    extra = dict(d_model=d_model, n_heads=n_heads, d_head=d_head, axes=axes)
    name, _ = POSITIONS.validate(spec)
    if name == "shaw":
        extra["value_position"] = value_position
    return POSITIONS.create(spec, **extra)


def default_positions(tq: int, tk: int, device, self_attention: bool,
                      query_offset: int | None = None) -> tuple[Tensor, Tensor]:
    """Positions when none are given: keys 0..Tk-1; queries aligned to the last Tq keys in
    self-attention (a memory sits in front of the segment), 0..Tq-1 in cross-attention, or
    ``query_offset``..``query_offset`` + Tq - 1 when given (cross-attention from the segment after a memory)."""
    if self_attention and tq > tk:
        raise ValueError(f"self-attention with Tq={tq} queries and Tk={tk} keys: the queries are the last Tq of the "
                         "keys, so Tq <= Tk (pass pos_q and pos_k for another alignment)")
    pk = torch.arange(tk, device=device)
    if query_offset is not None and not (self_attention and query_offset == tk - tq):
        pq = torch.arange(query_offset, query_offset + tq, device=device)
    else:  # in self-attention pq is a view of pk's tail, which lets ``product`` project the positions once
        pq = pk[tk - tq:] if self_attention else torch.arange(tq, device=device)
    return as_positions(pq, 1), as_positions(pk, 1)
