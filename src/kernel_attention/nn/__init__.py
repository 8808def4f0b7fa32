"""Layers: multi-head kernel attention (:mod:`~kernel_attention.nn.attention`), the Transformer block around
it (:mod:`~kernel_attention.nn.block`) and graph attention over an edge list (:mod:`~kernel_attention.nn.graph`).
"""

from kernel_attention.nn.attention import VALUE_POSITIONS, KernelAttention
from kernel_attention.nn.block import TransformerBlock
from kernel_attention.nn.graph import GraphAttention

__all__ = ["KernelAttention", "TransformerBlock", "GraphAttention", "VALUE_POSITIONS"]
