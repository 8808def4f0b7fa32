r"""Kernels k(·,·) on the non-positional features (Transformer Dissection, Section 2.2.2 and Table 2).

Every kernel acts on per-head projected features ``q = f_q W_q`` of shape (B, H, Tq, D) and
``k = f_k W_k`` of shape (B, H, Tk, D) and returns a (B, H, Tq, Tk) matrix.  Two families:

* **positive kernels** (``positive = True``) return ``log k``.  The smoother takes a soft-max of
  ``log k`` over the filtered set, which *is* the kernel smoother of Definition 1 done in log space,
  and lets every exponential-family kernel run on fused soft-max attention.
* **direct kernels** (``positive = False``: polynomial, linear) return ``k`` itself, since ``k`` can be
  zero or negative and has no logarithm; the smoother normalises them directly, ``k / Σ k``.

The symmetric form of Table 2 (``W_q = W_k``) is a property of the projections, not of the kernel:
see :class:`kernel_attention.nn.attention.KernelAttention` (``symmetric=True``).  With it, every kernel
here gives a positive semi-definite Gram matrix (``psd = True``).

Formulas (d = D, the per-head dimension):

=========  =========================================================  ==========================
name       k(a, b)                                                    notes
=========  =========================================================  ==========================
exp        exp(<a,b> / sqrt(d))                                       Eq. 3, Vaswani et al.
rbf        exp(-||a-b||^2 / sqrt(d))                                  no factor 2, as in Table 2
poly       <a,b>^degree                                               homogeneous, no sqrt(d)
linear     <a,b>                                                      may be negative
periodic   exp(-(2/l^2) sum_i sin^2(pi (a_i - b_i) / p))              exp-sine-squared, per axis
=========  =========================================================  ==========================
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernel_attention.kernels.base import KERNELS, Kernel, SDPAForm
from kernel_attention.kernels.capabilities import FeatureMap, SDPAFeatures
from kernel_attention.kernels.features import symmetric_square
from kernel_attention.registry import Param

__all__ = ["ExpKernel", "RBFKernel", "PeriodicKernel", "PolyKernel", "LinearKernel"]


def _default_scale(scale: float | None, d: int) -> float:
    return 1.0 / math.sqrt(d) if scale is None else scale


_scale = Param("scale", float, None, optional=True, doc="multiplier of the exponent",
               check=lambda x: x > 0, rule="> 0; default 1/sqrt(d)")


class _ScaledKernel(Kernel):
    """A kernel with one ``scale`` on its exponent (1/sqrt(d) when None)."""

    def __init__(self, scale: float | None = None):
        super().__init__()
        self.scale = scale

    def hparams(self) -> dict:
        return {"scale": self.scale}


@KERNELS.register("exp", [_scale])
class ExpKernel(SDPAFeatures, _ScaledKernel):
    """Exponential kernel exp(<a,b>·scale), scale = 1/sqrt(d) by default (Vaswani et al.)."""

    name = "exp"

    def log_kernel(self, q: Tensor, k: Tensor) -> Tensor:
        return torch.matmul(q, k.transpose(-1, -2)) * _default_scale(self.scale, q.shape[-1])

    def sdpa_form(self, q, k, key_bias="features"):
        return SDPAForm(q, k, _default_scale(self.scale, q.shape[-1]))


@KERNELS.register("rbf", [_scale])
class RBFKernel(SDPAFeatures, _ScaledKernel):
    """RBF kernel exp(-||a-b||^2·scale), scale = 1/sqrt(d) by default (Table 2: no factor 2).

    Computed as scale·(2<a,b> - ||a||^2 - ||b||^2), clamped so rounding never makes a squared distance
    negative.  The ||a||^2 term is constant along a row and cancels in the smoother, but it is kept so
    that ``log_kernel`` is the kernel itself.
    """

    name = "rbf"

    def log_kernel(self, q: Tensor, k: Tensor) -> Tensor:
        sq = q.pow(2).sum(-1, keepdim=True)  # (B, H, Tq, 1)
        sk = k.pow(2).sum(-1).unsqueeze(-2)  # (B, H, 1, Tk)
        dist2 = (sq + sk - 2 * torch.matmul(q, k.transpose(-1, -2))).clamp_min(0)
        return -dist2 * _default_scale(self.scale, q.shape[-1])

    def sdpa_form(self, q, k, key_bias="features"):
        """-s||a-b||^2 = 2s<a,b> - s||b||^2 - s||a||^2; the last term is constant along a row.

        ``"features"``: q' = [q, 1], k' = [k, -||k||^2 / 2], scale 2s (one extra feature, no mask);
        ``"mask"``: q, k with scale 2s and the key bias -s||k||^2.  Without the clamp of
        :meth:`log_kernel`, which only matters for rounding at a == b."""
        s = _default_scale(self.scale, q.shape[-1])
        sk = k.pow(2).sum(-1, keepdim=True)  # (B, H, Tk, 1)
        if key_bias == "mask":
            return SDPAForm(q, k, 2 * s, key_bias=(-s * sk).transpose(-1, -2))
        ones = q.new_ones(*q.shape[:-1], 1)
        return SDPAForm(torch.cat([q, ones], -1), torch.cat([k, -0.5 * sk], -1), 2 * s)

    def sdpa_layout(self, key_bias="features"):
        return "bias" if key_bias == "mask" else "features"


@KERNELS.register("periodic", [
    Param("period", float, None, optional=True, check=lambda x: x > 0,
          rule="> 0; default pi*sqrt(2)*d^(1/4)"),
    Param("lengthscale", float, 1.0, check=lambda x: x > 0, rule="> 0"),
])
class PeriodicKernel(SDPAFeatures, Kernel):
    r"""Periodic (exp-sine-squared) kernel, one factor per feature axis:

        k(a, b) = exp( -(2 / l^2) · sum_i sin^2( pi (a_i - b_i) / p ) )

    a product of the one-dimensional periodic kernels, hence PSD on R^d.  Since
    2 sin^2(x/2) = 1 - cos x, its log is an inner product of Fourier features,

        log k(a, b) = ( <phi(a), phi(b)> - d ) / l^2,   phi(x) = [cos(2 pi x / p), sin(2 pi x / p)],

    which is how it is computed (and what lets it run on fused attention).  The default period
    p = pi·sqrt(2)·d^(1/4) with l = 1 makes it agree with ``rbf`` to second order at a = b.
    """

    name = "periodic"

    def __init__(self, period: float | None = None, lengthscale: float = 1.0):
        super().__init__()
        self.period = period
        self.lengthscale = lengthscale

    def hparams(self) -> dict:
        return {"period": self.period, "lengthscale": self.lengthscale}

    def resolved_period(self, d: int) -> float:
        return math.pi * math.sqrt(2.0) * d ** 0.25 if self.period is None else self.period

    def features(self, x: Tensor) -> Tensor:
        """phi(x): (..., D) -> (..., 2D)."""
        angle = x * (2 * math.pi / self.resolved_period(x.shape[-1]))
        return torch.cat([angle.cos(), angle.sin()], dim=-1)

    def log_kernel(self, q: Tensor, k: Tensor) -> Tensor:
        d = q.shape[-1]
        inner = torch.matmul(self.features(q), self.features(k).transpose(-1, -2))
        return (inner - d) / self.lengthscale ** 2

    def sdpa_form(self, q, k, key_bias="features"):
        # The constant -d / l^2 cancels along each row.
        return SDPAForm(self.features(q), self.features(k), 1.0 / self.lengthscale ** 2)


#: Highest polynomial degree accepted: <a,b>^32 stays finite in float32 while |<a,b>| < 16 (16^32 = 2^128 is just
#: past float32's largest value, (2 - 2^-23) 2^127).
MAX_DEGREE = 32


@KERNELS.register("poly", [
    Param("degree", int, 2, check=lambda x: 1 <= x <= MAX_DEGREE,
          rule=f"1..{MAX_DEGREE}; <a,b>^degree overflows float32 once |<a,b>|^degree >= 2^128 (|<a,b>| >= 16 "
               f"at degree {MAX_DEGREE})"),
])
class PolyKernel(FeatureMap, Kernel):
    """Homogeneous polynomial kernel <a,b>^degree (Table 2: degree 2, no constant, no sqrt(d)).

    Normalised directly by the smoother.  Even degrees are non-negative (and PSD); odd degrees can be
    negative, like ``linear``.
    """

    name = "poly"
    positive = False

    def __init__(self, degree: int = 2):
        super().__init__()
        self.degree = degree
        self.psd = True  # <a,b>^n = <a^(x)n, b^(x)n> is a Gram matrix for every n

    def hparams(self) -> dict:
        return {"degree": self.degree}

    def kernel(self, q: Tensor, k: Tensor) -> Tensor:
        return torch.matmul(q, k.transpose(-1, -2)).pow(self.degree)

    #: Largest feature size phi may have for the linear-time backend.
    max_features = 1 << 16

    def feature_map(self, x: Tensor) -> Tensor | None:
        r"""phi(x) = x^{(x)n} with <phi(a), phi(b)> = <a, b>^n.  Degree 2 keeps only the D(D+1)/2
        distinct products, x_a x_b for a <= b weighted sqrt(2) off the diagonal; higher degrees use
        the full D^n tensor power (None beyond ``max_features``)."""
        d = x.shape[-1]
        if self.degree == 1:
            return x
        if self.degree == 2:
            return symmetric_square(x)
        if d ** self.degree > self.max_features:
            return None
        phi = x
        for _ in range(self.degree - 1):
            phi = (phi[..., :, None] * x[..., None, :]).flatten(-2)
        return phi


@KERNELS.register("linear")
class LinearKernel(FeatureMap, Kernel):
    """Linear kernel <a,b> (Table 2).  No scale: any scale cancels in k / sum k.

    It takes negative values, so the "probabilities" k / sum k can be negative or blow up when the
    normaliser nears zero; Transformer Dissection reports that it does not converge.  The smoother
    reproduces that faithfully (see :func:`kernel_attention.smoother.normalise_direct`).
    """

    name = "linear"
    positive = False

    def kernel(self, q: Tensor, k: Tensor) -> Tensor:
        return torch.matmul(q, k.transpose(-1, -2))

    def feature_map(self, x: Tensor) -> Tensor:
        return x
