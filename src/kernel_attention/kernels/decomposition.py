r"""Attention = similarity × magnitude (Implicit Kernel Attention, Propositions 1 and 2).

Proposition 1 (scaled dot product, d = per-head dimension):

    exp(<q,k>/sqrt(d)) = exp(-||q-k||^2 / (2 sqrt(d)))  ·  exp((||q||^2 + ||k||^2) / (2 sqrt(d)))
                         \_______ similarity ________/     \___________ magnitude ____________/

the similarity being an RBF kernel of lengthscale d^(1/4).  Proposition 2 (GAT, Eq. 2), with
q_i = [W h_i || 0], k_j = [0 || W h_j] and c the LeakyReLU slope of the *active* branch of each edge:

    exp(LeakyReLU(a^T [W h_i || W h_j])) = exp(-||q_i - c a||^2 / 2) · exp(-||c a - k_j||^2 / 2)
                                           · exp((2 ||c a||^2 + ||q_i||^2 + ||k_j||^2) / 2)

Everything is returned in log space as ``(log_similarity, log_magnitude)`` whose sum is the log
kernel, so models can log or plot both factors (Fig. 3 of the paper).  The magnitude generalises to
the squared Lp norm ||x||_p^2 (IKAN, Prop. 5), computed here without overflow for p -> 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["lp_norm_sq", "magnitude", "exp_decompose", "gat_decompose", "decompose", "MAGNITUDE_CAP"]

#: The magnitude of one vector is capped at finfo.max * MAGNITUDE_CAP so that q and k terms, the
#: similarity and positional terms still add up to a finite logit (soft-max of +inf is NaN).
MAGNITUDE_CAP = 1.0 / 16


def lp_norm_sq(x: Tensor, p: float = 2.0) -> Tensor:
    r"""||x||_p^2 = (sum_i |x_i|^p)^(2/p) over the last axis: (..., D) -> (...).

    p = 2 is the plain sum of squares.  Other p go through logs,
    2/p · logsumexp(p · log|x_i|), so the p -> 0+ limit (where ||x||_p grows like D^(1/p)) stays
    finite up to the cap; exact zeros contribute 0 (also for small p) with finite gradients.
    """
    if p == 2.0:
        out = x.pow(2).sum(-1)
    else:
        tiny = torch.finfo(x.dtype).tiny
        # p·log|x_i|, with exact zeros sent to -1e4 (exp(-1e4) = 0) rather than -inf, whose
        # logsumexp gradient would be NaN for an all-zero vector.
        plog = torch.where(x != 0, p * x.abs().clamp_min(tiny).log(), torch.full_like(x, -1e4))
        log_norm_sq = (2.0 / p) * torch.logsumexp(plog, dim=-1)
        cap = math.log(torch.finfo(x.dtype).max * MAGNITUDE_CAP)
        out = log_norm_sq.clamp_max(cap).exp()
    return out.clamp_max(torch.finfo(x.dtype).max * MAGNITUDE_CAP)


def magnitude(q: Tensor, k: Tensor, p: float = 2.0, denom: float | None = None) -> Tensor:
    r"""log magnitude (||q_i||_p^2 + ||k_j||_p^2) / denom, broadcast to (B, H, Tq, Tk).

    ``denom`` defaults to 2·sqrt(d) (Prop. 1).  The ||q_i|| term is constant along a soft-max row and
    cancels there; it is kept so that similarity + magnitude is the kernel itself.
    """
    denom = 2.0 * math.sqrt(q.shape[-1]) if denom is None else denom
    return (lp_norm_sq(q, p).unsqueeze(-1) + lp_norm_sq(k, p).unsqueeze(-2)) / denom


def exp_decompose(q: Tensor, k: Tensor, scale: float | None = None) -> tuple[Tensor, Tensor]:
    r"""Proposition 1 for exp(s <q,k>), s = 1/sqrt(d) by default: (B,H,Tq,D), (B,H,Tk,D) ->
    (log_similarity, log_magnitude), each (B, H, Tq, Tk), with

        log_similarity = -s ||q - k||^2 / 2,   log_magnitude = s (||q||^2 + ||k||^2) / 2.

    The squared distance is computed directly (not as ||q||^2 + ||k||^2 - 2<q,k>), so the similarity
    is accurate even when the magnitude is large."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dist2 = (q.unsqueeze(-2) - k.unsqueeze(-3)).pow(2).sum(-1)
    return -0.5 * s * dist2, magnitude(q, k, 2.0, 2.0 / s)


def gat_decompose(x_i: Tensor, x_j: Tensor, a_i: Tensor, a_j: Tensor,
                  negative_slope: float = 0.2) -> tuple[Tensor, Tensor]:
    r"""Proposition 2, per edge: GAT's log weight LeakyReLU(a_i^T x_i + a_j^T x_j) as
    ``(log_similarity, log_magnitude)``.

    Args:
        x_i: (E, H, d) W h of the centre node of each edge (the node whose neighbourhood is normalised).
        x_j: (E, H, d) W h of the neighbour.
        a_i, a_j: (H, d) the two halves of GAT's attention vector a = [a_i || a_j].

    With q = [x_i || 0], k = [0 || x_j] and c = 1 where a^T[x_i||x_j] >= 0, else ``negative_slope``:
    log_similarity = -||q - c a||^2/2 - ||c a - k||^2/2, log_magnitude = (2||c a||^2 + ||q||^2 + ||k||^2)/2.
    Both (E, H).
    """
    pre = (x_i * a_i).sum(-1) + (x_j * a_j).sum(-1)
    c = torch.where(pre >= 0, torch.ones_like(pre), torch.full_like(pre, negative_slope)).unsqueeze(-1)
    ca_i, ca_j = c * a_i, c * a_j                    # c·a split in its q half and its k half
    # ||q - c a||^2 = ||x_i - c a_i||^2 + ||c a_j||^2 ;  ||c a - k||^2 = ||c a_i||^2 + ||c a_j - x_j||^2
    d_q = (x_i - ca_i).pow(2).sum(-1) + ca_j.pow(2).sum(-1)
    d_k = ca_i.pow(2).sum(-1) + (ca_j - x_j).pow(2).sum(-1)
    ca2 = ca_i.pow(2).sum(-1) + ca_j.pow(2).sum(-1)
    log_sim = -0.5 * (d_q + d_k)
    log_mag = 0.5 * (2 * ca2 + x_i.pow(2).sum(-1) + x_j.pow(2).sum(-1))
    return log_sim, log_mag


def decompose(kernel, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """``(log_similarity, log_magnitude)`` of a kernel: Prop. 1 for ``exp``, the kernel's own
    ``decompose`` for the implicit family (``rbf-only``, ``expsin``, ``ikas``, ..., ``mikan``).

    ``kernel`` is a :class:`~kernel_attention.kernels.Kernel` or a spec (name, ``"name:key=value"``) of a kernel
    without learned weights: a name of one with weights (``ikan``, ``mikan``, ...) would give a freshly initialised
    kernel's, another at each call."""
    from kernel_attention.kernels import ExpKernel, make_kernel

    if not hasattr(kernel, "log_kernel"):
        made = make_kernel(kernel, n_heads=q.shape[1], d_head=q.shape[-1])
        if next(made.parameters(), None) is not None:
            raise ValueError(f"kernel {made.name!r} has learned weights: pass the kernel module itself (a layer's "
                             f"layer.kernel, in eval() for a fixed draw), not its name, whose kernel would be a "
                             f"new random one")
        kernel = made
    if isinstance(kernel, ExpKernel):
        return exp_decompose(q, k, kernel.scale)
    if hasattr(kernel, "decompose"):
        return kernel.decompose(q, k)
    raise ValueError(f"kernel {kernel.name!r} has no similarity x magnitude decomposition; accepted: exp and "
                     f"the implicit kernels (rbf-only, expsin, linear-magnitude, ikas, ikans, ikan, "
                     f"ikan-direct, mikan)")
