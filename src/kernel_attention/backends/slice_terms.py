"""The sliced path's two additive terms, and the blocks of query rows they are formed in
(:mod:`kernel_attention.backends.sliced` has the algorithm and runs them).

* :class:`RelativeTerm` -- Transformer-XL's qv_i · R_{base + i - j}: per block, the relative logits of the
  distances the block meets (a skewed view gives the (rows, cols) term) and their gradient G;
* :class:`SharedTerm` -- ``product``'s <t_q W_T, t_k W_T>, the same for every sequence of the batch: formed once
  per head and block.

Each term serves both loops: the Python loops call :meth:`source`, :meth:`take`, :meth:`end_head` and
:meth:`end_block` per slice; the compiled loops (``csrc/sliced.cpp``) take :meth:`native_inputs` and
:meth:`native_grads` per block, with what :meth:`whole` keeps for the whole call.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

__all__ = ["SliceSpec", "RelativeTerm", "SharedTerm", "Block", "TERMS", "term_blocks"]


@dataclasses.dataclass
class SliceSpec:
    """What is not a differentiable tensor: the logits' scale, the filter as a (B|1, H|1, Tq, Tk) mask or None,
    the blocks of query rows (``plan_blocks``) that both passes run per (head, batch element), and the term:
    ``"relative"`` (Transformer-XL's, with the Toeplitz ``base`` of its index, index_ij = base + i - j) or
    ``"shared"`` (``product``'s features, shared by the batch); ``kept_elements``: the budget of (B, H, rows,
    cols) logits that the compiled forward keeps for the backward (``sliced.kept_blocks``; 0 keeps none).  The
    filter mask is ``keep``; the kept logits are unrelated to it."""

    scale: float
    keep: Tensor | None
    blocks: list
    term: str
    base: int = 0
    kept_elements: int = 0


def _skew(x: Tensor, rows: int, cols: int) -> Tensor:
    """y[i, j] = x[i, rows - 1 - i + j] for x (rows, >= rows + cols - 1) with unit column stride: a strided view."""
    return x.as_strided((rows, cols), (x.stride(0) - 1, 1), x.storage_offset() + rows - 1)


def _padded(w: int) -> int:
    """Row length of the relative logits' buffers: w rounded up to 16 elements.  An odd row stride (w = rows +
    cols - 1) makes the products that write or read them slower (docs/benchmarks.md)."""
    return -(-w // 16) * 16


def _pick(x: Tensor, bb: int, hh: int) -> Tensor:
    """x[bb, hh] for x (B|1, H|1, ...), broadcast dimensions read at 0."""
    return x[bb if x.shape[0] > 1 else 0, hh if x.shape[1] > 1 else 0]


class RelativeTerm:
    """Transformer-XL's term for one block: the relative logits and their gradient G, (n, w) with w padded
    (:func:`_padded`), shared by the block's slices, and each head's table window, reversed and zero-padded to
    w rows so that column c of the logits holds distance z - 1 - c.  Tensors: qv (B|1, H, Tq, d), R (H|1, S, d)."""

    #: the forward runs per slice (each slice has its own term)
    forward_per_block = False
    #: the term's number in the compiled loop (csrc/sliced.cpp)
    NATIVE_ID = 0

    @staticmethod
    def zero_grads(qv: Tensor, table: Tensor) -> list:
        """[dqv, dR], accumulated by the blocks."""
        return [qv.new_zeros(qv.shape), table.new_zeros(table.shape)]

    @staticmethod
    def final(grads: list) -> list:
        return grads

    @staticmethod
    def whole(qv: Tensor, table: Tensor, grads: list | None) -> dict:
        """What the compiled loops keep for the whole call: the table in reverse, of which each block reads a
        window, and (backward) its gradient, transposed, (H|1, d, S), into which the blocks accumulate."""
        out = {"flipped": table.flip(1)}
        if grads is not None:
            out["dflipped_t"] = table.new_zeros(table.shape[0], table.shape[-1], table.shape[1])
        return out

    @staticmethod
    def finish(whole: dict | None, grads: list) -> None:
        """Adds the compiled loops' table gradient (:meth:`whole`) to ``grads``."""
        if whole is not None:
            grads[1] += whole["dflipped_t"].transpose(-1, -2).flip(1)

    def __init__(self, spec: SliceSpec, blk: "Block", qv: Tensor, table: Tensor, grads: list | None,
                 whole: dict | None = None):
        self.qv, self.table, self.grads = qv, table, grads  # grads: zero_grads(...) or None (forward)
        n, m = blk.n, blk.m
        self.a, self.z = spec.base + blk.r0 - (blk.hi - 1), spec.base + blk.r1 - blk.lo  # distances met
        w = _padded(n + m - 1)
        if grads is not None:
            self.g_rel = table.new_zeros(n, w)  # zero outside the band that dS fills
            self.ds = _skew(self.g_rel, n, m)
        if whole is not None:  # the compiled loops: views of the call's reversed table and its gradient
            win = slice(table.shape[1] - self.z, table.shape[1] - self.a)
            self.rev = whole["flipped"][:, win]
            if grads is not None:
                self.drev_t = whole["dflipped_t"][..., win]
            return
        self.logits = table.new_empty(n, w)
        self.rev = table.new_zeros(table.shape[0], w, table.shape[-1])
        self.rev[:, :self.z - self.a] = table[:, self.a:self.z].flip(1)
        if grads is not None:
            self.drev_t = table.new_zeros(table.shape[0], table.shape[-1], w)  # (H|1, d, w)

    def source(self, blk: "Block", bb: int, hh: int) -> Tensor:
        """qv·R_{i-j} of the slice, (n, m): a view of the logits."""
        torch.mm(self.qv[bb if self.qv.shape[0] > 1 else 0, hh, blk.rows], self.rev[self._ht(hh)].t(), out=self.logits)
        return _skew(self.logits, blk.n, blk.m)

    def _ht(self, hh: int) -> int:
        return hh if self.table.shape[0] > 1 else 0

    def take(self, blk: "Block", bb: int, hh: int, ds: Tensor) -> None:
        bq = bb if self.qv.shape[0] > 1 else 0
        self.grads[0][bq, hh, blk.rows].addmm_(self.g_rel, self.rev[self._ht(hh)])
        self.drev_t[self._ht(hh)].addmm_(self.qv[bq, hh, blk.rows].t(), self.g_rel)

    def end_head(self, blk: "Block", hh: int) -> None:
        pass

    def native_inputs(self) -> list:
        """The compiled loop's term tensors: qv and the block's distances in reverse; in the backward also dqv,
        their gradient (transposed) and G (:meth:`native_grads`)."""
        return [self.qv, self.rev]

    def native_grads(self) -> list:
        return [self.grads[0], self.drev_t, self.g_rel]

    def end_block(self) -> None:
        self.grads[1][:, self.a:self.z] += self.drev_t[..., :self.z - self.a].transpose(-1, -2).flip(1)


class SharedTerm:
    """``product``'s term for one block: t_q W_T · (t_k W_T)^T of a head, (n, m), formed once and read by the
    head's B slices; in the backward their dS are summed, and the features' gradients are two products per head.
    Tensors: qf_t (1, H, Tq, F), kf_t (1, H, Tk, F)."""

    #: the forward runs one flash call per block, its (1, H, n, m) mask shared by the batch
    forward_per_block = True
    NATIVE_ID = 1

    @staticmethod
    def zero_grads(qf_t: Tensor, kf_t: Tensor) -> list:
        """[d(t_q W_T), d(t_k W_T)^T (1, H, F, Tk)]: the key side accumulated transposed,
        (F, cols) += (F, rows)·(rows, cols)."""
        return [qf_t.new_zeros(qf_t.shape), kf_t.new_zeros(*kf_t.shape[:2], kf_t.shape[3], kf_t.shape[2])]

    @staticmethod
    def final(grads: list) -> list:
        return [grads[0], grads[1].transpose(-1, -2)]

    @staticmethod
    def mask(spec: SliceSpec, key_bias, rows: slice, cols: slice, qf_t: Tensor, kf_t: Tensor) -> Tensor:
        """The block's (1|B, H, n, m) mask for all its slices: the term, the key bias, -inf where the filter
        drops the pair (per sequence when the filter differs by sequence)."""
        bias = torch.matmul(qf_t[..., rows, :], kf_t[..., cols, :].transpose(-1, -2))
        if key_bias is not None:
            bias = bias + key_bias[..., cols]
        drop_cols, drop = _dropped(spec.keep, rows, cols)
        if drop is not None:
            lead = torch.broadcast_shapes(drop.shape[:2], bias.shape[:2])
            if lead != bias.shape[:2]:  # a padding mask differs per sequence
                bias = bias.expand(*lead, *bias.shape[2:]).clone()
            bias[..., drop_cols].masked_fill_(drop, float("-inf"))
        return bias

    @staticmethod
    def whole(qf_t: Tensor, kf_t: Tensor, grads: list | None) -> dict:
        """Nothing is kept for the whole call (the compiled loops form each head's term per block)."""
        return {}

    @staticmethod
    def finish(whole: dict | None, grads: list) -> None:
        pass

    def __init__(self, spec: SliceSpec, blk: "Block", qf_t: Tensor, kf_t: Tensor, grads: list | None,
                 whole: dict | None = None):
        self.qf_t, self.kf_t, self.grads = qf_t, kf_t, grads  # grads: zero_grads(...) or None (forward)
        if whole is not None:  # the compiled loops keep these buffers themselves
            return
        self.head = qf_t.new_empty(blk.n, blk.m)
        self.cur = -1
        if grads is not None:
            self.ds = qf_t.new_empty(blk.n, blk.m)
            self.db = qf_t.new_empty(blk.n, blk.m)

    def source(self, blk: "Block", bb: int, hh: int) -> Tensor:
        """The head's (n, m) term, formed at its first slice."""
        if self.cur != hh:
            torch.mm(self.qf_t[0, hh, blk.rows], self.kf_t[0, hh, blk.cols].t(), out=self.head)
            self.cur = hh
            if self.grads is not None:
                self.db.zero_()
        return self.head

    def take(self, blk: "Block", bb: int, hh: int, ds: Tensor) -> None:
        self.db.add_(ds)

    def end_head(self, blk: "Block", hh: int) -> None:
        self.grads[0][0, hh, blk.rows].addmm_(self.db, self.kf_t[0, hh, blk.cols])
        self.grads[1][0, hh, :, blk.cols].addmm_(self.qf_t[0, hh, blk.rows].t(), self.db)

    def native_inputs(self) -> list:
        """The compiled loop's term tensors: the two feature tensors; in the backward also their gradients."""
        return [self.qf_t, self.kf_t]

    def native_grads(self) -> list:
        return self.grads

    def end_block(self) -> None:
        pass


class Block:
    """One block of query rows [r0, r1) and its key span [lo, hi), with the term's buffers for it (only those
    the compiled loops read when ``whole``, the term's tensors kept for the call, is given)."""

    def __init__(self, spec: SliceSpec, r0, r1, lo, hi, extras, grads, whole: dict | None = None):
        self.r0, self.r1, self.lo, self.hi = r0, r1, lo, hi
        self.n, self.m = r1 - r0, hi - lo
        self.rows, self.cols = slice(r0, r1), slice(lo, hi)
        self.term = TERMS[spec.term](spec, self, *extras, grads, whole)
        self.drop_cols, self.drop = _dropped(spec.keep, self.rows, self.cols)

    def bias(self, spec: SliceSpec, key_bias, bb: int, hh: int, out: Tensor, factor: float = 1.0) -> Tensor:
        """The slice's additive term into ``out`` (n, m): the term times ``factor``, plus the key bias (given
        already multiplied by it), -inf where the filter drops the pair."""
        src = self.term.source(self, bb, hh)
        if key_bias is not None:
            torch.add(_pick(key_bias, bb, hh)[0, self.cols], src, alpha=factor, out=out)
        elif factor != 1.0:
            torch.mul(src, factor, out=out)
        else:
            out.copy_(src)
        if self.drop is not None:
            out[:, self.drop_cols].masked_fill_(_pick(self.drop, bb, hh), float("-inf"))
        return out


TERMS = {"relative": RelativeTerm, "shared": SharedTerm}


def _dropped(keep: Tensor | None, rows: slice, cols: slice) -> tuple[slice | None, Tensor | None]:
    """The columns of a block, relative to its span, in which the filter drops some pair, and the dropped pairs
    there, (B|1, H|1, n, c); (None, None) when it keeps them all.  A causal block drops pairs only in its
    diagonal square, so only that part is masked per slice."""
    if keep is None:
        return None, None
    dropped = ~keep[..., rows, cols]
    any_col = dropped.any(-2).flatten(0, -2).any(0).nonzero()
    if len(any_col) == 0:
        return None, None
    c = slice(int(any_col[0]), int(any_col[-1]) + 1)
    return c, dropped[..., c]


def term_blocks(spec: SliceSpec, extras, grads=None, whole: dict | None = None):
    """The blocks that see a key, with their buffers (those of the gradient when ``grads`` is given; those of
    the compiled loops, with the term's ``whole``, only)."""
    for r0, r1, lo, hi in spec.blocks:
        if hi > lo:
            yield Block(spec, r0, r1, lo, hi, extras, grads, whole)
