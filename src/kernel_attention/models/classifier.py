r"""Sentence classifier: embeddings, a kernel-attention encoder, mean pooling over real tokens, a linear layer.

    model = SentenceClassifier(vocab=20000, n_classes=2, d_model=128, n_layers=2,
                               attention={"kernel": "rbf", "position": "shaw"})
    logits = model(tokens, key_mask)          # tokens (B, T), key_mask (B, T) bool -> (B, n_classes)

    h^0 = dropout(sqrt(d) E[tokens])  (+ sinusoid(t) when pe_at_input)
    h^L = Encoder(h^0)                 self-attention filtered by padding only
    y   = W · (sum_{i real} h^L_i / #real) + b
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kernel_attention.dropout import Dropout
from kernel_attention.nn.block import TransformerBlock
from kernel_attention.models.common import (KernelRegularized, ScaledEmbedding, attention_config,
                                            sinusoidal_input)

__all__ = ["SentenceClassifier"]


class SentenceClassifier(KernelRegularized, nn.Module):
    """Transformer encoder sentence classifier (the IKA paper's text-classification setup).

    Args:
        vocab, n_classes: sizes.  d_model, n_heads, d_ff, n_layers: encoder sizes.
        dropout: embedding / residual / pre-classifier dropout.  attention: attention config.
        pe_at_input: add the sinusoid of t once to the embeddings (Vaswani baseline).
        norm: "post" | "pre".  pad_id: padding id.
    """

    def __init__(self, vocab: int, n_classes: int, *, d_model: int = 128, n_heads: int = 4, d_ff: int = 256,
                 n_layers: int = 2, dropout: float = 0.1, attention: dict | None = None, pe_at_input: bool = True,
                 norm: str = "post", pad_id: int = 0):
        super().__init__()
        self.attn_cfg = attention_config(attention, "attention")
        self.pad_id, self.pe_at_input = pad_id, pe_at_input
        self.embed = ScaledEmbedding(vocab, d_model, pad_id)
        self.layers = nn.ModuleList(TransformerBlock(d_model, n_heads, d_ff, attention=self.attn_cfg, norm=norm,
                                                     dropout=dropout) for _ in range(n_layers))
        self.drop = Dropout(dropout)
        self.head = nn.Linear(d_model, n_classes)
        self.finish_kernels()

    def forward(self, tokens: Tensor, key_mask: Tensor | None = None, need_weights: bool = False):
        """(B, T) ids, (B, T) bool (default id != pad) -> (B, n_classes) logits (+ per-layer weights)."""
        if key_mask is None:
            key_mask = tokens.ne(self.pad_id)
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)
        if self.pe_at_input:
            x = sinusoidal_input(x, pos)
        x = self.drop(x)
        weights = []
        for layer in self.layers:
            out = layer(x, key_mask=key_mask, need_weights=need_weights)  # positions 0..T-1, the default
            x, w = out if need_weights else (out, None)
            weights.append(w and w["self"])
        m = key_mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * m).sum(1) / m.sum(1).clamp_min(1.0)
        logits = self.head(self.drop(pooled))
        return (logits, weights) if need_weights else logits

    def attention_maps(self, tokens: Tensor, key_mask: Tensor | None = None) -> list[Tensor]:
        """(B, H, T, T) attention weights per layer, without gradients."""
        with torch.no_grad():
            return self.forward(tokens, key_mask, need_weights=True)[1]
