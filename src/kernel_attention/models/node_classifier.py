r"""Two-layer GAT node classifier (Veličković et al. 2018), with any graph kernel of graph.py.

    model = NodeClassifier(in_features=1433, n_classes=7)                    # Cora: 8 heads x 8 hidden
    model = NodeClassifier(500, 3, out_heads=8, kernel="ikan-direct")         # Pubmed: 8 averaged output heads
    logits = model(x, edge_index)                                             # (N, n_classes)

    h1 = ELU(GraphAttention_{8 heads x 8, concat}(dropout(x)))
    y  = GraphAttention_{out_heads x C, mean over heads}(dropout(h1))

Dropout 0.6 on the inputs of both layers and on the attention weights, as in GAT.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernel_attention.nn.graph import GraphAttention
from kernel_attention.models.common import KernelRegularized

__all__ = ["NodeClassifier"]


class NodeClassifier(KernelRegularized, nn.Module):
    """Args: in_features, n_classes; hidden (8) and heads (8) of layer 1; out_heads (1; 8 for Pubmed,
    averaged); dropout (0.6, inputs and attention); kernel (``"gat"`` or a positive implicit kernel spec);
    negative_slope (0.2)."""

    def __init__(self, in_features: int, n_classes: int, *, hidden: int = 8, heads: int = 8, out_heads: int = 1,
                 dropout: float = 0.6, kernel="gat", negative_slope: float = 0.2):
        super().__init__()
        self.dropout = dropout
        self.layer1 = GraphAttention(in_features, hidden, heads, kernel, concat=True, dropout=dropout,
                                     negative_slope=negative_slope)
        self.layer2 = GraphAttention(hidden * heads, n_classes, out_heads, kernel, concat=False, dropout=dropout,
                                     negative_slope=negative_slope)
        self.finish_kernels()

    def forward(self, x: Tensor, edge_index: Tensor, need_weights: bool = False):
        """x (N, F), edge_index (2, E) -> (N, n_classes) logits (+ [(edges, alpha (E, H))] per layer)."""
        h = F.dropout(x, self.dropout, self.training)
        out1 = self.layer1(h, edge_index, need_weights=need_weights)
        h, w1 = out1 if need_weights else (out1, None)
        h = F.dropout(F.elu(h), self.dropout, self.training)
        out2 = self.layer2(h, edge_index, need_weights=need_weights)
        y, w2 = out2 if need_weights else (out2, None)
        return (y, [w1, w2]) if need_weights else y

    def attention_maps(self, x: Tensor, edge_index: Tensor):
        with torch.no_grad():
            return self.forward(x, edge_index, need_weights=True)[1]
