r"""Soft-max attention with one additive term, both passes per (block of query rows, head, batch element) slice.

The logits are

    s_ij = scale · q'_i·k'_j + b_j + t_ij

with q', k' the kernel's SDPA features, b a key bias (Transformer-XL's u·k, rbf's -s||k||^2 as a mask; optional)
and t one of two terms that are cheap to form for a block of rows:

* ``relative`` -- Transformer-XL's qv_i · R_{base + i - j} (Eq. 5; :class:`kernel_attention.positions.XLPosition`),
  qv (B|1, H, Tq, d) the query side (scaled), R (H|1, S, d) the table of distances.  The logits of the
  distances a block meets, qv · R_rev^T (rows, rows + cols - 1), hold pair (i, j) at column rows - 1 - i + j,
  so the (rows, cols) term is a strided view of them (as in :func:`kernel_attention.backends.relative.skew_rel`);
  :class:`~kernel_attention.backends.slice_terms.RelativeTerm`.
* ``shared`` -- ``product``'s <t_q W_T, t_k W_T> (Eq. 9), the same for every sequence of the batch: formed once
  per head and block and read by the head's B slices; :class:`~kernel_attention.backends.slice_terms.SharedTerm`.

Both passes run as compiled loops (:mod:`kernel_attention.backends.native`, ``csrc/sliced.cpp``) where they
can be built, with the same products and each slice's elementwise steps fused into one or two passes; the
Python loops below are their fallback and reference.  **Forward**: compiled, per slice, the term plus b
plus the content product, then the soft-max and its log-sum-exp (``block_forward``); in Python, the term
plus b is the float mask of PyTorch's CPU flash kernel, which returns output and log-sum-exp -- per slice for
``relative``, per block of all slices for ``shared`` (one (1, H, rows, cols) mask).  When gradients are
needed, the compiled forward also keeps the logits s of the first blocks that fit in ``kept_elements``
(B, H, rows, cols) elements (:func:`kept_blocks`; the device policy's ``kept_logits_elements``), and their
backward forms P from s without the content product and the term's (for ``xl``, two of a backward slice's eight
products).  **Backward**, per
slice, with δ_i = dO_i·O_i:

    P = exp(s - lse),  dP = dO v^T,  dS = P ⊙ (dP - δ)
    dq' = scale · dS k',   dk'^T += scale · q'^T dS,   dv^T += dO^T P,   db_j += Σ_i dS_ij
    relative: G = dS at the logits' columns (rows, rows + cols - 1),  dqv = G R_rev,  dR_rev^T += qv^T G
    shared:   D = Σ_b dS_b,  d(t_q W_T) = D (t_k W_T),  d(t_k W_T)^T += (t_q W_T)^T D

The chunked engine (:mod:`kernel_attention.backends.chunked`) runs a block over all B·H slices at once: (B, H,
rows, Tk) buffers that every elementwise step reads and writes in main memory, fresh per block, and the term's
gradient through autograd.  Here a slice's (rows, Tk) buffers are allocated once per block and reused by its
B·H slices, so they stay in cache.  dk' and dv are accumulated as (cols, D) += (rows, cols)^T (rows, D) from P
and dS in buffers whose row stride is not a power of two (the compiled loops: a power-of-two stride was
slower) or transposed, (D, cols) += (D, rows)·(rows, cols) (the Python loops; the result then needs a
transposing copy).  The figures are in docs/benchmarks.md ("Figures behind the design").  The relative logits' rows are
padded to a multiple of 16 elements, and dS is written straight into the skewed view of G
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
from kernel_attention.backends.first_order import first_order
from kernel_attention.backends.relative import toeplitz_base
from kernel_attention.backends.slice_terms import TERMS, SharedTerm, SliceSpec, term_blocks

__all__ = ["SliceSpec", "sliced_smoother", "relative_base", "kept_blocks"]

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

#: log2(e): the backward forms P as 2^(log2(e)·(s - lse)), since PyTorch's exp2 is faster than its exp on the
#: CPU; log2(e) is folded into the operands.
LOG2E = 1.4426950408889634

#: Rows per relative product in the compiled loops (:func:`rel_chunk_rows`); 0 runs each on the whole block.
REL_CHUNK = 128


def rel_chunk_rows(n: int, m: int) -> int:
    """Rows per chunk of the compiled loops' relative products for a block of n rows and m keys: a block meets
    n + m - 1 distances (1.25x the keys at n = 256, m = 1024), a chunk of r rows m + r - 1."""
    return REL_CHUNK if 0 < REL_CHUNK < n and m < 8 * n else n


def kept_blocks(blocks: list, b: int, h: int, budget: int) -> list[bool]:
    """For each block that sees a key, in order: whether the compiled forward keeps its (B, H, rows, cols) logits
    for the backward -- those that fit in what is left of ``budget`` elements (``blockwise:kept``)."""
    keeps = []
    for r0, r1, lo, hi in blocks:
        if hi > lo:
            n = b * h * (r1 - r0) * (hi - lo)
            keeps.append(n <= budget)
            budget -= n if n <= budget else 0
    return keeps


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


def _flash_forward(spec: SliceSpec, qf, kf, v, key_bias, extras, out: Tensor, lse: Tensor) -> None:
    """The forward pass on PyTorch's flash kernel with the term as its mask (the compiled loops' fallback):
    one call per block for a term shared by the batch, else one per slice.  Writes ``out`` and ``lse``."""
    b, h, dv = v.shape[0], v.shape[1], v.shape[-1]
    d = max(qf.shape[-1], dv)  # the flash kernel wants one head size for q, k and v
    qp, kp, vp = pad_last(qf, d), pad_last(kf, d), pad_last(v, d)
    if TERMS[spec.term].forward_per_block:  # one flash call per block: faster than B·H calls
        for r0, r1, lo, hi in spec.blocks:
            if hi > lo:
                rows, cols = slice(r0, r1), slice(lo, hi)
                o, l = _flash(qp[..., rows, :], kp[..., cols, :], vp[..., cols, :], 0.0, False,
                              attn_mask=SharedTerm.mask(spec, key_bias, rows, cols, *extras), scale=spec.scale)
                out[..., rows, :] = o[..., :dv]
                lse[..., rows] = l
        return
    for blk in term_blocks(spec, extras):
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
                     grads, kept: list) -> tuple:
    """The backward pass in the compiled loops: (dq', dk', dv, the key bias's gradient (B, H, Tk) or None);
    the term's gradients accumulate into ``grads``.  log2(e) and the scale are folded into the products' alpha,
    the key bias and lse, so that forming P costs one pass; a block whose logits the forward kept (``kept``, per
    block or empty) forms P from them, without the content and term products."""
    b, h, tk = v.shape[0], v.shape[1], kf.shape[2]
    lse2 = lse * LOG2E
    kb2 = None if key_bias is None else key_bias * LOG2E
    dq = _zero_keyless(spec, qf.new_empty(qf.shape))  # each block writes its rows
    dk, dv = kf.new_zeros(kf.shape), v.new_zeros(v.shape)
    dkb = qf.new_zeros(b, h, tk) if want_kb else None
    term_cls = TERMS[spec.term]
    whole = term_cls.whole(*extras, grads)
    for i, blk in enumerate(term_blocks(spec, extras, grads, whole)):
        term = blk.term
        compiled.block_backward(qf, kf, v, gout, lse2, delta, spec.scale, kb2, blk.drop,
                                0 if blk.drop is None else blk.drop_cols.start, blk.r0, blk.r1, blk.lo, blk.hi,
                                dq, dk, dv, dkb, term.NATIVE_ID, rel_chunk_rows(blk.n, blk.m),
                                term.native_inputs() + term.native_grads(), kept[i] if kept else None)
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
    for blk in term_blocks(spec, extras, grads):
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
        kept = []  # per block: its logits (B, H, n, m) in base 2, kept for the backward, or None
        compiled = native.sliced(qf.dtype)
        if compiled is None:
            out = v.new_zeros(*v.shape[:2], qf.shape[2], v.shape[-1])
            _flash_forward(spec, qf, kf, v, key_bias, extras, out, lse)
        else:  # per slice, compiled (backends/native.py); each block writes its rows
            out = _zero_keyless(spec, v.new_empty(*v.shape[:2], qf.shape[2], v.shape[-1]))
            kb2 = None if key_bias is None else key_bias * LOG2E
            whole = TERMS[spec.term].whole(*extras, None)
            keeps = kept_blocks(spec.blocks, *v.shape[:2], spec.kept_elements)
            for blk, keep in zip(term_blocks(spec, extras, whole=whole), keeps):
                x = v.new_empty(*v.shape[:2], blk.n, blk.m) if keep else None
                kept.append(x)
                compiled.block_forward(qf, kf, v, kb2, blk.drop, 0 if blk.drop is None else blk.drop_cols.start,
                                       blk.r0, blk.r1, blk.lo, blk.hi, spec.scale, out, lse,
                                       blk.term.NATIVE_ID, rel_chunk_rows(blk.n, blk.m), blk.term.native_inputs(), x)
        ctx.spec, ctx.kept = spec, kept
        ctx.save_for_backward(qf, kf, v, key_bias, out, lse, *extras)
        return out

    @staticmethod
    @first_order
    def backward(ctx, gout):
        spec = ctx.spec
        qf, kf, v, key_bias, out, lse, *extras = ctx.saved_tensors
        gout = gout.contiguous()
        delta = (gout * out).sum(-1)
        want_kb = key_bias is not None and ctx.needs_input_grad[4]
        term_cls = TERMS[spec.term]
        grads = term_cls.zero_grads(*extras)
        compiled = native.sliced(qf.dtype)
        if compiled is None:
            dq, dk, dv, dkb = _backward_python(spec, qf, kf, v, key_bias, gout, lse, delta, want_kb, extras, grads)
        else:  # the same loop, compiled (backends/native.py)
            dq, dk, dv, dkb = _backward_native(compiled, spec, qf, kf, v, key_bias, gout, lse, delta, want_kb,
                                               extras, grads, ctx.kept)
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
    tensors = (qf, kf, v, key_bias, *extras)
    if not (torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)):
        spec = dataclasses.replace(spec, kept_elements=0)  # no backward: nothing to keep logits for
    return _Sliced.apply(spec, *tensors)
