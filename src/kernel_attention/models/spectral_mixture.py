r"""The spectral mixture kernel of the GP (SM) row of IKA Table 4, as a GPyTorch kernel.

    k(x, x') = Σ_q w_q · exp(-2π² Σ_d v_qd τ_d²) · cos(2π μ_qᵀ τ),      τ = x - x',  q = 1..Q

the kernel of Wilson & Adams (2013): the inverse Fourier transform of the spectral density
Σ_q w_q [N(s; μ_q, V_q) + N(s; -μ_q, V_q)] / 2 with V_q = diag(v_q).  For one input (CO2, Passenger) it is their
Eq. 12; for several it keeps one cosine of the projection μ_qᵀτ rather than a product of one cosine per input,
which makes cos(2π μ_qᵀ(x - x')) a rank-2 product (cos a cos b + sin a sin b) and the kernel an N×N computation
per mixture instead of N×N×F.

Memory: autograd would keep some five N×N tensors per mixture for the backward pass (squared distances, the
exponential, the cosine, their products), 20 of them at Q = 4 -- for Parkinsons' 5,287 training rows in float64,
4.5 GB beside the Cholesky factor's few.  ``_SpectralMixtureMatrix`` keeps only its inputs and recomputes each
mixture's terms in the backward pass, one mixture at a time; its gradients (for w, μ, √v and both inputs),
with K_q = E_q ⊙ C_q, E_q = exp(-2π² S_q), S_q = squared distances of a = x ⊙ √v_q, C_q = cos(p_i - p'_j),
p = 2π x μ_q, and G = ∂L/∂K:

    ∂L/∂w_q  = Σ G ⊙ K_q
    ∂L/∂a_i  = 2 (a_i Σ_j H_ij - Σ_j H_ij a'_j),   H = -2π² w_q G ⊙ K_q   (and symmetrically for a'_j)
    ∂L/∂p_i  = -Σ_j D_ij sin(p_i - p'_j),          D = w_q G ⊙ E_q       (+Σ_i D_ij sin(p_i - p'_j) for p'_j)

with sin(p_i - p'_j) = sin p_i cos p'_j - cos p_i sin p'_j, so that every sum over j is a matrix product.
Measured on Parkinsons (``kernel-attention train`` of a GP (SM) cell's config with ``train.max_steps=3`` and
``model.restarts=2``, an evaluation each step, one thread; ``/usr/bin/time -v``): peak resident memory 13.0 GB
with autograd's tensors, 5.2 GB with this backward (a step 39 s against 60 s, beside two other processes);
1.9 GB with ``KERNEL_ATTENTION_MALLOC=system`` (10 steps; 5.25 GB without), as the CLI's heap setting
(malloc.py) keeps freed 213 MiB N×N blocks in the heap.

The start is drawn from the data, from the global RNG (so the run's seed decides it): 1/√v from |N(0, range²)| as
GPyTorch's ``SpectralMixtureKernel.initialize_from_data``, w = std(y) / Q, but μ log-uniform between 1 / range
and half the inverse of the smallest spacing, with μ_0 = 0 (mixture 0 starts as an RBF kernel).  GPyTorch's
uniform μ up to that Nyquist-like bound starts every mixture at high frequency on irregular inputs; from there
Adam did not find the trend (CO2) nor a sine (random inputs): RMSE at the level of predicting the mean, the
likelihood putting everything into the noise.  ``GPRegressor`` (gp.py) keeps the likeliest of several draws.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

__all__ = ["SpectralMixture"]

_TWO_PI_SQ = 2 * math.pi ** 2


def _terms(x1: Tensor, x2: Tensor, mu_q: Tensor, s_q: Tensor):
    """One mixture's pieces: a = x ⊙ √v_q (..., N, F); cos and sin of p = 2π x μ_q (..., N); E_q (..., N1, N2)."""
    a1, a2 = x1 * s_q, x2 * s_q
    sq = (a1 * a1).sum(-1)[..., :, None] + (a2 * a2).sum(-1)[..., None, :] - 2 * a1 @ a2.transpose(-1, -2)
    e = sq.clamp_min_(0).mul_(-_TWO_PI_SQ).exp_()  # clamp: rounding can make a zero distance negative
    p1, p2 = 2 * math.pi * (x1 @ mu_q), 2 * math.pi * (x2 @ mu_q)
    return a1, a2, (p1.cos(), p1.sin()), (p2.cos(), p2.sin()), e


def _cosine(cs1: tuple[Tensor, Tensor], cs2: tuple[Tensor, Tensor]) -> Tensor:
    """C_q = cos(p_i - p'_j) = cos p_i cos p'_j + sin p_i sin p'_j from (cos p, sin p) of each side: (..., N1, N2)."""
    (c1, s1), (c2, s2) = cs1, cs2
    return (c1[..., :, None] * c2[..., None, :]).addcmul_(s1[..., :, None], s2[..., None, :])


class _SpectralMixtureMatrix(torch.autograd.Function):
    """K = Σ_q w_q E_q ⊙ C_q for (..., N1, F), (..., N2, F), w (Q,), μ (Q, F), √v (Q, F) -> (..., N1, N2);
    the backward pass recomputes E_q and C_q (module docstring) instead of keeping them."""

    @staticmethod
    def forward(ctx, x1: Tensor, x2: Tensor, w: Tensor, mu: Tensor, s: Tensor) -> Tensor:
        ctx.save_for_backward(x1, x2, w, mu, s)
        out = None
        for q in range(w.shape[0]):
            _, _, cs1, cs2, k = _terms(x1, x2, mu[q], s[q])
            k.mul_(_cosine(cs1, cs2)).mul_(w[q])
            out = k if out is None else out.add_(k)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):
        x1, x2, w, mu, s = ctx.saved_tensors
        gx1 = gx2 = 0.0
        gw, gmu, gs = torch.zeros_like(w), torch.zeros_like(mu), torch.zeros_like(s)
        f = s.shape[-1]
        for q in range(w.shape[0]):
            a1, a2, (c1, s1), (c2, s2), d = _terms(x1, x2, mu[q], s[q])
            d.mul_(g)                                                  # G ⊙ E_q, in E's storage
            h = d * _cosine((c1, s1), (c2, s2))                        # G ⊙ K_q
            gw[q] = h.sum()
            h.mul_(-_TWO_PI_SQ * w[q])                                 # H = ∂L/∂S_q
            ga1 = 2 * (a1 * h.sum(-1)[..., None] - h @ a2)
            ga2 = 2 * (a2 * h.sum(-2)[..., None] - h.transpose(-1, -2) @ a1)
            del h
            d.mul_(w[q])                                               # D = w_q G ⊙ E_q
            gp1 = c1 * (d @ s2[..., None])[..., 0] - s1 * (d @ c2[..., None])[..., 0]
            dt = d.transpose(-1, -2)
            gp2 = c2 * (dt @ s1[..., None])[..., 0] - s2 * (dt @ c1[..., None])[..., 0]
            del d, dt
            gs[q] = (ga1 * x1).reshape(-1, f).sum(0) + (ga2 * x2).reshape(-1, f).sum(0)
            gmu[q] = 2 * math.pi * ((gp1[..., None] * x1).reshape(-1, f).sum(0)
                                    + (gp2[..., None] * x2).reshape(-1, f).sum(0))
            gx1 = gx1 + ga1 * s[q] + 2 * math.pi * gp1[..., None] * mu[q]
            gx2 = gx2 + ga2 * s[q] + 2 * math.pi * gp2[..., None] * mu[q]
        grads = (gx1.sum_to_size(x1.shape), gx2.sum_to_size(x2.shape), gw, gmu, gs)
        return tuple(grad if need else None for grad, need in zip(grads, ctx.needs_input_grad))


class SpectralMixture(gpytorch.kernels.Kernel):
    """k(x, x') = Σ_q w_q exp(-2π² Σ_d v_qd τ_d²) cos(2π μ_qᵀτ) (module docstring); v_qd = ``scales``²."""

    has_lengthscale = False

    def __init__(self, num_mixtures: int, num_dims: int):
        super().__init__()
        self.num_mixtures, self.num_dims = num_mixtures, num_dims
        self.register_parameter("raw_weights", nn.Parameter(torch.zeros(num_mixtures)))
        self.register_parameter("raw_means", nn.Parameter(torch.zeros(num_mixtures, num_dims)))
        self.register_parameter("raw_scales", nn.Parameter(torch.zeros(num_mixtures, num_dims)))
        for name in ("weights", "means", "scales"):
            self.register_constraint(f"raw_{name}", gpytorch.constraints.Positive())

    def _value(self, name: str) -> Tensor:
        return getattr(self, f"raw_{name}_constraint").transform(getattr(self, f"raw_{name}"))

    @property
    def weights(self) -> Tensor:   # (Q,)
        return self._value("weights")

    @property
    def means(self) -> Tensor:     # (Q, F): μ, frequencies
        return self._value("means")

    @property
    def scales(self) -> Tensor:    # (Q, F): √v, spectral standard deviations
        return self._value("scales")

    def _set(self, name: str, value: Tensor) -> None:
        raw = getattr(self, f"raw_{name}")
        raw.data.copy_(getattr(self, f"raw_{name}_constraint").inverse_transform(value.to(raw)))

    @torch.no_grad()
    def initialize_from_data(self, x: Tensor, y: Tensor) -> None:
        """Draw a start from the data (module docstring): √v_qd = 1 / |N(0, range_d²)|; μ_qd log-uniform
        between 1 / range_d and 0.5 / (smallest spacing)_d, except μ_0 = 0 (mixture 0 starts as an RBF kernel,
        the smooth trend); w_q = std(y) / Q."""
        xs = x.sort(dim=0).values
        span = (xs[-1] - xs[0]).clamp_min(1e-12)                                 # (F,)
        gaps = xs[1:] - xs[:-1]
        min_gap = torch.where(gaps > 0, gaps, torch.full_like(gaps, 1e10)).min(dim=0).values
        lo, hi = span.reciprocal().log(), (0.5 / min_gap).clamp_min(1.0 / span).log()
        q, f = self.num_mixtures, self.num_dims
        means = (lo + torch.rand(q, f, dtype=x.dtype, device=x.device) * (hi - lo)).exp()
        means[0] = 1e-6  # ≈ 0: the constraint keeps μ positive
        draw = torch.randn(q, f, dtype=x.dtype, device=x.device)
        self._set("scales", (draw * span).abs().clamp_min(1e-6).reciprocal())
        self._set("means", means)
        self._set("weights", (y.std() / q).expand(q))

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, **params) -> Tensor:
        """(..., N1, F), (..., N2, F) -> (..., N1, N2), or (..., N1) with ``diag``."""
        w, mu, s = self.weights, self.means, self.scales
        if not diag:
            return _SpectralMixtureMatrix.apply(x1, x2, w, mu, s)
        out = 0.0
        for q in range(self.num_mixtures):
            sq = (((x1 - x2) * s[q]) ** 2).sum(-1)
            out = out + w[q] * torch.exp(-_TWO_PI_SQ * sq) * torch.cos(2 * math.pi * ((x1 - x2) @ mu[q]))
        return out
