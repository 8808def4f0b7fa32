r"""Gaussian-process regression: the GP (RBF) and GP (SM) rows of IKA Table 4, on GPyTorch.

    model = GPRegressor(in_features=13, kernel="rbf")      # exact GP, Gaussian likelihood, constant mean
    model.condition(x_train, y_train)                      # (N_tr, F), (N_tr,): the rows it conditions on
    loss = model.negative_mll()                            # -log p(y_train | x_train, θ) / N_tr
    mean = model(x)                                        # (1, N, F) -> (1, N): posterior mean at every row

The hyper-parameters θ (kernel parameters, noise σ², constant mean c) are fitted by maximising the marginal
likelihood with the trainer's optimiser, one full-batch step per epoch.  Kernels, τ = x - x':

    rbf:  k(x, x') = s · exp(-½ Σ_d τ_d² / ℓ_d²)           (one length-scale per input; ``ard=False``: one ℓ)
    sm:   k(x, x') = Σ_q w_q · exp(-2π² Σ_d v_qd τ_d²) · cos(2π μ_qᵀ τ)           (Q = ``mixtures``)

``sm`` is the spectral mixture kernel of Wilson & Adams (2013) (spectral_mixture.py: its multi-input form, its
memory-lean gradients and how its start is drawn from the data).

The posterior mean m(x) = c + k(x, X)(K + σ²I)⁻¹(y - c) is itself a kernel smoother of the training targets,
with weights that need not be positive or sum to one -- the contrast to attention that Transformer
Dissection draws.  Everything runs in float64 (the marginal likelihood of thousands of rows needs it) with
autocast off; predictions come back in the input's dtype.  GPyTorch solves with Cholesky up to 800 training
rows and with conjugate gradients beyond by default; here always with Cholesky (exact, O(N³) at every step and
evaluation: Parkinsons' 5,287 training rows make a GPU job; the cells' costs are the ``wall_s`` of their CSVs).
"""

from __future__ import annotations

import contextlib

import gpytorch
import torch
from torch import Tensor, nn

from kernel_attention.models import GP_KERNELS
from kernel_attention.models.spectral_mixture import SpectralMixture

__all__ = ["GPRegressor", "SpectralMixture", "GP_KERNELS"]


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
