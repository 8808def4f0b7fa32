"""Kernels k(·,·) on the features: the base class and registry (:mod:`~kernel_attention.kernels.base`),
Transformer Dissection's kernels (:mod:`~kernel_attention.kernels.classic`: exp, rbf, periodic, poly, linear),
and Implicit Kernel Attention's similarity x magnitude family (:mod:`~kernel_attention.kernels.similarity_magnitude`,
:mod:`~kernel_attention.kernels.implicit`, with its spectral density in :mod:`~kernel_attention.kernels.spectral`
and the decomposition of attention into similarity and magnitude in
:mod:`~kernel_attention.kernels.decomposition`).  Importing the package registers every kernel.
"""

from kernel_attention.kernels.base import KERNELS, Kernel, SDPAForm, SquaredForm, make_kernel
from kernel_attention.kernels.classic import ExpKernel, LinearKernel, PeriodicKernel, PolyKernel, RBFKernel
from kernel_attention.kernels import similarity_magnitude, implicit  # noqa: F401  (register the IKA kernels)

__all__ = ["Kernel", "SDPAForm", "SquaredForm", "KERNELS", "make_kernel", "ExpKernel", "RBFKernel", "PolyKernel",
           "LinearKernel", "PeriodicKernel"]
