r"""Implicit Kernel Attention (Song et al. 2021) as kernels of the library: similarity × magnitude.

Every kernel here is positive (except ``linear-magnitude``) and computes, per head (d = d_head),

    log k(q, k) = log_similarity(q, k) + (||q||_p^2 + ||k||_p^2) / (2 sqrt(d))       (Prop. 1, Eq. 9)

and exposes both terms through ``decompose(q, k)`` (see :mod:`kernel_attention.kernels.decomposition`).

=================  =========================================================  ============================
name               similarity                                                 magnitude
=================  =========================================================  ============================
rbf-only           exp(-||q-k||^2 / (2 l^2)), l = d^(1/4)                      none (Tsai et al.'s RBF)
expsin             exp(-(2/l^2) sum_i sin^2(pi (q_i-k_i)/P)), P = 2 pi d^(1/4)  L2
linear-magnitude   <q,k>/sqrt(d) (direct kernel: may be negative)             L2
ikas               f^2 + eps, f = 1/R sum_r cos(w_r^T (q-k))                  L2     (Eqs. 12-13)
ikans              f^2 + eps, f = 1/(4R) sum_r phi_r(q)^T phi_r(k), (w1, w2)   L2     (Eqs. 14-16)
ikan               as ikans                                                   Lp     (p a parameter)
ikan-direct        as ikans, w1, w2 free parameters (H, R, d), no sampling   Lp
mikan              as ikan, heads' base samples joined by a Gaussian copula   Lp
=================  =========================================================  ============================

phi_r(x) = [cos(w1_r^T x) + cos(w2_r^T x), sin(w1_r^T x) + sin(w2_r^T x)].  The default periods and
lengthscales make every similarity agree with the dot product's (Prop. 1) for nearby q, k.  The first
three rows, and the similarity x magnitude protocol, are defined in
:mod:`kernel_attention.kernels.similarity_magnitude` and re-exported here.

**Spectral points** (ikas, ikans, ikan, mikan) come from an implicit density
(:class:`~kernel_attention.kernels.spectral.ImplicitDensity`): amortised q(z|h) from the time-pooled q and k
of the call, the symmetric base z = [z~, -z~], w = sign(z) NN(|z|), R samples (default 64).  In
``eval()`` mode the noise of the R draws is fixed (``eval_noise``, the same for every call and example), so
the layer is deterministic and its kernel is one Monte Carlo estimate of the trained one.  Pooling is over
all positions given, so in a causal model the spectral points of position t see later positions: pass
``amortized=false`` there (q(z) becomes a learned constant).  In a decoder's cross-attention the queries are such
a causal sequence and the keys (the encoder's output) are not: ``amortized=keys`` pools the keys only, so that
teacher-forced training and step-by-step decoding give every target position the same spectral points.  Padded
keys and queries leave the pooling: ``log_kernel(q, k, key_mask)`` takes the key mask, and
:func:`~kernel_attention.attention` hands its ``key_mask`` and ``query_mask`` to the kernel for the duration of a
call.

**Regulariser.** After a forward pass, ``kernel.regularization()`` is
kl_weight · KL(q(z|h) || N(0, prior_std^2)) + copula_weight · copula term (MIKAN), summed over
batch, heads and dimensions (not divided by anything).  :func:`regularization` sums it over a model;
the trainer adds ``regularization(model, n_train)`` = sum / n_train to the per-example loss, the
official code's convention (0.1 · KL / N_train).  A model exposes it as a method named
``regularization`` (the training loop calls ``model.regularization()`` when the model defines it).

**Sharing.** :func:`share_spectral` makes every implicit kernel of a model use the first one's
density (the paper's "shared spectral density estimator for each layer"); models call it at the end
of their constructor, before the optimiser is built.

**Official-code departures** (off by default; ``official=true`` turns all on): ``official_scale``
(magnitude over 2 d^(1/4): the code passes sqrt(d) as d), ``freq_scale`` (2 pi on w^T x),
``magnitude_dropout`` (0.1, dropout on the magnitude logits), ``official_rowsum`` (row-sum mixing,
i.e. no mixing), ``official_clamp`` (X in [-2, 2]), ``official_negatives`` (independent negative
half), ``official_copula_loss`` (heuristic -U log U instead of -1/2 log det C); ikan-direct also
takes the code's kaiming init.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from kernel_attention.kernels.decomposition import decompose, lp_norm_sq
from kernel_attention.kernels.base import KERNELS, SquaredForm
from kernel_attention.kernels.capabilities import PoolsKeys, SquaredFeatures
from kernel_attention.registry import Param
from kernel_attention.kernels.similarity_magnitude import (ExpSinKernel, LinearMagnitudeKernel, RBFOnlyKernel,
                                                   SimilarityMagnitudeKernel)
from kernel_attention.kernels.spectral import ImplicitDensity

__all__ = ["SimilarityMagnitudeKernel", "RBFOnlyKernel", "ExpSinKernel", "LinearMagnitudeKernel",
           "ImplicitKernel", "IKASKernel", "IKANSKernel", "IKANKernel", "IKANDirectKernel", "MIKANKernel",
           "regularization", "share_spectral", "decompose"]


# --------------------------------------------------------------------------------------------------
# The implicit family
# --------------------------------------------------------------------------------------------------

def _common_params(p: bool) -> list[Param]:
    out = [Param("R", int, 64, check=lambda x: x >= 2 and x % 2 == 0, rule="even, >= 2",
                 doc="spectral samples (R/2 positive, R/2 negative)")]
    if p:
        out.append(Param("p", float, 2.0, check=lambda x: x > 0, rule="> 0", doc="Lp norm of the magnitude"))
    out += [
        Param("eps", float, 1e-5, check=lambda x: x > 0, rule="> 0", doc="log(f^2 + eps)"),
        Param("freq_scale", float, None, optional=True, check=lambda x: x > 0,
              rule="> 0; default 1, 2 pi with official", doc="multiplier of w^T x"),
        Param("magnitude_dropout", float, None, optional=True, check=lambda x: 0 <= x < 1,
              rule="in [0, 1); default 0, 0.1 with official"),
        Param("official_scale", bool, False, doc="magnitude over 2 d^(1/4) as in the official code"),
        Param("official", bool, False, doc="turn every official-code departure on"),
    ]
    return out


_density_params = [
    Param("prior_std", float, 0.1, check=lambda x: x > 0, rule="> 0", doc="p(z) = N(0, prior_std^2)"),
    Param("kl_weight", float, 0.1, check=lambda x: x >= 0, rule=">= 0"),
    Param("amortized", (bool, str), True, choices=(True, False, "keys"),
          doc="q(z|h) from pooled q and k; keys: pooled keys only (a decoder's cross-attention); "
              "false: a learned constant (causal self-attention)"),
    Param("share", bool, True, doc="share_spectral(model) may replace this kernel's density"),
]
_copula_params = [
    Param("copula_weight", float, None, optional=True, check=lambda x: x >= 0,
          rule=">= 0; default kl_weight (1.0 with official_copula_loss)"),
    Param("official_rowsum", bool, False, doc="row-sum 'mixing' of the code's einsum"),
    Param("official_clamp", bool, False, doc="clamp X to [-2, 2]"),
    Param("official_negatives", bool, False, doc="independent negative half with mean -mu"),
    Param("official_copula_loss", bool, False, doc="code's -sum U log(U + 1e-5) copula loss"),
]


class ImplicitKernel(SquaredFeatures, PoolsKeys, SimilarityMagnitudeKernel):
    """Random-Fourier similarity f^2 + eps with spectral points from an implicit density (or, in
    :class:`IKANDirectKernel`, parameters) and an Lp magnitude.  Needs ``d_head`` (and ``n_heads``):
    built by :class:`~kernel_attention.KernelAttention` or ``make_kernel(spec, n_heads=, d_head=)``."""

    n_generators = 2
    copula = False


    @property
    def pools_over_positions(self) -> bool:
        """Whether q(z|h) reads the keys pooled over every position (then a filter that hides keys
        would leak them through the spectral points; KernelAttention refuses that combination)."""
        return self.amortized is not False and self.uses_density

    @property
    def pools_queries(self) -> bool:
        """Whether q(z|h) also reads the queries pooled over every position (then, where the queries are a
        causal sequence, as in a decoder's cross-attention, each would see later ones; TransformerBlock
        refuses that combination)."""
        return self.amortized is True and self.uses_density

    def __init__(self, n_heads: int | None = None, d_head: int | None = None, *, R: int = 64, p: float = 2.0,
                 eps: float = 1e-5, freq_scale: float | None = None, magnitude_dropout: float | None = None,
                 official_scale: bool = False, official: bool = False, prior_std: float = 0.1,
                 kl_weight: float = 0.1, amortized: bool | str = True, share: bool = True,
                 copula_weight: float | None = None, official_rowsum: bool = False, official_clamp: bool = False,
                 official_negatives: bool = False, official_copula_loss: bool = False):
        super().__init__()
        if d_head is None or n_heads is None:
            raise ValueError(f"kernel {self.name!r} holds per-head spectral parameters and needs n_heads and "
                             f"d_head: use KernelAttention(kernel={self.name!r}) or make_kernel({self.name!r}, "
                             f"n_heads=..., d_head=...)")
        self.n_heads, self.d_head, self.R, self.p, self.eps = n_heads, d_head, R, p, eps
        self.freq_scale = (2 * math.pi if official else 1.0) if freq_scale is None else freq_scale
        self.magnitude_dropout = (0.1 if official else 0.0) if magnitude_dropout is None else magnitude_dropout
        self.official_scale = official_scale or official
        self.official = official
        self.kl_weight, self.amortized, self.share = kl_weight, amortized, share
        self.rowsum, self.clamp = official_rowsum or official, official_clamp or official
        self.negatives, self.copula_loss = official_negatives or official, official_copula_loss or official
        self.copula_weight = ((1.0 if self.copula_loss else kl_weight) if copula_weight is None else copula_weight)
        self.density = (ImplicitDensity(d_head, self.n_generators, self.copula, prior_std)
                        if self.uses_density else None)
        if self.uses_density:
            # evaluation takes these R draws of the noise (a fixed seed, so not kept in checkpoints); the
            # density's mean alone would be one pair of frequencies, another kernel than the one trained
            self.register_buffer("eval_noise", self._fixed_noise(torch.get_default_device()), persistent=False)
        self._record: dict = {}  # the last call's KL and copula terms

    uses_density = True

    def _fixed_noise(self, device) -> Tensor:
        gen = torch.Generator().manual_seed(0)
        return torch.randn(2, 1, self.n_heads, self.R // 2, self.d_head, generator=gen, device="cpu").to(device)

    def _apply(self, fn, recurse=True):
        """As nn.Module's; a module built on the meta device and moved off it (``to_empty``) draws its fixed
        evaluation noise again, which no checkpoint holds (``to_empty`` leaves the buffer uninitialised)."""
        was_meta = self.uses_density and self.eval_noise.is_meta
        out = super()._apply(fn, recurse)
        if was_meta and not self.eval_noise.is_meta:
            self.eval_noise = self._fixed_noise(self.eval_noise.device).to(self.eval_noise.dtype)
        return out

    def __getstate__(self) -> dict:
        """The module's state less the last call's KL and copula terms, which hold that call's graph: a copy
        (copy.deepcopy for an EMA of the weights) or a pickle of the module is taken between calls."""
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {**state, "_record": {}}

    def hparams(self) -> dict:
        return {"n_heads": self.n_heads, "d_head": self.d_head, "R": self.R, "p": self.p,
                "freq_scale": self.freq_scale, "official": self.official}

    def denom(self, d: int) -> float:
        return 2.0 * d ** 0.25 if self.official_scale else 2.0 * math.sqrt(d)

    # -- spectral points -------------------------------------------------------------------------
    def prepare(self, q: Tensor, k: Tensor, key_mask: Tensor | None = None) -> list[Tensor]:
        """Spectral points for this call, each (B, H, R, d); records the KL for :meth:`regularization`."""
        if key_mask is None:
            key_mask = self.pool_key_mask
        post = self.density.posterior(q, k, key_mask, self.amortized, query_mask=self.pool_query_mask)
        z, x = self.density.sample(post, self.R, rowsum=self.rowsum, clamp=self.clamp, negatives=self.negatives,
                                   fixed=None if self.training else self.eval_noise)
        self._record["kl"], self._record["copula"] = self.density.regularizer(post, x, self.copula_loss)
        return self.density.spectral(z)

    def features(self, x: Tensor, ws: list[Tensor]) -> Tensor:
        """phi(x): (B, H, T, d) -> (B, H, T, 2R); f = phi(q)^T phi(k) / :meth:`feature_norm`."""
        angles = [self.freq_scale * (x @ w.transpose(-1, -2)) for w in ws]   # (B, H, T, R) each
        return torch.cat([sum(a.cos() for a in angles), sum(a.sin() for a in angles)], dim=-1)

    def feature_norm(self, ws: list[Tensor]) -> float:
        return ws[0].shape[-2] * len(ws) ** 2      # R (Eq. 12) or 4R (Eq. 14)

    def similarity(self, q: Tensor, k: Tensor, ws: list[Tensor]) -> Tensor:
        """f(q, k) in [-1, 1], (B, H, Tq, Tk)."""
        return self.features(q, ws) @ self.features(k, ws).transpose(-1, -2) / self.feature_norm(ws)

    def log_similarity(self, q, k, state=None):
        ws = self.prepare(q, k) if state is None else state
        return (self.similarity(q, k, ws).pow(2) + self.eps).log()

    def _feature_similarity(self) -> bool:
        """Whether the similarity is the random-feature one above (a subclass may redefine it)."""
        return type(self).log_similarity is ImplicitKernel.log_similarity

    def blockwise(self, q: Tensor, k: Tensor):
        """:meth:`BlockState.blockwise` with phi(q), phi(k) computed once per call and sliced per block:
        log k = log((phi(q)[rows] phi(k)[cols]^T / n)^2 + eps) + magnitude."""
        if not self._feature_similarity():
            return super().blockwise(q, k)
        ws = self.prepare(q, k)
        fq, fk = self.features(q, ws) / self.feature_norm(ws), self.features(k, ws)
        ab, mag = self.block_magnitude(q, k)

        def f(r, c, q, k, fq, fk, *ab):
            sim = torch.matmul(fq[..., r, :], fk[..., c, :].transpose(-1, -2))
            out = torch.addcmul(sim.new_full((), self.eps), sim, sim).log()
            return out if mag is None else out + mag(r, c, *ab)
        f.sliced_args = ["rows", "cols"] + ["rows", "cols"][:len(ab)]
        return [fq, fk] + ab, f

    def has_squared_form(self) -> bool:
        """Whether :class:`SquaredForm` holds: not for a subclass that redefines the similarity or the
        magnitude."""
        return (self._feature_similarity()
                and type(self).log_magnitude is SimilarityMagnitudeKernel.log_magnitude)

    def squared_key_log(self, k: Tensor) -> Tensor | None:
        """The magnitude's key term ||k||_p^2 / denom, (B, H, Tk) (zero without a magnitude), over
        1 - p while magnitude dropout applies (:meth:`magnitude_scale`)."""
        if not self.has_squared_form():
            return None
        if not self.use_magnitude:
            return k.new_zeros(k.shape[:-1])
        return lp_norm_sq(k, self.p) * self.magnitude_scale(k.shape[-1])[1]

    def squared_form(self, q: Tensor, k: Tensor, key_log: Tensor | None = None) -> SquaredForm | None:
        """k = (f^2 + eps) · exp(magnitude), f = phi(q)^T phi(k) / n: the features with 1/n on phi(q).
        While magnitude dropout applies, also the query term and the call's dropout seed, drawn after
        the spectral points as in :meth:`blockwise` (``torch.manual_seed`` fixes both)."""
        if not self.has_squared_form():
            return None
        ws = self.prepare(q, k)
        form = SquaredForm(self.features(q, ws) / self.feature_norm(ws), self.features(k, ws), self.eps,
                           self.squared_key_log(k) if key_log is None else key_log)
        if self.drops_magnitude:
            form.drop, scale = self.magnitude_scale(q.shape[-1])
            form.query_log = lp_norm_sq(q, self.p) * scale
            form.seed = self.dropout_seed(form.drop)
        return form

    def regularization(self) -> Tensor:
        """kl_weight · KL + copula_weight · copula term of the last forward pass (0 before any)."""
        if not self._record:
            return torch.zeros(())
        return self.kl_weight * self._record["kl"] + self.copula_weight * self._record["copula"]


_P, _NOP = _common_params(True), _common_params(False)


@KERNELS.register("ikas", _NOP + _density_params)
class IKASKernel(ImplicitKernel):
    """Stationary implicit kernel: f = 1/R sum cos(w_r^T (q-k)), one generator, squared, L2 magnitude."""

    name = "ikas"
    n_generators = 1

    def __init__(self, n_heads=None, d_head=None, **kw):
        super().__init__(n_heads, d_head, p=2.0, **kw)


@KERNELS.register("ikans", _NOP + _density_params)
class IKANSKernel(ImplicitKernel):
    """Non-stationary implicit kernel (Eqs. 14-16), two generators, squared, L2 magnitude."""

    name = "ikans"

    def __init__(self, n_heads=None, d_head=None, **kw):
        super().__init__(n_heads, d_head, p=2.0, **kw)


@KERNELS.register("ikan", _P + _density_params)
class IKANKernel(ImplicitKernel):
    """IKANS with the Lp magnitude (||q||_p^2 + ||k||_p^2)/(2 sqrt(d)); sparser as p -> 0 (Prop. 5)."""

    name = "ikan"


@KERNELS.register("mikan", _P + _density_params + _copula_params)
class MIKANKernel(ImplicitKernel):
    """IKAN whose heads' base samples are joined by a Gaussian copula (true L·eps mixing)."""

    name = "mikan"
    copula = True


@KERNELS.register("ikan-direct", _P)
class IKANDirectKernel(ImplicitKernel):
    """IKAN with the spectral points w1, w2 (H, R, d) as parameters: deterministic, no KL.

    Init: N(0, 1/(2 sqrt(d))), the dot product's spectral density (Prop. 3 with l^2 = sqrt(d));
    with ``official`` the code's kaiming_uniform(a=sqrt(5)) over fan_in = H·R (then times 2 pi)."""

    name = "ikan-direct"
    uses_density = False

    def __init__(self, n_heads=None, d_head=None, **kw):
        super().__init__(n_heads, d_head, **kw)
        self.w = nn.ParameterList(nn.Parameter(torch.empty(n_heads, self.R, d_head)) for _ in range(2))
        for w in self.w:
            if self.official:
                nn.init.uniform_(w, -1 / math.sqrt(n_heads * self.R), 1 / math.sqrt(n_heads * self.R))
            else:
                nn.init.normal_(w, std=(2 * math.sqrt(d_head)) ** -0.5)

    def prepare(self, q, k, key_mask=None):
        return [w.unsqueeze(0) for w in self.w]

    def regularization(self) -> Tensor:
        return self.w[0].new_zeros(())


# --------------------------------------------------------------------------------------------------
# Model-level helpers
# --------------------------------------------------------------------------------------------------

def regularization(model: nn.Module, n_train: float = 1.0) -> Tensor:
    """sum over the implicit kernels of ``model`` of ``kernel.regularization()``, divided by
    ``n_train`` (the number of training examples: the ELBO's KL per example; official code:
    0.1 · KL / N_train with the default kl_weight).  A scalar; 0 when the model has none."""
    if isinstance(n_train, bool) or not isinstance(n_train, (int, float)) or not n_train > 0:
        raise ValueError(f"n_train is the number of training examples, a number > 0; got {n_train!r}")
    terms = [m.regularization() for m in model.modules() if isinstance(m, SimilarityMagnitudeKernel)]
    if not terms:
        return torch.zeros(())
    return sum(terms) / n_train


def share_spectral(model: nn.Module) -> int:
    """Make every implicit kernel of ``model`` (with ``share=true``) use the density of the first one
    with the same structure (d_head, generators, copula, prior); returns how many were re-pointed.
    Call before building the optimiser: replaced densities leave ``model.parameters()``."""
    first: dict[tuple, ImplicitDensity] = {}
    changed = 0
    for m in model.modules():
        if isinstance(m, ImplicitKernel) and m.density is not None and m.share:
            sig = m.density.signature()
            if sig not in first:
                first[sig] = m.density
            elif m.density is not first[sig]:
                m.density = first[sig]
                changed += 1
    return changed
