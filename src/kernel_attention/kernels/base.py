r"""The kernel base class, the forms backends read (:class:`SDPAForm`, :class:`SquaredForm`), the kernel
registry and :func:`make_kernel`.

A kernel acts on per-head projected features q (B, H, Tq, D) and k (B, H, Tk, D).  Positive kernels
(``positive = True``) return log k, and the smoother takes a soft-max of it; direct kernels return k, which
the smoother normalises as k / sum k.  The kernels themselves live in :mod:`~kernel_attention.kernels.classic`
(Transformer Dissection's) and :mod:`~kernel_attention.kernels.implicit` (Implicit Kernel Attention's).
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from kernel_attention.registry import Registry

__all__ = ["Kernel", "SDPAForm", "SquaredForm", "KERNELS", "make_kernel"]


@dataclasses.dataclass
class SDPAForm:
    r"""A positive kernel written for fused soft-max attention:

        log k(q_i, k_j) = scale · <q_i', k_j'> + key_bias_j + (a term constant along each row)

    ``q`` (B, H, Tq, D'), ``k`` (B, H, Tk, D') are the (possibly augmented) features and ``key_bias``
    (B, H, 1, Tk) or None a per-key term.  The row-constant term cancels in the smoother."""

    q: Tensor
    k: Tensor
    scale: float
    key_bias: Tensor | None = None


@dataclasses.dataclass
class SquaredForm:
    r"""A positive kernel that is a squared feature product times a per-key factor:

        k(q_i, k_j) = c_i · (<q_i', k_j'>^2 + eps) · exp(key_log_j)

    ``q`` (B, H, Tq, F) and ``k`` (B, H, Tk, F) are the features (any normaliser folded into ``q``),
    ``key_log`` (B|1, H, Tk) the per-key log factor; c_i > 0 is constant along a row and cancels.  The
    implicit kernels (random-feature similarity f^2 + eps times the magnitude) have this form, which
    lets a backend form k itself per pair instead of log k (:mod:`kernel_attention.backends.squared`).

    With ``drop`` > 0 (magnitude dropout, the implicit kernels' official form in training) the pair's
    magnitude is dropped, not the row's, so the query's factor no longer cancels:

        k(q_i, k_j) = (<q_i', k_j'>^2 + eps) · exp(D_ij · (query_log_i + key_log_j))

    ``query_log`` (B|1, H, Tq); both logs already carry the 1 / (1 - drop) of inverted dropout, and
    D_ij is 1 where the block whose first query row is r0 and first key c0 keeps the pair:
    ``keep_mask((B, H, keys, rows), drop, block_seed(seed, r0, c0))`` transposed
    (:mod:`kernel_attention.dropout`), the distribution of
    :meth:`SimilarityMagnitudeKernel.block_magnitude`'s masks in the squared path's key-major layout."""

    q: Tensor
    k: Tensor
    eps: float
    key_log: Tensor
    query_log: Tensor | None = None
    drop: float = 0.0
    seed: int = 0


class Kernel(nn.Module):
    """Base class of a kernel on per-head features.

    Subclasses set ``positive`` and implement :meth:`log_kernel` (positive kernels) or :meth:`kernel`
    (direct kernels).  ``psd`` says whether the kernel is positive semi-definite when both arguments
    come from the same projection (the symmetric form).
    """

    name: str = "kernel"
    positive: bool = True
    psd: bool = True

    def __init__(self):
        # An explicit signature: the registry passes context sizes (n_heads, d_head) only to
        # constructors that name them, and nn.Module's own (*args, **kwargs) would accept anything.
        super().__init__()

    def log_kernel(self, q: Tensor, k: Tensor) -> Tensor:
        """log k(q_i, k_j): (B, H, Tq, D), (B, H, Tk, D) -> (B, H, Tq, Tk)."""
        raise NotImplementedError(f"kernel {self.name!r} is not positive; use .kernel()")

    def kernel(self, q: Tensor, k: Tensor) -> Tensor:
        """k(q_i, k_j): (B, H, Tq, D), (B, H, Tk, D) -> (B, H, Tq, Tk)."""
        return self.log_kernel(q, k).exp()

    def sdpa_form(self, q: Tensor, k: Tensor, key_bias: str = "features") -> SDPAForm | None:
        """This kernel as features for fused attention (:class:`SDPAForm`), or None when it has none
        (then fast backends feed ``log_kernel`` block by block as an additive term).  ``key_bias``
        asks for a per-key term as an augmented feature (``"features"``) or as a separate bias
        (``"mask"``); kernels without such a term ignore it."""
        return None

    def sdpa_layout(self, key_bias: str = "features") -> str | None:
        """What :meth:`sdpa_form` returns, without computing it (the backends ask several times per
        call): None (no form), ``"bias"`` (a form with a key bias) or ``"features"``.  A kernel that
        overrides :meth:`sdpa_form` overrides this too where the answer is not ``"features"``."""
        return None if type(self).sdpa_form is Kernel.sdpa_form else "features"

    def blockwise(self, q: Tensor, k: Tensor):
        """``(state, f)`` with log k(q[rows], k[cols]) = f(rows, cols, q, k, *state) for any block of query
        rows and key columns; per-call state (sampled spectral points, features) is computed once here.

        Fast backends use it to form log k a block at a time.  Here there is no state and f is
        :meth:`log_kernel` on the slices -- right for every kernel whose value on a pair depends on
        that pair alone.  Kernels with per-call state override it (the similarity x magnitude kernels
        draw their spectral points once; the implicit family also computes phi once)."""
        # Each f reads q[..., r, :] and k[..., c, :] once; ``f.sliced_args`` declares how it reads its
        # state ("rows", "cols" or None = whole), which lets backends give each block its own leaves.
        def f(r, c, q, k):
            return self.log_kernel(q[..., r, :], k[..., c, :])
        f.sliced_args = []
        return [], f

    def has_squared_form(self) -> bool:
        """Whether :meth:`squared_form` returns a :class:`SquaredForm` (decided without any tensor)."""
        return False

    def squared_key_log(self, k: Tensor) -> Tensor | None:
        """The per-key log factor of :class:`SquaredForm`, (B, H, Tk), or None when the kernel has no
        such form.  Separate from :meth:`squared_form` so that a backend can check its range (a factor
        that spans too many orders of magnitude underflows) before any per-call state is drawn."""
        return None

    def squared_form(self, q: Tensor, k: Tensor, key_log: Tensor | None = None) -> SquaredForm | None:
        """This kernel as :class:`SquaredForm`, or None; draws the per-call state (spectral points)
        as :meth:`log_kernel` does, so call it once per call.  ``key_log``: the result of
        :meth:`squared_key_log` (possibly masked) where the caller has it, used as the form's key term."""
        return None

    def feature_map(self, x: Tensor) -> Tensor | None:
        """A finite feature map phi with k(a, b) = <phi(a), phi(b)>: (..., D) -> (..., F), or None when
        the kernel has none (or it is too large to be worth it).  Used by the linear-time backend."""
        return None

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.hparams().items())

    def hparams(self) -> dict:
        return {}


KERNELS = Registry("kernel", base=Kernel)

def make_kernel(spec, **context) -> Kernel:
    """A kernel from a name, ``"name:key=value"``, a mapping, or a :class:`Kernel` instance.

    ``context`` (``n_heads``, ``d_head``, ...) reaches kernels whose constructor names it, e.g. the
    implicit kernels that hold per-head spectral parameters."""
    return KERNELS.create(spec, **context)
