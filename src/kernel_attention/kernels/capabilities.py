r"""Optional capabilities of a kernel, which backends ask for; the :class:`~kernel_attention.kernels.base.Kernel`
base class itself has none.

A kernel class says what it can do by mixing one in:

* :class:`SDPAFeatures` -- log k(q_i, k_j) = scale · <q_i', k_j'> + kb_j + (row constant), :class:`SDPAForm`:
  the exponential family (``exp``, ``rbf``, ``periodic``) runs on fused soft-max attention;
* :class:`FeatureMap` -- k(a, b) = <phi(a), phi(b)> with a finite phi: ``linear``, ``poly``, the linear-time
  backend;
* :class:`SquaredFeatures` -- k = (<q', k'>^2 + eps) · exp(key_log_j), :class:`SquaredForm`: the implicit
  kernels, formed per block without a logarithm;
* :class:`BlockState` -- per-call state (sampled spectral points, features) drawn once and read by every
  block of a blocked backend;
* :class:`PoolsKeys` -- per-call state pooled over the keys (the implicit kernels' amortized density), which
  must leave out the padded ones: :func:`~kernel_attention.attention` gives the kernel the call's key mask
  for the duration of the call (:func:`pools_keys`).

Backends ask through the functions below, which answer None (or the generic form) for a kernel without
the capability, so no backend reads an attribute a kernel may lack.
"""

from __future__ import annotations

from torch import Tensor

from kernel_attention.kernels.base import Kernel, SDPAForm, SquaredForm, kernel_matrix

__all__ = ["SDPAFeatures", "FeatureMap", "SquaredFeatures", "BlockState", "PoolsKeys", "sdpa_layout", "sdpa_form",
           "feature_map", "has_squared_form", "block_log_kernel", "pools_keys"]


class SDPAFeatures:
    """Capability: the kernel as features for fused attention."""

    def sdpa_form(self, q: Tensor, k: Tensor, key_bias: str = "features") -> SDPAForm:
        """This kernel as :class:`SDPAForm`.  ``key_bias`` asks for a per-key term as an augmented feature
        (``"features"``) or as a separate bias (``"mask"``); kernels without such a term ignore it."""
        raise NotImplementedError

    def sdpa_layout(self, key_bias: str = "features") -> str:
        """What :meth:`sdpa_form` returns, without computing it: ``"bias"`` (a form with a key bias) or
        ``"features"``."""
        return "features"


class FeatureMap:
    """Capability: a finite feature map."""

    def feature_map(self, x: Tensor) -> Tensor | None:
        """phi with k(a, b) = <phi(a), phi(b)>: (..., D) -> (..., F), or None where it would be too large to
        be worth it (a high polynomial degree)."""
        raise NotImplementedError


class SquaredFeatures:
    """Capability: the kernel as :class:`SquaredForm`."""

    def has_squared_form(self) -> bool:
        """Whether :meth:`squared_form` returns a form for this instance (decided without any tensor)."""
        return True

    def squared_key_log(self, k: Tensor) -> Tensor | None:
        """The per-key log factor of :class:`SquaredForm`, (B, H, Tk).  Separate from :meth:`squared_form` so
        that a backend can check its range (a factor that spans too many orders of magnitude underflows)
        before any per-call state is drawn."""
        raise NotImplementedError

    def squared_form(self, q: Tensor, k: Tensor, key_log: Tensor | None = None) -> SquaredForm | None:
        """This kernel as :class:`SquaredForm`; draws the per-call state (spectral points) as ``log_kernel``
        does, so call it once per call.  ``key_log``: :meth:`squared_key_log`'s result (possibly masked)."""
        raise NotImplementedError


class BlockState:
    """Capability: per-call state shared by the blocks of one call."""

    def blockwise(self, q: Tensor, k: Tensor):
        """``(state, f)`` with log k(q[rows], k[cols]) = f(rows, cols, q, k, *state); ``f.sliced_args`` says
        how f reads each state tensor ("rows", "cols" or None = whole)."""
        return _per_pair(self)


class PoolsKeys:
    """Capability: per-call state pooled over the keys (and queries); ``pool_key_mask`` (B, Tk) and
    ``pool_query_mask`` (B, Tq) are the running call's padding masks (None outside a call, or without padding)."""

    pool_key_mask: Tensor | None = None
    pool_query_mask: Tensor | None = None

    @property
    def pools_over_positions(self) -> bool:
        """Whether this instance pools over the keys (then a filter that hides keys would leak them)."""
        return True


def pools_keys(kernel: Kernel) -> bool:
    """Whether the kernel pools over the keys, so that a call must give it its padding mask."""
    return isinstance(kernel, PoolsKeys) and kernel.pools_over_positions


def sdpa_layout(kernel: Kernel, key_bias: str = "features") -> str | None:
    """``"features"``, ``"bias"`` or None (no SDPA form)."""
    return kernel.sdpa_layout(key_bias) if isinstance(kernel, SDPAFeatures) else None


def sdpa_form(kernel: Kernel, q: Tensor, k: Tensor, key_bias: str = "features") -> SDPAForm | None:
    """The kernel's :class:`SDPAForm` on q, k, or None."""
    return kernel.sdpa_form(q, k, key_bias=key_bias) if isinstance(kernel, SDPAFeatures) else None


def feature_map(kernel: Kernel, x: Tensor) -> Tensor | None:
    """phi(x), or None when the kernel has no finite feature map."""
    return kernel.feature_map(x) if isinstance(kernel, FeatureMap) else None


def has_squared_form(kernel: Kernel) -> bool:
    """Whether the kernel runs as :class:`SquaredForm`."""
    return isinstance(kernel, SquaredFeatures) and kernel.has_squared_form()


def block_log_kernel(kernel: Kernel, q: Tensor, k: Tensor):
    """``(state, f)`` forming log k a block at a time (:meth:`BlockState.blockwise`); for a kernel without
    per-call state f is ``log_kernel`` on the slices, right for every kernel whose value on a pair depends on
    that pair alone."""
    return kernel.blockwise(q, k) if isinstance(kernel, BlockState) else _per_pair(kernel)


def _per_pair(kernel: Kernel):
    def f(r, c, q, k):
        return kernel_matrix(kernel, q[..., r, :], k[..., c, :])
    f.sliced_args = []
    return [], f
