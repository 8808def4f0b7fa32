r"""The implicit spectral density of IKA (Song et al. 2021, Eqs. 6-8) and MIKAN's Gaussian copula.

For every head m (shapes: B batch, H heads, d = per-head dimension, R spectral samples, R even):

    x^m        = [mean_t q^m || mean_t k^m]                       (B, H, 2d)   time-pooled features
    pre        = LeakyReLU_0.2(W1 x + b1)                          (B, H, d)
    mu, log s  = W2 pre + b2,  W3 pre + b3 + log(prior_std)        (B, H, d)    amortised q(z|h), Eq. 6
    z~_r       = mu + s · eps_r,  r = 1..R/2                       (B, H, R/2, d) reparameterised, Eq. 7
    z          = [z~ || -z~]                                       (B, H, R, d)  symmetric base, Eq. 7
    w          = sign(z) · NN(|z|)                                 (B, H, R, d)  Eq. 8

NN is a d -> d -> d -> d MLP with LeakyReLU(0.2) (the official ``WNet``); all networks act on the d
axis and are shared across heads, samples and (by default, :func:`share_spectral`) layers.

MIKAN replaces the independent eps across heads by a Gaussian copula with covariance Sigma = L L^T,
L = I + strict_lower(u u^T) (H x H, one per (b, i), u = tanh(Wc pre + bc)):  X = D^(-1/2) L eps with
D = diag(Sigma), so each marginal stays N(0, 1); with Gaussian marginals Phi and Phi^-1 cancel and
z~^m = mu^m + s^m X^m exactly.  The copula adds E_q[log c] = -1/2 log det C, C = D^(-1/2) Sigma D^(-1/2),
to KL(q || p); since det L = 1 this is 1/2 sum_m log Sigma_mm.

Departures of the official regression code, off by default (reference-notes 2.4):
``rowsum``    X = eps · rowsum(L) (its einsum), no standardisation, so nothing mixes across heads;
``clamp``     X clamped to [-2, 2] before Phi (a no-op on the distribution's bulk);
``negatives`` the negative half drawn independently with mean -mu instead of exactly -z~;
``copula_loss`` the heuristic "copula entropy" -sum U log(U + 1e-5), U = Phi(X), instead of -1/2 log det C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["AmortizedPosterior", "SpectralGenerator", "ImplicitDensity", "Posterior", "gaussian_kl",
           "copula_factor", "pool"]


LOG_STD_MIN, LOG_STD_MAX = -12.0, 6.0


def pool(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean over time: (B, H, T, d) -> (B, H, d); ``mask`` (B, T) bool, True = real position."""
    if mask is None:
        return x.mean(-2)
    m = mask.to(x.dtype)[:, None, :, None]
    return (x * m).sum(-2) / m.sum(-2).clamp_min(1.0)


class AmortizedPosterior(nn.Module):
    """q(z|h): pooled [q || k] (B, H, 2d) -> (mu, log_std, pre) each (B, H, d) (official ``CopulaNet``)."""

    def __init__(self, d: int, prior_std: float = 0.1):
        super().__init__()
        self.inp = nn.Linear(2 * d, d)
        self.mu = nn.Linear(d, d)
        self.log_std = nn.Linear(d, d)
        self.offset = math.log(prior_std)  # so that the initial std is about the prior's

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        pre = F.leaky_relu(self.inp(x), 0.2)
        # log std bounded so that huge pooled features cannot give std = inf (and a NaN KL).
        log_std = (self.log_std(pre) + self.offset).clamp(LOG_STD_MIN, LOG_STD_MAX)
        return self.mu(pre), log_std, pre


class SpectralGenerator(nn.Module):
    """w = sign(z) · NN(|z|), NN: R^d -> R^d, two hidden LeakyReLU(0.2) layers of width d (``WNet``).

    Feeding |z| and multiplying by sign(z) makes p(w) symmetric whenever p(z) is (Eq. 8)."""

    def __init__(self, d: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, d), nn.LeakyReLU(0.2), nn.Linear(d, d), nn.LeakyReLU(0.2),
                                 nn.Linear(d, d))

    def forward(self, z: Tensor) -> Tensor:
        return torch.sign(z) * self.net(z.abs())


@dataclass
class Posterior:
    """q(z|h) of one forward pass: mu, log_std (B, H, d); L (B, d, H, H) for MIKAN, else None."""

    mu: Tensor
    log_std: Tensor
    L: Tensor | None = None


def gaussian_kl(mu: Tensor, log_std: Tensor, prior_std: float) -> Tensor:
    """sum KL(N(mu, s^2) || N(0, prior_std^2)) over all elements (a scalar)."""
    var_ratio = (2 * log_std).exp() / prior_std ** 2
    return 0.5 * (var_ratio + mu.pow(2) / prior_std ** 2 - 1.0 - var_ratio.log()).sum()


def copula_factor(u: Tensor) -> Tensor:
    """L = I + strict_lower(u u^T) over heads: u (B, H, d) -> L (B, d, H, H)."""
    u = u.transpose(1, 2)                                   # (B, d, H)
    outer = u.unsqueeze(-1) * u.unsqueeze(-2)               # (B, d, H, H)
    eye = torch.eye(u.shape[-1], dtype=u.dtype, device=u.device)
    return torch.tril(outer, diagonal=-1) + eye


class ImplicitDensity(nn.Module):
    """The spectral density estimator: amortised q(z|h), ``n_generators`` spectral generators (1 for
    IKAS, 2 for IKANS/IKAN/MIKAN) and, with ``copula=True``, MIKAN's copula network.  Holds only
    parameters, so one instance can serve every layer (see :func:`kernel_attention.kernels.implicit.share_spectral`).
    """

    def __init__(self, d: int, n_generators: int = 2, copula: bool = False, prior_std: float = 0.1):
        super().__init__()
        self.d, self.n_generators, self.has_copula, self.prior_std = d, n_generators, copula, prior_std
        self.posterior_net = AmortizedPosterior(d, prior_std)
        self.generators = nn.ModuleList(SpectralGenerator(d) for _ in range(n_generators))
        self.copula = nn.Linear(d, d) if copula else None

    def signature(self) -> tuple:
        """Densities with equal signatures can replace one another."""
        return (self.d, self.n_generators, self.has_copula, self.prior_std)

    def posterior(self, q: Tensor, k: Tensor, key_mask: Tensor | None = None,
                  amortized: bool | str = True, query_mask: Tensor | None = None) -> Posterior:
        """q(z|h) from per-head q (B, H, Tq, d) and k (B, H, Tk, d), pooled over time.

        ``key_mask`` (B, Tk) excludes padded keys from the pooling, ``query_mask`` (B, Tq) padded queries.
        ``amortized=False`` feeds zeros instead, so q(z) is a learned constant: no information from
        other positions reaches the kernel (use it for causal models, see the implicit module's notes).
        ``amortized="keys"`` feeds zeros for the pooled queries only: in a decoder's cross-attention the
        keys (the encoder's output) are all visible to every query, the other queries are not."""
        pooled_q = pool(q, query_mask)
        if amortized == "keys":
            pooled_q = torch.zeros_like(pooled_q)
        x = torch.cat([pooled_q, pool(k, key_mask)], dim=-1)
        if amortized is False:
            x = torch.zeros_like(x)
        mu, log_std, pre = self.posterior_net(x)
        L = copula_factor(torch.tanh(self.copula(pre))) if self.copula is not None else None
        return Posterior(mu, log_std, L)

    def correlation(self, post: Posterior) -> Tensor:
        """Copula correlation C = D^-1/2 L L^T D^-1/2: (B, d, H, H) (identity without copula)."""
        if post.L is None:
            h = post.mu.shape[1]
            return torch.eye(h, dtype=post.mu.dtype, device=post.mu.device).expand(
                post.mu.shape[0], post.mu.shape[2], h, h)
        sigma = post.L @ post.L.transpose(-1, -2)
        inv = sigma.diagonal(dim1=-2, dim2=-1).rsqrt()
        return sigma * inv.unsqueeze(-1) * inv.unsqueeze(-2)

    def noise(self, post: Posterior, n: int, rowsum: bool = False, clamp: bool = False,
              generator: torch.Generator | None = None, eps: Tensor | None = None) -> Tensor:
        """Standard-normal marginals X (B, H, n, d), correlated across heads by the copula; from the
        independent draws ``eps`` (B or 1, H, n, d) when given, else drawn here."""
        b, h, d = post.mu.shape
        if eps is None:
            eps = torch.randn(b, h, n, d, dtype=post.mu.dtype, device=post.mu.device, generator=generator)
        if post.L is not None:
            e = eps.permute(0, 3, 1, 2)                      # (B, d, H, n)
            if rowsum:                                       # the official einsum 'ijk,ijl->ijl'
                x = e * post.L.sum(-1, keepdim=True)
            else:                                            # L eps, standardised to unit variance
                sigma_diag = post.L.pow(2).sum(-1, keepdim=True)
                x = (post.L @ e) * sigma_diag.rsqrt()
            eps = x.permute(0, 2, 3, 1)                      # back to (B, H, n, d)
        return eps.clamp(-2.0, 2.0) if clamp else eps

    def sample(self, post: Posterior, R: int, rowsum: bool = False, clamp: bool = False, negatives: bool = False,
               generator: torch.Generator | None = None, fixed: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Base samples z (B, H, R, d) = [z~ || -z~], z~ = mu + std X, and the noise X used.

        ``fixed`` (2, 1, H, R/2, d): standard-normal draws to use instead of fresh ones (evaluation mode:
        every call, and every example, the same R points of the density), the second for the official
        independent negative half."""
        std = post.log_std.exp().unsqueeze(2)
        mu = post.mu.unsqueeze(2)
        x = self.noise(post, R // 2, rowsum, clamp, generator, None if fixed is None else fixed[0].to(mu.dtype))
        pos = mu + std * x
        if negatives:                                        # official: independent draw, mean -mu
            x_neg = self.noise(post, R // 2, rowsum, clamp, generator,
                               None if fixed is None else fixed[1].to(mu.dtype))
            return torch.cat([pos, -mu + std * x_neg], dim=2), torch.cat([x, x_neg], dim=2)
        return torch.cat([pos, -pos], dim=2), x

    def spectral(self, z: Tensor) -> list[Tensor]:
        """One spectral point set per generator, each (B, H, R, d)."""
        return [g(z) for g in self.generators]

    def regularizer(self, post: Posterior, x: Tensor | None, copula_loss: bool = False) -> tuple[Tensor, Tensor]:
        """(KL of the marginals to N(0, prior_std^2), copula term), both scalars summed over (B, H, d).

        The copula term is E_q[log c] = 1/2 sum_m log Sigma_mm per (b, i) (0 without copula), or, with
        ``copula_loss``, the official heuristic -sum U log(U + 1e-5), U = Phi(X)."""
        kl = gaussian_kl(post.mu, post.log_std, self.prior_std)
        if post.L is None:
            return kl, kl.new_zeros(())
        if copula_loss:
            if x is None:
                return kl, kl.new_zeros(())
            u = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
            return kl, -(u * (u + 1e-5).log()).sum()
        return kl, 0.5 * post.L.pow(2).sum(-1).log().sum()
