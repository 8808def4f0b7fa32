r"""The blocked path's terms: what a :class:`Problem` adds to the logits and to the output, as the callbacks of
:func:`kernel_attention.backends.chunked.chunked_smoother`.

Each additive piece reads compact inputs (registered as "extras" with how a block indexes them) and forms its
(rows, cols) part per block: ``log k`` of a kernel without SDPA features (:meth:`BlockState.blockwise`), a key bias,
``product``'s positional logits, Shaw's gathered table, Transformer-XL's relative term (a strided view for an
index base + i - j, :func:`kernel_attention.backends.relative.skew_rel`; a gather otherwise), a dense float bias;
Shaw's value table is the value callback.  The chunked smoother recomputes them in the backward pass.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_attention.backends.base import Problem
from kernel_attention.backends.chunked import ChunkSpec, plan_blocks
from kernel_attention.backends.relative import gather_rel, rel_logits, skew_rel, toeplitz_base
from kernel_attention.kernels.capabilities import block_log_kernel

__all__ = ["blocked_spec"]


def _cols(x, c) -> Tensor:
    """The key columns ``c`` of an additive term (..., Tk), or the term whole where it has one column for every
    key (a per-query term (Tq, 1), broadcast).  In the backward pass a sliced extra stands for its block's
    columns (``chunked._Sliced``) and is read with the block's slice."""
    return x if isinstance(x, Tensor) and x.shape[-1] == 1 else x[..., c]


def blocked_spec(p: Problem, qf, kf, scale: float, key_bias, rows: int, shared: bool) -> tuple[ChunkSpec, list]:
    """The :class:`ChunkSpec` and its extra tensors for ``p`` on the blocked path, in blocks of ``rows`` query
    rows: qf, kf, scale and key_bias from :func:`kernel_attention.backends.base.sdpa_features` (qf None for a
    kernel without SDPA features); ``shared``: ``product``'s features are not in qf / kf and enter here."""
    q, k, kern, t = p.q, p.k, p.kernel, p.terms
    b, h, tq, tk = p.shape
    keep, blocks = plan_blocks(p.keep, tq, tk, rows)
    extras: list = []
    axes: list = []
    pieces = []  # callables (rows, cols, ex) -> additive term

    def slot(x, axis=None):
        """Register an extra tensor; ``axis`` declares how the callbacks index it (see ChunkSpec)."""
        if axis == "rows" and x.shape[-2] == 1 or axis == "keys" and x.shape[-1] == 1:
            axis = None  # broadcast along the sliced axis: read whole
        extras.append(x)
        axes.append(axis)
        return len(extras) - 1

    if qf is None:  # a kernel with log_kernel only: log k per block, gradients through autograd
        state, f = block_log_kernel(kern, q, k)
        sliced = getattr(f, "sliced_args", None)  # how f indexes q, k and the state, if declared
        iq, ik = slot(q, "rows" if sliced is not None else None), slot(k, "cols" if sliced is not None else None)
        ist = [slot(x, sliced[i] if sliced else None) for i, x in enumerate(state)]
        for w in kern.parameters():  # reached by f directly; passed so that they get gradients
            if w.requires_grad:
                slot(w)
        pieces.append(lambda r, c, ex: f(r, c, ex[iq], ex[ik], *[ex[i] for i in ist]))
    if key_bias is not None:
        i = slot(key_bias, "keys")
        pieces.append(lambda r, c, ex, i=i: _cols(ex[i], c))
    if t is not None:
        if t.q_feat is not None and (qf is None or shared):  # not in the features: a per-block product
            iqf, ikf = slot(t.q_feat, "rows"), slot(t.k_feat, "cols")
            pieces.append(lambda r, c, ex: torch.matmul(ex[iqf][..., r, :], ex[ikf][..., c, :].transpose(-1, -2)))
        if t.key_bias is not None:
            i = slot(t.key_bias, "keys")
            pieces.append(lambda r, c, ex, i=i: _cols(ex[i], c))
        for logits, index in t.relative:
            i = slot(logits, "rows")
            pieces.append(lambda r, c, ex, i=i, index=index: gather_rel(ex[i][..., r, :], index[..., r, c]))
        for q_side, table, index in t.relative_factors:
            iq_, it_ = slot(q_side, "rows"), slot(table)
            base = toeplitz_base(index)

            def rel(r, c, ex, iq_=iq_, it_=it_, index=index, base=base):
                if base is not None:  # default positions: a strided view, no index
                    return skew_rel(ex[iq_][..., r, :], ex[it_], base, r, c)
                idx = index[..., r, c]
                lo, hi = int(idx.min()), int(idx.max()) + 1  # only the distances this block meets
                return gather_rel(rel_logits(ex[iq_][..., r, :], ex[it_][..., lo:hi, :]), idx - lo)
            pieces.append(rel)
        if t.bias is not None:
            i = slot(t.bias)
            pieces.append(lambda r, c, ex, i=i: _cols(ex[i] if ex[i].shape[-2] == 1 else ex[i][..., r, :], c))

    def bias_fn(r, c, ex):
        out = None
        for f in pieces:
            x = f(r, c, ex)
            out = x if out is None else out + x
        return out

    tables = [] if t is None else [(slot(table), index) for table, index in t.value]

    def value_fn(w, r, c, ex):
        """sum_j w_ij a^V_{index(i, j)}: each row's weights summed per table entry, times the table."""
        out = None
        for i, index in tables:
            table = ex[i]
            idx = index[..., r, c].unsqueeze(1).expand_as(w)
            per_row = w.new_zeros(*w.shape[:-1], table.shape[0]).scatter_add(-1, idx, w)
            term = torch.matmul(per_row, table.to(w.dtype))
            out = term if out is None else out + term
        return out

    seed = int(torch.randint(0, 2 ** 62, (1,))) if p.dropout_p > 0 else 0
    spec = ChunkSpec(scale=scale, blocks=blocks, keep=keep, bias_fn=bias_fn if pieces else None,
                     value_fn=value_fn if tables else None, dropout_p=p.dropout_p, seed=seed, axes=axes)
    return spec, extras
