r"""What every attention backend receives and promises.

A :class:`Problem` is one call of the kernel smoother after the inputs were checked and the filter
resolved: per-head q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv), a :class:`Kernel`, the bool
``keep`` mask (True = the key takes part, broadcastable to (B, H, Tq, Tk), or None for every key),
the filter it came from, the positional terms, dropout and whether the weights are wanted.

A :class:`Backend` answers three questions: :meth:`Backend.supports` (None when it can run the problem,
else the reason in words), :meth:`Backend.declines` (None, or why ``auto`` should leave a problem it can
run to a later backend: a measured policy, :mod:`~kernel_attention.backends.policy`) and
:meth:`Backend.run` (the output, (B, H, Tq, Dv), and the weights or None).  ``traceable`` says whether
``torch.compile`` can trace it (PyTorch operations only, no value read back to the host); ``auto``
passes over the others while a graph is traced.  Every backend must agree with ``dense`` -- the
reference -- on values and gradients, including a zero output (and zero gradient) for a query whose
filtered set is empty.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from kernel_attention.filters import Filter
from kernel_attention.kernels import Kernel
from kernel_attention.registry import Registry
from kernel_attention.smoother import PositionalTerms
from kernel_attention.kernels.capabilities import sdpa_form

__all__ = ["Problem", "Backend", "BACKENDS", "sdpa_features", "key_only_mask"]


@dataclasses.dataclass
class Problem:
    q: Tensor
    k: Tensor
    v: Tensor
    kernel: Kernel
    keep: Tensor | None = None
    filter: Filter | None = None
    key_mask: Tensor | None = None
    terms: PositionalTerms | None = None
    dropout_p: float = 0.0
    need_weights: bool = False
    #: what a backend computed about this call while deciding, for its run (e.g. squared's per-key factor)
    memo: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, Tq, Tk)."""
        return self.q.shape[0], self.q.shape[1], self.q.shape[2], self.k.shape[2]

    @property
    def pairs(self) -> int:
        """B·H·Tq·Tk, the elements of dense's (B, H, Tq, Tk) tensors, which the size thresholds count."""
        b, h, tq, tk = self.shape
        return b * h * tq * tk

    @property
    def causal(self) -> bool:
        """The filter is exactly the lower-right causal set (no padding, no other mask)."""
        return self.filter is not None and self.filter.kind == "causal" and self.key_mask is None

    @property
    def full(self) -> bool:
        """Every key takes part for every query."""
        return self.keep is None

    @property
    def key_only(self) -> bool:
        """The mask depends on the key alone (padding): shape (..., 1, Tk)."""
        return self.keep is not None and (self.keep.dim() < 2 or self.keep.shape[-2] == 1 or self.keep.stride(-2) == 0)


class Backend:
    """Base class: ``name``, ``traceable``, :meth:`supports`, :meth:`declines`, :meth:`describe` and
    :meth:`run`."""

    name = "backend"
    #: whether ``torch.compile`` traces :meth:`supports` and :meth:`run` without a graph break
    traceable = True

    def supports(self, p: Problem) -> str | None:
        """None when this backend runs ``p``; otherwise why not, in words."""
        return None

    def declines(self, p: Problem) -> str | None:
        """Why ``auto`` should leave ``p``, which this backend supports, to a later backend (a measured
        crossover of :mod:`~kernel_attention.backends.policy`), or None.  Asking for the backend by name
        ignores it."""
        return None

    def describe(self, p: Problem) -> str:
        """How this backend runs ``p`` (called only when :meth:`supports` is None)."""
        return self.name

    def run(self, p: Problem) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


BACKENDS = Registry("backend", base=Backend)


def key_only_mask(p: Problem) -> Tensor | None:
    """The (B|1, H|1, 1, Tk) bool mask of a problem whose mask depends on the key alone (padding), else
    None.  Shapes and strides only: no value is read."""
    if not p.key_only:
        return None
    keep = p.keep
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    return keep[..., :1, :]


def sum_to(x: Tensor, shape) -> Tensor:
    """Sum a broadcast gradient back to ``shape`` (same number of dimensions, 1 where it was broadcast)."""
    if tuple(x.shape) == tuple(shape):
        return x
    dims = [i for i, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1]
    return x.sum(dims, keepdim=True) if dims else x


def pad_last(x: Tensor, d: int) -> Tensor:
    """x zero-padded to size d in its last dimension (the CPU flash kernel wants one head size for q, k, v)."""
    return x if x.shape[-1] == d else torch.nn.functional.pad(x, (0, d - x.shape[-1]))


def as_float_mask(keep: Tensor, dtype) -> Tensor:
    """0 where the key takes part, -inf elsewhere."""
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, float("-inf"))


def sdpa_features(p: Problem, key_bias: str = "features", positions: bool = True):
    """(q', k', scale, key bias or None) with log k = scale · <q', k'> + key bias (+ per-row constants),
    the positional features of ``product`` concatenated unless ``positions`` is False:
    [q'; q_feat / scale] · [k'; k_feat] · scale adds <q_feat, k_feat>.  (None, None, 1.0, None) for a
    kernel without SDPA features."""
    form = sdpa_form(p.kernel, p.q, p.k, key_bias=key_bias)
    if form is None:
        return None, None, 1.0, None
    qf, kf, scale, t = form.q, form.k, form.scale, p.terms
    if positions and t is not None and t.q_feat is not None:
        b = p.shape[0]
        qfeat = t.q_feat.expand(b, *t.q_feat.shape[1:]) / scale
        kfeat = t.k_feat.expand(b, *t.k_feat.shape[1:])
        qf, kf = torch.cat([qf, qfeat.to(qf.dtype)], -1), torch.cat([kf, kfeat.to(kf.dtype)], -1)
    return qf, kf, scale, form.key_bias
