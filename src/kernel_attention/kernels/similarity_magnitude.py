r"""Kernels that are a similarity times a magnitude (Implicit Kernel Attention, Prop. 1, Eq. 9):

    log k(q, k) = log_similarity(q, k) + (||q||_p^2 + ||k||_p^2) / (2 sqrt(d))

:class:`SimilarityMagnitudeKernel` is the protocol -- :meth:`~SimilarityMagnitudeKernel.prepare` (per-call
state such as sampled spectral points), ``log_similarity`` and the Lp magnitude -- and ``decompose(q, k)``
returns both terms (:mod:`kernel_attention.kernels.decomposition`).  This module holds the kernels of IKA's
tables with a fixed similarity: ``rbf-only`` (Tsai et al.'s RBF, no magnitude), ``expsin`` and
``linear-magnitude``; the learned ones are in :mod:`kernel_attention.kernels.implicit`, which re-exports these.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from kernel_attention.kernels.decomposition import lp_norm_sq, magnitude
from kernel_attention.dropout import block_seed, keep_mask
from kernel_attention.kernels.base import KERNELS, Kernel
from kernel_attention.kernels.capabilities import BlockState
from kernel_attention.registry import Param

__all__ = ["SimilarityMagnitudeKernel", "RBFOnlyKernel", "ExpSinKernel", "LinearMagnitudeKernel"]


class SimilarityMagnitudeKernel(BlockState, Kernel):
    """log k = log_similarity + log_magnitude.  Subclasses define :meth:`prepare` (per-call state,
    e.g. sampled spectral points) and :meth:`log_similarity`; ``p`` and ``denom`` set the magnitude."""

    p: float = 2.0
    use_magnitude: bool = True
    magnitude_dropout: float = 0.0

    def denom(self, d: int) -> float:
        return 2.0 * math.sqrt(d)

    def prepare(self, q: Tensor, k: Tensor, key_mask: Tensor | None = None):
        return None

    def log_similarity(self, q: Tensor, k: Tensor, state=None) -> Tensor:
        raise NotImplementedError

    def log_magnitude(self, q: Tensor, k: Tensor) -> Tensor:
        if not self.use_magnitude:
            return q.new_zeros(q.shape[:-1] + (k.shape[-2],))
        return magnitude(q, k, self.p, self.denom(q.shape[-1]))

    def decompose(self, q: Tensor, k: Tensor, key_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(log_similarity, log_magnitude), each (B, H, Tq, Tk); their sum is ``log_kernel``."""
        return self.log_similarity(q, k, self.prepare(q, k, key_mask)), self.log_magnitude(q, k)

    def log_kernel(self, q: Tensor, k: Tensor, key_mask: Tensor | None = None) -> Tensor:
        log_sim, log_mag = self.decompose(q, k, key_mask)
        if self.drops_magnitude:
            log_mag = F.dropout(log_mag.expand_as(log_sim), self.magnitude_dropout)
        return log_sim + log_mag

    @property
    def drops_magnitude(self) -> bool:
        """Whether a forward pass now applies dropout to the (Tq, Tk) magnitude logits."""
        return self.magnitude_dropout > 0 and self.training and self.use_magnitude

    def magnitude_scale(self, d: int) -> tuple[float, float]:
        """(drop, scale): the magnitude dropout a forward pass applies now (0 outside training) and the
        factor on ||x||_p^2 that gives one vector's log magnitude, 1 / (denom(d) · (1 - drop)) (inverted
        dropout's 1 / (1 - drop) taken into the vectors)."""
        drop = self.magnitude_dropout if self.drops_magnitude else 0.0
        return drop, 1.0 / (self.denom(d) * (1.0 - drop))

    @staticmethod
    def dropout_seed(drop: float) -> int:
        """The seed of one call's magnitude dropout masks (:func:`kernel_attention.dropout.block_seed`): one
        draw from the global generator, so ``torch.manual_seed`` fixes it; 0 (no draw) without dropout."""
        return int(torch.randint(0, 2 ** 62, (1,))) if drop else 0

    def block_magnitude(self, q: Tensor, k: Tensor) -> tuple[list[Tensor], Callable]:
        """``([a, b], mag)`` for :meth:`blockwise`: a = ||q||_p^2 / denom (B, H, Tq, 1) and b the keys' (B, H,
        Tk, 1), both over 1 - p while magnitude dropout applies, and ``mag(rows, cols, a, b)`` the block's log
        magnitude a[rows] + b[cols]^T with :meth:`log_kernel`'s dropout, (B, H, |rows|, |cols|) (it indexes a and
        b itself, so they are declared "rows" and "cols" in ``f.sliced_args``); ``([], None)`` without a
        magnitude.  The vectors carry the scale, so a block costs one add (and one select).

        The dropout mask (:func:`kernel_attention.dropout.keep_mask`) comes from a generator seeded by this
        call (one draw from the global generator, so ``torch.manual_seed`` fixes it) and by the block's first
        row and column: a backend that recomputes a block in its backward pass, as the blocked path does,
        draws the same mask again, and no (Tq, Tk) mask is stored.  Its draws differ from :meth:`log_kernel`'s
        (one (Tq, Tk) draw); the distribution is the same."""
        if not self.use_magnitude:
            return [], None
        drop, scale = self.magnitude_scale(q.shape[-1])
        a, b = (lp_norm_sq(x, self.p).mul(scale).unsqueeze(-1) for x in (q, k))
        seed = self.dropout_seed(drop)

        def mag(r: slice, c: slice, a: Tensor, b: Tensor) -> Tensor:
            m = a[..., r, :] + b[..., c, :].transpose(-1, -2)
            if not drop:
                return m
            keep = keep_mask(m.shape, drop, block_seed(seed, r.start, c.start), m.device)
            return torch.where(keep, m, m.new_zeros(()))
        return [a, b], mag

    def regularization(self) -> Tensor:
        """Weighted KL (+ copula term) of the last forward pass; 0 for deterministic kernels."""
        return torch.zeros(())

    def blockwise(self, q: Tensor, k: Tensor):
        """:meth:`BlockState.blockwise` with :meth:`prepare`'s per-call state (sampled spectral points)
        drawn once per call, as :meth:`log_kernel` does, and passed whole to every block."""
        state = self.prepare(q, k)
        state = [] if state is None else list(state)
        ab, mag = self.block_magnitude(q, k)
        n = len(state)

        def f(r, c, q, k, *st):
            out = self.log_similarity(q[..., r, :], k[..., c, :], list(st[:n]) if n else None)
            return out if mag is None else out + mag(r, c, *st[n:])
        f.sliced_args = [None] * n + ["rows", "cols"][:len(ab)]
        return state + ab, f


_lengthscale = Param("lengthscale", float, None, optional=True, check=lambda x: x > 0,
                     rule="> 0; default d^(1/4), the dot product's")


@KERNELS.register("rbf-only", [_lengthscale])
class RBFOnlyKernel(SimilarityMagnitudeKernel):
    """RBF similarity exp(-||q-k||^2/(2 l^2)), l = d^(1/4), no magnitude (IKA's "RBF-only")."""

    name = "rbf-only"
    use_magnitude = False

    def __init__(self, lengthscale: float | None = None):
        super().__init__()
        self.lengthscale = lengthscale

    def hparams(self) -> dict:
        return {"lengthscale": self.lengthscale}

    def log_similarity(self, q, k, state=None):
        l2 = math.sqrt(q.shape[-1]) if self.lengthscale is None else self.lengthscale ** 2
        dist2 = (q.pow(2).sum(-1, keepdim=True) + k.pow(2).sum(-1).unsqueeze(-2)
                 - 2 * q @ k.transpose(-1, -2)).clamp_min(0)
        return -dist2 / (2 * l2)


@KERNELS.register("expsin", [
    Param("period", float, None, optional=True, check=lambda x: x > 0, rule="> 0; default 2 pi d^(1/4)"),
    Param("lengthscale", float, 1.0, check=lambda x: x > 0, rule="> 0"),
])
class ExpSinKernel(SimilarityMagnitudeKernel):
    """Periodic (exp-sine-squared) similarity × L2 magnitude (IKA's "Expsin").

    log_similarity = (<phi(q), phi(k)> - d)/l^2, phi(x) = [cos(2 pi x/P), sin(2 pi x/P)] per axis
    (= -(2/l^2) sum_i sin^2(pi (q_i - k_i)/P)); P = 2 pi d^(1/4) matches -||q-k||^2/(2 sqrt(d)) to
    second order."""

    name = "expsin"

    def __init__(self, period: float | None = None, lengthscale: float = 1.0):
        super().__init__()
        self.period, self.lengthscale = period, lengthscale

    def hparams(self) -> dict:
        return {"period": self.period, "lengthscale": self.lengthscale}

    def log_similarity(self, q, k, state=None):
        d = q.shape[-1]
        period = 2 * math.pi * d ** 0.25 if self.period is None else self.period

        def phi(x):
            a = x * (2 * math.pi / period)
            return torch.cat([a.cos(), a.sin()], dim=-1)

        return (phi(q) @ phi(k).transpose(-1, -2) - d) / self.lengthscale ** 2


@KERNELS.register("linear-magnitude")
class LinearMagnitudeKernel(SimilarityMagnitudeKernel):
    """Linear similarity <q,k>/sqrt(d) × L2 magnitude (IKA's "Linear"); a direct kernel.

    The similarity can be negative, so it has no log: ``decompose`` returns the similarity itself
    as its first term, and the smoother normalises k / sum k (weights may be negative, as for
    ``linear``).  ``kernel(q, k)`` divides by exp(max_j log_magnitude_ij), a positive per-row
    constant that cancels in the normalisation and keeps exp() from overflowing."""

    name = "linear-magnitude"
    positive = False
    psd = False

    def log_similarity(self, q, k, state=None):  # the similarity itself, see the class docstring
        return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])

    def log_kernel(self, q, k, key_mask=None):
        raise NotImplementedError("linear-magnitude is a direct kernel (may be negative); use .kernel()")

    def kernel(self, q: Tensor, k: Tensor) -> Tensor:
        sim, log_mag = self.decompose(q, k)
        return sim * (log_mag - log_mag.amax(-1, keepdim=True).detach()).exp()
