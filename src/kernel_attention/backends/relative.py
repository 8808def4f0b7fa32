r"""Relative-position logits for a block of query rows: formed from a per-distance table, then shifted.

A relative term b_ij = q_i · table[idx_ij] (Transformer-XL's (q + v) · W_R R_{i-j}, Shaw's q · a_{clip(i-j)})
is computed as the (rows, R) logits q · table^T of the distances a block meets and then moved to
(rows, cols).  Two ways:

* ``gather_rel``: any index, a gather (its backward a scatter-add);
* ``skew_rel``: a Toeplitz index idx_ij = base + i - j (default positions, with or without a memory
  in front of the segment), as a strided view of the logits of the reversed table -- row i of the
  result starts i elements further into the logits row, which is TXL's ``_rel_shift`` without the
  padding copy.  The backward writes the gradient back through the same view (no index tensor).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_attention.positions.difference_index import DifferenceIndex

__all__ = ["rel_logits", "gather_rel", "toeplitz_base", "skew_rel"]


def rel_logits(q_side: Tensor, table: Tensor) -> Tensor:
    """q_side (B|1, H, c, d) · table (H, S, d)^T -> (B|1, H, c, S), without the copy of the table per batch
    element that broadcasting matmul makes: the batch goes into the rows of one (H, B·c, d) product."""
    if table.dim() != 3 or q_side.shape[0] == 1:
        return torch.matmul(q_side, table.transpose(-1, -2))
    b, h, c, d = q_side.shape
    out = torch.matmul(q_side.transpose(0, 1).reshape(h, b * c, d), table.transpose(-1, -2))
    return out.view(h, b, c, -1).transpose(0, 1)


def gather_rel(logits: Tensor, idx: Tensor) -> Tensor:
    """logits (B|1, H, R', c) rows, idx (B|1, c, n) -> logits[..., i, idx[i, j]] (B|1, H, c, n)."""
    idx = idx.unsqueeze(1)
    b = max(logits.shape[0], idx.shape[0])
    idx = idx.expand(b, logits.shape[1], idx.shape[2], idx.shape[3])
    return torch.gather(logits.expand(b, *logits.shape[1:]), -1, idx)


def toeplitz_base(index: Tensor | DifferenceIndex) -> int | None:
    """base when ``index`` (B|1, Tq, Tk) is base + i - j for every pair, else None.  A
    :class:`~kernel_attention.positions.difference_index.DifferenceIndex` answers from its two vectors; a tensor is
    compared with base + i - j entry by entry."""
    if isinstance(index, DifferenceIndex):
        return index.toeplitz_base()
    if index.dim() != 3:
        return None
    tq, tk = index.shape[-2:]
    base = int(index[0, 0, 0])
    expected = torch.arange(tq, device=index.device)[:, None] - torch.arange(tk, device=index.device)[None, :]
    return base if bool((index == expected.add_(base)).all()) else None


def _skew_view(x: Tensor, rows: int, cols: int) -> Tensor:
    """y[..., i, j] = x[..., i, rows - 1 - i + j] for x (..., rows, rows + cols - 1) with unit inner strides."""
    w = x.shape[-1]
    return x.as_strided((*x.shape[:-2], rows, cols), (*x.stride()[:-2], w - 1, 1), x.storage_offset() + rows - 1)


class _Skew(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, cols: int) -> Tensor:
        rows = x.shape[-2]
        if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1]:
            x = x.contiguous()
        ctx.shape, ctx.stride, ctx.cols = x.shape, x.stride(), cols
        return _skew_view(x, rows, cols)

    @staticmethod
    def backward(ctx, g: Tensor):
        # The gradient takes the logits' own layout (rel_logits makes them as (H, B, rows, S) and views
        # them as (B, H, ...)), so the product behind them gets it without a transposing copy.  Row i
        # of the view covers columns [rows-1-i, rows-1-i+cols): only the two bands [0, rows-1) and
        # [cols, S) can lie outside it, so those are zeroed before the copy instead of the whole buffer.
        rows, cols = ctx.shape[-2], ctx.cols
        gx = torch.empty_strided(ctx.shape, ctx.stride, dtype=g.dtype, device=g.device)
        gx[..., :rows - 1].zero_()
        gx[..., cols:].zero_()
        _skew_view(gx, rows, cols).copy_(g)
        return gx, None


def skew_rel(q_side: Tensor, table: Tensor, base: int, rows: slice, cols: slice) -> Tensor:
    """q_side[rows] · table[base + i - j] for the block (rows, cols): (B|1, H, |rows|, |cols|).

    ``q_side`` (B|1, H, Tq, d) rows already sliced to the block, ``table`` (H|·, S, d).  The block meets the
    distances [lo, hi) = [base + r0 - (c1 - 1), base + (r1 - 1) - c0 + 1); the logits of the reversed slice
    of the table hold distance hi - 1 - m at column m, so pair (i, j) sits at column rows - 1 - i + j."""
    n_rows, n_cols = rows.stop - rows.start, cols.stop - cols.start
    lo = base + rows.start - (cols.stop - 1)
    hi = base + rows.stop - cols.start
    logits = rel_logits(q_side, table[..., lo:hi, :].flip(-2))
    assert logits.shape[-1] == n_rows + n_cols - 1
    return _Skew.apply(logits, n_cols)
