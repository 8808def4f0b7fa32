r"""Soft-max attention with one additive term, both passes per (block of query rows, head, batch element) slice.

The logits are

    s_ij = scale · q'_i·k'_j + b_j + t_ij

with q', k' the kernel's SDPA features, b a key bias (Transformer-XL's u·k, rbf's -s||k||^2 as a mask; optional)
and t one of two terms that are cheap to form for a block of rows:

* ``relative`` -- Transformer-XL's qv_i · R_{base + i - j} (Eq. 5; :class:`kernel_attention.positions.XLPosition`),
  qv (B|1, H, Tq, d) the query side (scaled), R (H|1, S, d) the table of distances.  The logits of the
  distances a block meets, qv · R_rev^T (rows, rows + cols - 1), hold pair (i, j) at column rows - 1 - i + j,
  so the (rows, cols) term is a strided view of them (as in :func:`kernel_attention.backends.relative.skew_rel`).
* ``shared`` -- ``product``'s <t_q W_T, t_k W_T> (Eq. 9), the same for every sequence of the batch: formed once
  per head and block and read by the head's B slices.

Both passes run as compiled loops (:mod:`kernel_attention.backends.native`, ``csrc/sliced.cpp``) where they
can be built, with the same products and each slice's elementwise steps fused into one or two passes; the
Python loops below are their fallback and reference.  **Forward**: compiled, per slice, the term plus b
plus the content product, then the soft-max and its log-sum-exp (``block_forward``); in Python, the term
plus b is the float mask of PyTorch's CPU flash kernel, which returns output and log-sum-exp -- per slice for
``relative``, per block of all slices for ``shared`` (one (1, H, rows, cols) mask).  **Backward**, per slice,
with δ_i = dO_i·O_i:

    P = exp(s - lse),  dP = dO v^T,  dS = P ⊙ (dP - δ)
    dq' = scale · dS k',   dk'^T += scale · q'^T dS,   dv^T += dO^T P,   db_j += Σ_i dS_ij
    relative: G = dS at the logits' columns (rows, rows + cols - 1),  dqv = G R_rev,  dR_rev^T += qv^T G
    shared:   D = Σ_b dS_b,  d(t_q W_T) = D (t_k W_T),  d(t_k W_T)^T += (t_q W_T)^T D

The blocked path (:mod:`kernel_attention.backends.chunked`) runs a block over all B·H slices at once: (B, H,
rows, Tk) buffers of 32-128 MB that every elementwise step reads and writes in main memory, fresh per block,
and the term's gradient through autograd.  Here a slice's (rows, Tk) buffers (4 MB at Tk = 4096) are allocated once
per block and reused by its B·H slices, so they stay in cache.  dk' and dv are accumulated as
(cols, D) += (rows, cols)^T (rows, D) from P and dS in buffers whose row stride is not a power of two (the
compiled loops; the same product from a buffer of 1024-element rows ran 1.4x slower) or transposed, (D, cols)
+= (D, rows)·(rows, cols) (the Python loops; the result then needs a transposing copy, 6 ms for each of dk' and
dv at B=4, H=8, T=1024).  The relative logits' rows are
padded to a multiple of 16 elements (:func:`_padded`), and dS is written straight into the skewed view of G
(zero elsewhere), from which the content and relative gradients both read it -- no copy, no index.  A filter
is applied only in the columns where it drops a pair (a causal block's diagonal square).  A query whose
filtered set is empty gets the flash kernel's zero output, and P = 0: zero gradient.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from kernel_attention.backends import native
from kernel_attention.backends.base import Problem, pad_last, sum_to
from kernel_attention.backends.relative import toeplitz_base

__all__ = ["SliceSpec", "sliced_smoother", "relative_base", "SLICE_ELEMENTS"]

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

#: log2(e): the backward forms P as 2^(log2(e)·(s - lse)); PyTorch's exp2 runs about 3x faster than its exp on
#: the CPU (75 against 221 us for 256K float32 elements, AVX-512), and log2(e) is folded into the operands.
LOG2E = 1.4426950408889634

#: Elements of one (rows, Tk) slice buffer at most: 16M float32 = 64 MB, so that blocks keep the 256 rows of
#: MAX_BLOCK_ROWS up to Tk = 65536 (4 MB at Tk = 4096).  In a trial, a budget of 4 MB (64 rows at Tk = 16384)
#: made `xl` 2.45x SDPA at T = 16384 against 2.07x with 256 rows, and 128 rows gave 2.19x (B = 1, H = 2);
#: `product` 2.00x against 1.63x: fewer, wider products per slice and a quarter of the flash calls outweigh
#: buffers that leave the cache.
SLICE_ELEMENTS = 1 << 24


#: Rows per relative product in the compiled loops (:func:`rel_chunk_rows`); 0 runs each on the whole block.
REL_CHUNK = 128


def rel_chunk_rows(n: int, m: int) -> int:
    """Rows per chunk of the compiled loops' relative products for a block of n rows and m keys: a block meets
    n + m - 1 distances (1.25x the keys at n = 256, m = 1024), a chunk of r rows m + r - 1."""
    return REL_CHUNK if 0 < REL_CHUNK < n and m < 8 * n else n


@dataclasses.dataclass
class SliceSpec:
    """What is not a differentiable tensor: the logits' scale, the filter as a (B|1, H|1, Tq, Tk) mask or None,
    the blocks of query rows (``plan_blocks``) that both passes run per (head, batch element), and the term:
    ``"relative"`` (Transformer-XL's, with the Toeplitz ``base`` of its index, index_ij = base + i - j) or
    ``"shared"`` (``product``'s features, shared by the batch)."""

    scale: float
    keep: Tensor | None
    blocks: list
    term: str
    base: int = 0


def relative_base(p: Problem) -> int | None:
    """The Toeplitz base of ``p``'s relative term (Transformer-XL's) when the sliced path runs it -- on the CPU,
    without dropout, one relative factor with a per-head table and an index base + i - j, no other positional
    term but a key bias -- else None."""
    t = p.terms
    if (t is None or p.q.device.type != "cpu" or p.dropout_p > 0 or len(t.relative_factors) != 1
            or t.relative or t.value or t.bias is not None or t.q_feat is not None):
        return None
    q_side, table, index = t.relative_factors[0]
    if table.dim() != 3 or table.shape[0] not in (1, p.shape[1]) or q_side.dim() != 4:
        return None
    return toeplitz_base(index)


def _skew(x: Tensor, rows: int, cols: int) -> Tensor:
    """y[i, j] = x[i, rows - 1 - i + j] for x (rows, >= rows + cols - 1) with unit column stride: a strided view."""
    return x.as_strided((rows, cols), (x.stride(0) - 1, 1), x.storage_offset() + rows - 1)


def _padded(w: int) -> int:
    """Row length of the relative logits' buffers: w rounded up to 16 elements.  An odd row stride (w = rows +
    cols - 1) made the products that write or read them up to 2x slower (measured at T=4096)."""
    return -(-w // 16) * 16


def _pick(x: Tensor, bb: int, hh: int) -> Tensor:
    """x[bb, hh] for x (B|1, H|1, ...), broadcast dimensions read at 0."""
    return x[bb if x.shape[0] > 1 else 0, hh if x.shape[1] > 1 else 0]


class _Relative:
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

    def __init__(self, spec: SliceSpec, blk: "_Block", qv: Tensor, table: Tensor, grads: list | None,
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

    def source(self, blk: "_Block", bb: int, hh: int) -> Tensor:
        """qv·R_{i-j} of the slice, (n, m): a view of the logits."""
        torch.mm(self.qv[bb if self.qv.shape[0] > 1 else 0, hh, blk.rows], self.rev[self._ht(hh)].t(), out=self.logits)
        return _skew(self.logits, blk.n, blk.m)

    def _ht(self, hh: int) -> int:
        return hh if self.table.shape[0] > 1 else 0

    def take(self, blk: "_Block", bb: int, hh: int, ds: Tensor) -> None:
        bq = bb if self.qv.shape[0] > 1 else 0
        self.grads[0][bq, hh, blk.rows].addmm_(self.g_rel, self.rev[self._ht(hh)])
        self.drev_t[self._ht(hh)].addmm_(self.qv[bq, hh, blk.rows].t(), self.g_rel)

    def end_head(self, blk: "_Block", hh: int) -> None:
        pass

    def native_inputs(self) -> list:
        """The compiled loop's term tensors: qv and the block's distances in reverse; in the backward also dqv,
        their gradient (transposed) and G (:meth:`native_grads`)."""
        return [self.qv, self.rev]

    def native_grads(self) -> list:
        return [self.grads[0], self.drev_t, self.g_rel]

    def end_block(self) -> None:
        self.grads[1][:, self.a:self.z] += self.drev_t[..., :self.z - self.a].transpose(-1, -2).flip(1)


class _Shared:
    """``product``'s term for one block: t_q W_T · (t_k W_T)^T of a head, (n, m), formed once and read by the
    head's B slices; in the backward their dS are summed, and the features' gradients are two products per head.
    Tensors: qf_t (1, H, Tq, F), kf_t (1, H, Tk, F)."""

    #: the forward runs one flash call per block, its (1, H, n, m) mask shared by the batch
    forward_per_block = True
    NATIVE_ID = 1

    @staticmethod
    def zero_grads(qf_t: Tensor, kf_t: Tensor) -> list:
        """[d(t_q W_T), d(t_k W_T)^T (1, H, F, Tk)]: the key side accumulated transposed, as dk'."""
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

    def __init__(self, spec: SliceSpec, blk: "_Block", qf_t: Tensor, kf_t: Tensor, grads: list | None,
                 whole: dict | None = None):
        self.qf_t, self.kf_t, self.grads = qf_t, kf_t, grads  # grads: zero_grads(...) or None (forward)
        if whole is not None:  # the compiled loops keep these buffers themselves
            return
        self.head = qf_t.new_empty(blk.n, blk.m)
        self.cur = -1
        if grads is not None:
            self.ds = qf_t.new_empty(blk.n, blk.m)
            self.db = qf_t.new_empty(blk.n, blk.m)

    def source(self, blk: "_Block", bb: int, hh: int) -> Tensor:
        """The head's (n, m) term, formed at its first slice."""
        if self.cur != hh:
            torch.mm(self.qf_t[0, hh, blk.rows], self.kf_t[0, hh, blk.cols].t(), out=self.head)
            self.cur = hh
            if self.grads is not None:
                self.db.zero_()
        return self.head

    def take(self, blk: "_Block", bb: int, hh: int, ds: Tensor) -> None:
        self.db.add_(ds)

    def end_head(self, blk: "_Block", hh: int) -> None:
        self.grads[0][0, hh, blk.rows].addmm_(self.db, self.kf_t[0, hh, blk.cols])
        self.grads[1][0, hh, :, blk.cols].addmm_(self.qf_t[0, hh, blk.rows].t(), self.db)

    def native_inputs(self) -> list:
        """The compiled loop's term tensors: the two feature tensors; in the backward also their gradients."""
        return [self.qf_t, self.kf_t]

    def native_grads(self) -> list:
        return self.grads

    def end_block(self) -> None:
        pass


class _Block:
    """One block of query rows [r0, r1) and its key span [lo, hi), with the term's buffers for it (only those
    the compiled loops read when ``whole``, the term's tensors kept for the call, is given)."""

    def __init__(self, spec: SliceSpec, r0, r1, lo, hi, extras, grads, whole: dict | None = None):
        self.r0, self.r1, self.lo, self.hi = r0, r1, lo, hi
        self.n, self.m = r1 - r0, hi - lo
        self.rows, self.cols = slice(r0, r1), slice(lo, hi)
        self.term = _TERMS[spec.term](spec, self, *extras, grads, whole)
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


_TERMS = {"relative": _Relative, "shared": _Shared}


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


def _blocks(spec: SliceSpec, extras, grads=None, whole: dict | None = None):
    """The blocks that see a key, with their buffers (those of the gradient when ``grads`` is given; those of
    the compiled loops, with the term's ``whole``, only)."""
    for r0, r1, lo, hi in spec.blocks:
        if hi > lo:
            yield _Block(spec, r0, r1, lo, hi, extras, grads, whole)


def _flash_forward(spec: SliceSpec, qf, kf, v, key_bias, extras, out: Tensor, lse: Tensor) -> None:
    """The forward pass on PyTorch's flash kernel with the term as its mask (the compiled loops' fallback):
    one call per block for a term shared by the batch, else one per slice.  Writes ``out`` and ``lse``."""
    b, h, dv = v.shape[0], v.shape[1], v.shape[-1]
    d = max(qf.shape[-1], dv)  # the flash kernel wants one head size for q, k and v
    qp, kp, vp = pad_last(qf, d), pad_last(kf, d), pad_last(v, d)
    if _TERMS[spec.term].forward_per_block:  # one flash call per block: faster than B·H calls
        for r0, r1, lo, hi in spec.blocks:
            if hi > lo:
                rows, cols = slice(r0, r1), slice(lo, hi)
                o, l = _flash(qp[..., rows, :], kp[..., cols, :], vp[..., cols, :], 0.0, False,
                              attn_mask=_Shared.mask(spec, key_bias, rows, cols, *extras), scale=spec.scale)
                out[..., rows, :] = o[..., :dv]
                lse[..., rows] = l
        return
    for blk in _blocks(spec, extras):
        bias = qf.new_empty(blk.n, blk.m)
        for hh in range(h):
            for bb in range(b):
                blk.bias(spec, key_bias, bb, hh, bias)
                o, l = _flash(qp[bb, hh, blk.rows][None, None], kp[bb, hh, blk.cols][None, None],
                              vp[bb, hh, blk.cols][None, None], 0.0, False, attn_mask=bias[None, None],
                              scale=spec.scale)
                out[bb, hh, blk.rows] = o[0, 0, :, :dv]
                lse[bb, hh, blk.rows] = l[0, 0]


def _zero_keyless(spec: SliceSpec, x: Tensor) -> Tensor:
    """Zeroes x's rows (dim -2) in the blocks that see no key, the rows the compiled loops do not write."""
    for r0, r1, lo, hi in spec.blocks:
        if hi <= lo:
            x[..., r0:r1, :] = 0
    return x


def _backward_native(compiled, spec: SliceSpec, qf, kf, v, key_bias, gout, lse, delta, want_kb: bool, extras,
                     grads) -> tuple:
    """The backward pass in the compiled loops: (dq', dk', dv, the key bias's gradient (B, H, Tk) or None);
    the term's gradients accumulate into ``grads``.  log2(e) and the scale are folded into the products' alpha,
    the key bias and lse, so that forming P costs one pass."""
    b, h, tk = v.shape[0], v.shape[1], kf.shape[2]
    lse2 = lse * LOG2E
    kb2 = None if key_bias is None else key_bias * LOG2E
    dq = _zero_keyless(spec, qf.new_empty(qf.shape))  # each block writes its rows
    dk, dv = kf.new_zeros(kf.shape), v.new_zeros(v.shape)
    dkb = qf.new_zeros(b, h, tk) if want_kb else None
    term_cls = _TERMS[spec.term]
    whole = term_cls.whole(*extras, grads)
    for blk in _blocks(spec, extras, grads, whole):
        term = blk.term
        compiled.block_backward(qf, kf, v, gout, lse2, delta, spec.scale, kb2, blk.drop,
                                0 if blk.drop is None else blk.drop_cols.start, blk.r0, blk.r1, blk.lo, blk.hi,
                                dq, dk, dv, dkb, term.NATIVE_ID, rel_chunk_rows(blk.n, blk.m),
                                term.native_inputs() + term.native_grads())
    term_cls.finish(whole, grads)
    return dq, dk, dv, dkb


def _backward_python(spec: SliceSpec, qf, kf, v, key_bias, gout, lse, delta, want_kb: bool, extras,
                     grads) -> tuple:
    """The backward pass in Python loops (the compiled loops' fallback); returns as :func:`_backward_native`."""
    b, h, tk, d = v.shape[0], v.shape[1], kf.shape[2], kf.shape[-1]
    qs = qf * spec.scale
    # P = exp(s - lse) = 2^(log2(e)·s - log2(e)·lse): log2(e) is folded into q', the key bias, lse and the
    # copy of the term into s, so that forming P costs no extra pass
    q2, lse2 = qs * LOG2E, lse * LOG2E
    kb2 = None if key_bias is None else key_bias * LOG2E
    dq = qf.new_zeros(qf.shape)
    if want_kb:  # a column of ones: row d of [scale·q', 1]^T dS is the key bias's gradient, sum_i dS_ij
        qs = torch.cat([qs, qs.new_ones(*qs.shape[:-1], 1)], -1)
    dk_t = qf.new_zeros(b, h, qs.shape[-1], tk)  # accumulated transposed: (d [+ 1], rows)·(rows, cols)
    dv_t = v.new_zeros(b, h, v.shape[-1], tk)
    for blk in _blocks(spec, extras, grads):
        rows, cols, term = blk.rows, blk.cols, blk.term
        s, dp = qf.new_empty(blk.n, blk.m), qf.new_empty(blk.n, blk.m)
        ds = term.ds  # where the term wants dS: the skewed view of G, or a buffer of its own
        for hh in range(h):
            for bb in range(b):
                blk.bias(spec, kb2, bb, hh, s, LOG2E)
                p = s.addmm_(q2[bb, hh, rows], kf[bb, hh, cols].t()).sub_(lse2[bb, hh, rows, None]).exp2_()
                g = gout[bb, hh, rows]
                dv_t[bb, hh, :, cols].addmm_(g.t(), p)
                torch.mm(g, v[bb, hh, cols].t(), out=dp)
                torch.mul(dp.sub_(delta[bb, hh, rows, None]), p, out=ds)
                torch.mm(ds, kf[bb, hh, cols], out=dq[bb, hh, rows])
                dk_t[bb, hh, :, cols].addmm_(qs[bb, hh, rows].t(), ds)
                term.take(blk, bb, hh, ds)
            term.end_head(blk, hh)
        term.end_block()
    dq.mul_(spec.scale)
    return (dq, dk_t[:, :, :d].transpose(-1, -2), dv_t.transpose(-1, -2),
            dk_t[:, :, d] if want_kb else None)


class _Sliced(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec: SliceSpec, qf, kf, v, key_bias, *extras):
        lse = v.new_zeros(*v.shape[:2], qf.shape[2])
        compiled = native.sliced(qf.dtype)
        if compiled is None:
            out = v.new_zeros(*v.shape[:2], qf.shape[2], v.shape[-1])
            _flash_forward(spec, qf, kf, v, key_bias, extras, out, lse)
        else:  # per slice, compiled (backends/native.py); each block writes its rows
            out = _zero_keyless(spec, v.new_empty(*v.shape[:2], qf.shape[2], v.shape[-1]))
            kb2 = None if key_bias is None else key_bias * LOG2E
            whole = _TERMS[spec.term].whole(*extras, None)
            for blk in _blocks(spec, extras, whole=whole):
                compiled.block_forward(qf, kf, v, kb2, blk.drop, 0 if blk.drop is None else blk.drop_cols.start,
                                       blk.r0, blk.r1, blk.lo, blk.hi, spec.scale, out, lse,
                                       blk.term.NATIVE_ID, rel_chunk_rows(blk.n, blk.m), blk.term.native_inputs())
        ctx.spec = spec
        ctx.save_for_backward(qf, kf, v, key_bias, out, lse, *extras)
        return out

    @staticmethod
    def backward(ctx, gout):
        spec = ctx.spec
        qf, kf, v, key_bias, out, lse, *extras = ctx.saved_tensors
        gout = gout.contiguous()
        delta = (gout * out).sum(-1)
        want_kb = key_bias is not None and ctx.needs_input_grad[4]
        term_cls = _TERMS[spec.term]
        grads = term_cls.zero_grads(*extras)
        compiled = native.sliced(qf.dtype)
        if compiled is None:
            dq, dk, dv, dkb = _backward_python(spec, qf, kf, v, key_bias, gout, lse, delta, want_kb, extras, grads)
        else:  # the same loop, compiled (backends/native.py)
            dq, dk, dv, dkb = _backward_native(compiled, spec, qf, kf, v, key_bias, gout, lse, delta, want_kb,
                                               extras, grads)
        dkb = sum_to(dkb.unsqueeze(2), key_bias.shape) if want_kb else None
        return (None, dq, dk, dv, dkb, *term_cls.final(grads))


def sliced_smoother(spec: SliceSpec, qf: Tensor, kf: Tensor, v: Tensor, key_bias: Tensor | None,
                    *extras: Tensor) -> Tensor:
    """Soft-max attention with an additive term formed per slice (module docstring): qf (B, H, Tq, D') and kf
    (B, H, Tk, D') the kernel's SDPA features, v (B, H, Tk, Dv), key_bias (B|1, H|1, 1, Tk) or None, and the
    term's tensors -- ``relative``: qv (B|1, H, Tq, d), R (H|1, S, d); ``shared``: t_q W_T (1, H, Tq, F) and
    t_k W_T (1, H, Tk, F).  Returns (B, H, Tq, Dv).  Under autocast the inputs are cast to its dtype, as the
    blocked path does (:func:`kernel_attention.backends.chunked.chunked_smoother`)."""
    if torch.is_autocast_enabled(v.device.type):
        dt = torch.get_autocast_dtype(v.device.type)
        qf, kf, v, *extras = (x.to(dt) for x in (qf, kf, v, *extras))
        key_bias = None if key_bias is None else key_bias.to(dt)
    return _Sliced.apply(spec, qf, kf, v, key_bias, *extras)
