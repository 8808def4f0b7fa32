r"""Explicit feature maps: the symmetric tensor square phi(x) with <phi(a), phi(b)> = <a, b>^2.

The polynomial kernel of degree 2 (Transformer Dissection, Table 2) has the finite feature map

    phi(x) = ( w_ab x_a x_b )_{a <= b},   w_aa = 1,  w_ab = sqrt(2) (a < b),   F = D (D + 1) / 2

(the D^2 products of x (x) x with each symmetric pair kept once), which is what lets ``poly`` run on
the linear-time backend.  Built with advanced indexing (x[..., ia] * x[..., ib]) its forward is a
gather and its backward an ``index_put`` with accumulation, both several times slower than the
(T, F) x (F, Dv) products they feed; here the forward writes the D row slices x_a · x[a:] directly
and the backward reads them back slice by slice:

    d x_a = sum_{b >= a} w_ab g_ab x_b  +  sum_{b <= a} w_ba g_ba x_b.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["symmetric_square", "symmetric_square_size"]


def symmetric_square_size(d: int) -> int:
    """F = D (D + 1) / 2."""
    return d * (d + 1) // 2


def _weights(d: int, like: Tensor) -> Tensor:
    """(F,) weights in row-major upper-triangle order: 1 on the diagonal, sqrt(2) off it."""
    ia, ib = torch.triu_indices(d, d, device=like.device)
    return torch.full(ia.shape, math.sqrt(2.0), dtype=like.dtype, device=like.device).masked_fill(ia == ib, 1.0)


def _starts(d: int) -> list[int]:
    """Offset of row a's slice (pairs (a, a..d-1)) in the feature vector."""
    out = [0]
    for a in range(d):
        out.append(out[-1] + d - a)
    return out


class _SymmetricSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        d = x.shape[-1]
        w = _weights(d, x)
        starts = _starts(d)
        phi = x.new_empty(*x.shape[:-1], starts[-1])
        for a in range(d):
            torch.mul(x[..., a:], x[..., a:a + 1], out=phi[..., starts[a]:starts[a + 1]])
        phi.mul_(w)
        ctx.save_for_backward(x)
        return phi

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        d = x.shape[-1]
        starts = _starts(d)
        gw = g * _weights(d, x)
        dx = torch.zeros_like(x)
        for a in range(d):
            ga = gw[..., starts[a]:starts[a + 1]]  # d/d(x_a x_b) for b >= a
            dx[..., a] += (ga * x[..., a:]).sum(-1)
            dx[..., a:].addcmul_(ga, x[..., a:a + 1])
        return dx


def symmetric_square(x: Tensor) -> Tensor:
    """phi(x) for x (..., D): (..., D (D + 1) / 2) with <phi(a), phi(b)> = <a, b>^2 (module docstring)."""
    return _SymmetricSquare.apply(x)
