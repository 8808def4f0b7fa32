r"""Gaussian-process regression: the GP (RBF) and GP (SM) rows of IKA Table 4, on GPyTorch.

    model = GPRegressor(in_features=13, kernel="rbf")      # exact GP, Gaussian likelihood, constant mean
    model.condition(x_train, y_train)                      # (N_tr, F), (N_tr,): the rows it conditions on
    loss = model.negative_mll()                            # -log p(y_train | x_train, θ) / N_tr
    mean = model(x)                                        # (1, N, F) -> (1, N): posterior mean at every row

The hyper-parameters θ (kernel parameters, noise σ², constant mean c) are fitted by maximising the marginal
likelihood with the trainer's optimiser, one full-batch step per epoch.  Kernels, τ = x - x':

    rbf:  k(x, x') = s · exp(-½ Σ_d τ_d² / ℓ_d²)           (one length-scale per input; ``ard=False``: one ℓ)
    sm:   k(x, x') = Σ_q w_q · exp(-2π² Σ_d v_qd τ_d²) · cos(2π μ_qᵀ τ)           (Q = ``mixtures``)

``sm`` is the spectral mixture kernel of Wilson & Adams (2013): the inverse Fourier transform of the spectral
density Σ_q w_q [N(s; μ_q, V_q) + N(s; -μ_q, V_q)] / 2 with V_q = diag(v_q).  For one input (CO2, Passenger)
it is their Eq. 12; for several it keeps one cosine of the projection μ_qᵀτ rather than a product of one
cosine per input, which makes cos(2π μ_qᵀ(x - x')) a rank-2 product (cos a cos b + sin a sin b) and the
kernel an N×N computation per mixture instead of N×N×F.  Its start is drawn from the data, from the global
RNG (so the run's seed decides it), ``restarts`` times, and the draw of highest marginal likelihood is kept:
1/√v from |N(0, range²)| as GPyTorch's ``SpectralMixtureKernel.initialize_from_data``, w = std(y) / Q, but
μ log-uniform between 1 / range and half the inverse of the smallest spacing, with μ_0 = 0 (mixture 0 starts
as an RBF kernel).  GPyTorch's uniform μ up to that Nyquist-like bound starts every mixture at high
frequency on irregular inputs; from there Adam did not find the trend (CO2) nor a sine (random inputs):
RMSE at the level of predicting the mean, the likelihood putting everything into the noise.

The posterior mean m(x) = c + k(x, X)(K + σ²I)⁻¹(y - c) is itself a kernel smoother of the training targets,
with weights that need not be positive or sum to one -- the contrast to attention that Transformer
Dissection draws.  Everything runs in float64 (the marginal likelihood of thousands of rows needs it) with
autocast off; predictions come back in the input's dtype.  GPyTorch solves with Cholesky up to 800 training
rows and with conjugate gradients beyond by default; here always with Cholesky (exact, O(N³): Parkinsons'
5,287 training rows took about 40 s per step and 10 s per prediction on one thread of a 2-core CPU beside other
processes, some 3 h per 200-step run with its evaluation each step; a GPU job).
"""

from __future__ import annotations

import contextlib
import math

import gpytorch
import torch
from torch import Tensor, nn

from kernel_attention.models import GP_KERNELS

__all__ = ["GPRegressor", "SpectralMixture", "GP_KERNELS"]


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
        out = 0.0
        for q in range(self.num_mixtures):
            a1, a2 = x1 * s[q], x2 * s[q]                     # Σ_d v_qd τ_d² = ‖a1 - a2‖²
            p1, p2 = 2 * math.pi * (x1 @ mu[q]), 2 * math.pi * (x2 @ mu[q])
            if diag:
                sq = ((a1 - a2) ** 2).sum(-1)
                cos = torch.cos(p1 - p2)
            else:
                sq = self.covar_dist(a1, a2, square_dist=True)
                cos = torch.cos(p1)[..., :, None] * torch.cos(p2)[..., None, :] \
                    + torch.sin(p1)[..., :, None] * torch.sin(p2)[..., None, :]
            out = out + w[q] * torch.exp(-2 * math.pi ** 2 * sq) * cos
        return out


def _exact(x: Tensor) -> contextlib.ExitStack:
    """Cholesky at every size (GPyTorch switches to conjugate gradients above 800 rows: approximate, and
    its predictions were slower than the factorisation on a CPU), float64 under any autocast."""
    stack = contextlib.ExitStack()
    stack.enter_context(gpytorch.settings.max_cholesky_size(2 ** 62))
    stack.enter_context(torch.autocast(x.device.type, enabled=False))
    return stack


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, covar: gpytorch.kernels.Kernel, likelihood: gpytorch.likelihoods.Likelihood):
        super().__init__(None, None, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = covar

    def forward(self, x: Tensor):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class GPRegressor(nn.Module):
    """Exact GP regression for the regression task (module docstring).

    Args:
        in_features: F.  kernel: ``"rbf"`` or ``"sm"``.  mixtures: Q of ``sm``.  restarts: initial draws of
            ``sm`` tried, the likeliest kept.  ard: ``rbf`` with one length-scale per input (else one for all).
            out_features: must be 1.
    """

    def __init__(self, in_features: int, *, kernel: str = "rbf", mixtures: int = 4, restarts: int = 10,
                 ard: bool = True, out_features: int = 1):
        super().__init__()
        if kernel not in GP_KERNELS:
            raise ValueError(f"model 'gp': unknown kernel {kernel!r}; accepted: {', '.join(GP_KERNELS)}")
        if out_features != 1:
            raise ValueError(f"model 'gp' predicts one target, got out_features={out_features}")
        if kernel == "rbf":
            rbf = gpytorch.kernels.RBFKernel(ard_num_dims=in_features if ard else None)
            covar = gpytorch.kernels.ScaleKernel(rbf)
        else:
            covar = SpectralMixture(mixtures, in_features)
        self.in_features, self.restarts = in_features, restarts
        self.gp = _ExactGP(covar, gpytorch.likelihoods.GaussianLikelihood()).double()
        self.mll = gpytorch.mlls.ExactMarginalLogLikelihood(self.gp.likelihood, self.gp)

    def _check(self, x: Tensor, what: str) -> None:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"model 'gp': {what} must be (N, {self.in_features}), got {tuple(x.shape)}")
        if not torch.isfinite(x).all():
            raise ValueError(f"model 'gp': {what} holds NaN or infinite values")

    def condition(self, x: Tensor, y: Tensor) -> None:
        """Set the training rows x (N_tr, F), y (N_tr,); an ``sm`` kernel draws its start from them."""
        self._check(x, "the training inputs")
        y = y.reshape(-1)
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"model 'gp': {x.shape[0]} training inputs but {y.shape[0]} targets")
        dev = self.gp.mean_module.raw_constant.device
        x, y = x.to(dev, torch.float64), y.to(dev, torch.float64)
        self.gp.set_train_data(x, y, strict=False)
        if isinstance(self.gp.covar_module, SpectralMixture):
            self._initialize_sm(x, y)

    @torch.no_grad()
    def _initialize_sm(self, x: Tensor, y: Tensor) -> None:
        """The best of ``restarts`` draws of :meth:`SpectralMixture.initialize_from_data` by marginal
        likelihood: the SM likelihood has many local optima in the frequencies μ (Wilson & Adams 2013)."""
        sm, best = self.gp.covar_module, None
        for _ in range(self.restarts):
            sm.initialize_from_data(x, y)
            nll = float(self.negative_mll())
            if best is None or nll < best[0]:
                best = (nll, {k: v.clone() for k, v in sm.state_dict().items()})
        sm.load_state_dict(best[1])

    def _inputs(self) -> tuple[Tensor, Tensor]:
        if self.gp.train_inputs is None:
            raise RuntimeError("model 'gp': call condition(x_train, y_train) first")
        return self.gp.train_inputs[0], self.gp.train_targets

    def negative_mll(self) -> Tensor:
        """-log p(y_tr | x_tr, θ) / N_tr (GPyTorch's ExactMarginalLogLikelihood), a scalar float64 tensor."""
        x, y = self._inputs()
        self.gp.train()
        with _exact(x):
            return -self.mll(self.gp(x), y)

    def forward(self, x: Tensor) -> Tensor:
        """(B, N, F) -> (B, N): the posterior mean E[f(x) | x_tr, y_tr] at every row (noise-free f)."""
        self._inputs()
        if x.dim() != 3 or x.shape[-1] != self.in_features:
            raise ValueError(f"model 'gp' takes (B, N, {self.in_features}), got {tuple(x.shape)}")
        if not torch.isfinite(x).all():
            raise ValueError("model 'gp': the inputs hold NaN or infinite values")
        was_training = self.gp.training
        self.gp.eval()
        try:
            with _exact(x), gpytorch.settings.skip_posterior_variances():
                mean = torch.stack([self.gp(xb.double()).mean for xb in x])
        finally:
            self.gp.train(was_training)
        return mean.to(x.dtype)
