"""Backward passes written out, which give first derivatives only.

The fused and blocked backends compute their gradients by hand (the flash-attention backward per block, the
scans' reverse recurrences, Triton kernels) instead of through autograd, so these gradients have no graph of
their own.  PyTorch's ``once_differentiable`` makes a second derivative through them a disconnected node:
``torch.autograd.grad(g.sum(), q)`` then says q "appears to not have been used in the graph", and a loss that
adds a gradient penalty to the task loss silently treats the penalty as constant.  :func:`first_order` refuses
``create_graph=True`` instead, naming the backend that runs every case with gradients of any order: ``dense``.
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

__all__ = ["first_order", "SecondDerivativeError"]


class SecondDerivativeError(RuntimeError):
    """A backward pass that is written out was asked for a graph (``create_graph=True``)."""


def first_order(backward):
    """``backward`` of an autograd Function, run as ``once_differentiable`` runs it; under ``create_graph=True``
    (grad mode on inside the backward pass), a :class:`SecondDerivativeError`."""
    inner = once_differentiable(backward)

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            raise SecondDerivativeError(
                "gradients of gradients (create_graph=True) are not computed by this attention call's backend: its "
                "backward pass is written out, with no graph of its own; run the call on backend='dense' "
                "(ka.attention(..., backend='dense'), KernelAttention(..., backend='dense'))")
        return inner(ctx, *grads)
    return wrapper
