"""kernel-attention: Transformer attention as a kernel smoother (Tsai et al. 2019), with implicit
kernels (Song et al. 2021), models, training and the papers' studies.

    import kernel_attention as ka
    out = ka.attention(q, k, v, kernel="rbf", mask="causal")
    layer = ka.KernelAttention(512, 8, kernel="exp", position="product", filter="causal")
"""

from kernel_attention.filters import FILTERS, Filter, make_filter
from kernel_attention.functional import attention, choose_backend, explain, validation
from kernel_attention.kernels import KERNELS, Kernel, make_kernel
from kernel_attention.kernels.implicit import decompose, regularization, share_spectral
from kernel_attention.load import load
from kernel_attention.nn import GraphAttention, KernelAttention, TransformerBlock
from kernel_attention.positions import POSITIONS, DifferenceIndex, PositionScheme, make_position
from kernel_attention.registry import Param, Registry, SpecError
from kernel_attention.smoother import PositionalTerms

__version__ = "0.1.0"

__all__ = ["attention", "KernelAttention", "TransformerBlock", "KERNELS", "POSITIONS", "FILTERS", "Kernel",
           "Filter", "PositionScheme", "PositionalTerms", "DifferenceIndex", "make_kernel", "make_filter",
           "make_position", "Registry", "Param", "SpecError", "validation", "explain", "choose_backend", "decompose",
           "regularization", "share_spectral", "GraphAttention", "load", "__version__"]
