r"""What every attention backend receives and promises.

A :class:`Problem` is one call of the kernel smoother after the inputs were checked and the filter
resolved: per-head q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) (under grouped-query attention k and v
hold H / ``kv_groups`` heads until a backend reads them, :meth:`Problem.grouped_kv`), a :class:`Kernel`, the bool
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

from typing import Callable

import torch
from torch import Tensor

from kernel_attention.filters import Filter
from kernel_attention.kernels import Kernel
from kernel_attention.registry import Registry
from kernel_attention.smoother import PositionalTerms
from kernel_attention.kernels.capabilities import sdpa_form

__all__ = ["Problem", "Backend", "BACKENDS", "sdpa_features", "feature_kv", "per_head_key_features", "key_only_mask",
           "row_bounds", "kept_keys"]


class Problem:
    """One call of the smoother, checked (see the module docstring).  A plain class with plain attributes, which
    torch.compile traces when a layer builds one inside a compiled graph."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, kernel: Kernel, keep: Tensor | None = None,
                 filter: Filter | None = None, key_mask: Tensor | None = None,
                 terms: PositionalTerms | None = None, dropout_p: float = 0.0, need_weights: bool = False,
                 keep_fn: Callable[[], Tensor] | None = None, kv_groups: int = 1):
        # PyTorch's fused CPU kernels, which several backends call directly, read the feature dimension as
        # contiguous: a q, k or v with another stride there (a transposed view) would be read wrongly.
        q, k, v = (x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous() for x in (q, k, v))
        self.q, self._k, self._v, self.kernel, self._keep = q, k, v, kernel, keep
        self.filter, self.key_mask, self.terms = filter, key_mask, terms
        self.dropout_p, self.need_weights = dropout_p, need_weights
        #: what a backend computed about this call while deciding, for its run (e.g. squared's per-key factor)
        self.memo: dict = {}
        #: forms ``keep`` when it is first read.  ``explain`` defers the (Tq, Tk) mask of a structured filter so:
        #: the checks read the filter's kind and row bounds (:func:`row_bounds`) and the problem's shape instead
        self.keep_fn = keep_fn
        #: query heads per key/value head of the k and v held (grouped-query attention); 1 once they are repeated
        self.kv_groups = kv_groups

    @property
    def keep(self) -> Tensor | None:
        """The bool keep mask (True = the key takes part), broadcastable to (B, H, Tq, Tk), or None for every
        key; formed by ``keep_fn`` when first read."""
        if self.deferred:
            self._keep, self.keep_fn = self.keep_fn(), None
        return self._keep

    @keep.setter
    def keep(self, keep: Tensor | None) -> None:
        self._keep = keep

    @property
    def k(self) -> Tensor:
        """(B, H, Tk, D) keys; grouped heads are repeated when first read (:meth:`grouped_kv`)."""
        self._repeat_groups()
        return self._k

    @k.setter
    def k(self, k: Tensor) -> None:
        self._k = k

    @property
    def v(self) -> Tensor:
        """(B, H, Tk, Dv) values; grouped heads are repeated when first read (:meth:`grouped_kv`)."""
        self._repeat_groups()
        return self._v

    @v.setter
    def v(self, v: Tensor) -> None:
        self._v = v

    def _repeat_groups(self) -> None:
        if self.kv_groups > 1:
            g = self.kv_groups
            self._k, self._v = self._k.repeat_interleave(g, dim=1), self._v.repeat_interleave(g, dim=1)
            self.kv_groups = 1

    def grouped_kv(self) -> tuple[Tensor, Tensor, int]:
        """(k, v, groups) as held, without repeating them: k (B, H / groups, Tk, D), v (B, H / groups, Tk, Dv).
        A backend that runs grouped heads itself (SDPA's ``enable_gqa``) reads them so; reading ``k`` or ``v``
        repeats each head ``groups`` times first (query head h reads key/value head h // groups)."""
        return self._k, self._v, self.kv_groups

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, Tq, Tk)."""
        return self.q.shape[0], self.q.shape[1], self.q.shape[2], self._k.shape[2]

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
    def deferred(self) -> bool:
        """The filter's mask is not formed yet (it is a (Tq, Tk) function of the filter's spec alone)."""
        return self._keep is None and self.keep_fn is not None

    @property
    def full(self) -> bool:
        """Every key takes part for every query."""
        return not self.deferred and self.keep is None

    @property
    def key_only(self) -> bool:
        """The mask depends on the key alone (padding): shape (..., 1, Tk)."""
        if self.deferred:  # a (Tq, Tk) mask: of the key alone when there is one query
            return self.shape[2] == 1
        return self.keep is not None and (self.keep.dim() < 2 or self.keep.shape[-2] == 1 or self.keep.stride(-2) == 0)


def row_bounds(p: Problem) -> tuple[Tensor, Tensor] | None:
    """(lo, hi), (Tq,) each, of a deferred filter mask (:meth:`~kernel_attention.filters.Filter.row_bounds`),
    or None: the mask is formed (or the filter does not tell its bounds)."""
    if not p.deferred:
        return None
    return p.filter.row_bounds(p.shape[2], p.shape[3], p.q.device)


def kept_keys(p: Problem) -> Tensor | None:
    """(1, Tk) bool, True at the keys some query keeps, of a deferred mask whose filter keeps one range of keys
    per query (the union of the rows' ranges); None otherwise (read ``keep`` instead)."""
    bounds = row_bounds(p) if p.deferred and p.filter.contiguous else None
    if bounds is None:
        return None
    lo, hi = bounds
    kept = lo < hi
    ones = torch.ones(int(kept.sum()), dtype=torch.long, device=lo.device)
    starts = torch.zeros(p.shape[3] + 1, dtype=torch.long, device=lo.device)
    starts.index_add_(0, lo[kept], ones).index_add_(0, hi[kept], -ones)  # +1 where a range opens, -1 past its end
    return (starts.cumsum(0)[:-1] > 0).unsqueeze(0)


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


def per_head_key_features(p: Problem) -> bool:
    """Whether ``product``'s positional key features differ per query head: a backend that runs grouped
    key/value heads on kernel features repeats them then, since the key side is per query head."""
    t = p.terms
    return t is not None and t.k_feat is not None and t.k_feat.shape[1] != 1


def feature_kv(p: Problem) -> tuple[Tensor, Tensor, int]:
    """(k, v, groups) for a backend that runs grouped key/value heads on kernel features itself: as held
    (:meth:`Problem.grouped_kv`), or repeated (groups 1) where :func:`per_head_key_features`."""
    if p.kv_groups > 1 and per_head_key_features(p):
        return p.k, p.v, 1
    return p.grouped_kv()


def sdpa_features(p: Problem, key_bias: str = "features", positions: bool = True, k: Tensor | None = None):
    """(q', k', scale, key bias or None) with log k = scale · <q', k'> + key bias (+ per-row constants),
    the positional features of ``product`` concatenated unless ``positions`` is False:
    [q'; q_feat / scale] · [k'; k_feat] · scale adds <q_feat, k_feat>.  (None, None, 1.0, None) for a
    kernel without SDPA features.  ``k``: the keys to use instead of ``p.k`` (grouped heads, whose features
    are formed per key head: the SDPA forms are per token)."""
    form = sdpa_form(p.kernel, p.q, p.k if k is None else k, key_bias=key_bias)
    if form is None:
        return None, None, 1.0, None
    qf, kf, scale, t = form.q, form.k, form.scale, p.terms
    if positions and t is not None and t.q_feat is not None:
        b = p.shape[0]
        qfeat = t.q_feat.expand(b, *t.q_feat.shape[1:]) / scale
        kfeat = t.k_feat.expand(b, *t.k_feat.shape[1:])
        qf, kf = torch.cat([qf, qfeat.to(qf.dtype)], -1), torch.cat([kf, kfeat.to(kf.dtype)], -1)
    return qf, kf, scale, form.key_bias
