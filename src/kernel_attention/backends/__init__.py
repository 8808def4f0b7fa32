"""Attention backends, each a named way to run the kernel smoother, tried by ``backend="auto"`` in the
order of :data:`ORDER`: ``sdpa``, ``triton``, ``flex``, ``banded``, ``squared``, ``blockwise``, ``linear``,
``dense``.

    from kernel_attention.backends import BACKENDS, ORDER
    print(kernel_attention.explain(q, k, v, kernel="rbf", mask="causal"))   # each backend, and why
"""

from kernel_attention.backends.base import BACKENDS, Backend, Problem
from kernel_attention.backends import (sdpa, flex, banded, squared, blockwise, linear,  # noqa: F401  (register
                                       dense, triton_flash)                              # the backends)
from kernel_attention.backends.dispatch import AUTO, ORDER, BackendError, Choice, KernelCompileError, choose
from kernel_attention.backends.first_order import SecondDerivativeError
from kernel_attention.backends.linear import linear_crossover
from kernel_attention.backends.policy import POLICIES, DevicePolicy, policy

__all__ = ["BACKENDS", "Backend", "Problem", "AUTO", "ORDER", "BackendError", "KernelCompileError", "Choice", "choose",
           "SecondDerivativeError", "linear_crossover", "POLICIES", "DevicePolicy", "policy"]
