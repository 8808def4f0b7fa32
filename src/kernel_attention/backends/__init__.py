"""Attention backends: ``dense`` (reference), ``fused`` (soft-max of log k on PyTorch's fused attention)
and ``linear`` (finite feature maps), chosen by :func:`choose` (``backend="auto"``) or by name.

    from kernel_attention.backends import BACKENDS
    kernel_attention.explain(q, k, v, kernel="rbf", mask="causal")   # which backend, and why
"""

from kernel_attention.backends.base import BACKENDS, Backend, Problem
from kernel_attention.backends import dense, fused, linear  # noqa: F401  (register the backends)
from kernel_attention.backends.dispatch import AUTO, BackendError, Choice, choose, linear_crossover

__all__ = ["BACKENDS", "Backend", "Problem", "AUTO", "BackendError", "Choice", "choose", "linear_crossover"]
