r"""The IKA paper's regression model (official code, reference notes 2.6): a whole dataset as ONE sequence.

    model = SequenceRegressor(in_features=13)          # d = 64, 8 heads, 1 post-LN layer, no PE
    y = model(x)                                       # x (1, N, F) all rows, train and test -> (1, N)
    loss = ((y - target)[:, train_idx] ** 2).mean()    # the loss sees only the training rows

    h = Linear(x)                                      # F -> d, no positional encoding (rows are a set)
    u = LayerNorm(h + Attention(h))                    # every row attends to every row (train and test)
    z = LayerNorm(u + ReLU(W_2 ReLU(W_1 u)))           # FFN with ReLU after *both* layers, as the code
    y = w·z + b                                        # one output per row (position)
"""

from __future__ import annotations

from torch import Tensor, nn

from kernel_attention.dropout import Dropout
from kernel_attention.nn.block import TransformerBlock
from kernel_attention.models.common import KernelRegularized, attention_config

__all__ = ["SequenceRegressor"]


class SequenceRegressor(KernelRegularized, nn.Module):
    """Per-position regression over a set of rows with kernel self-attention.

    Args:
        in_features: F.  d_model (KEY_DIM = 64), n_heads (8), n_layers (1), d_ff (= d_model).
        dropout: residual dropout (ENC_DROPOUT 0.0).  attention: attention config (default exp kernel,
            no position, no dropout on the weights: the code's attention dropout is ENC_DROPOUT too, and its
            ``att_dropout`` 0.1 is the implicit kernels' magnitude dropout, ``official=true``).
            out_features: outputs per row.
    """

    def __init__(self, in_features: int, *, d_model: int = 64, n_heads: int = 8, n_layers: int = 1,
                 d_ff: int | None = None, dropout: float = 0.0, attention: dict | None = None,
                 out_features: int = 1):
        super().__init__()
        self.attn_cfg = attention_config(attention, "attention", kernel="exp", position="none", dropout=0.0)
        d_ff = d_model if d_ff is None else d_ff
        self.inp = nn.Linear(in_features, d_model)
        self.layers = nn.ModuleList()
        for _ in range(n_layers):
            block = TransformerBlock(d_model, n_heads, d_ff, attention=self.attn_cfg, norm="post", dropout=dropout)
            # The official code's FFN has a ReLU after both linear layers.
            block.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), Dropout(dropout),
                                      nn.Linear(d_ff, d_model), nn.ReLU())
            self.layers.append(block)
        self.head = nn.Linear(d_model, out_features)
        self.out_features = out_features
        self.finish_kernels()

    def forward(self, x: Tensor, need_weights: bool = False):
        """(B, N, F) -> (B, N) (or (B, N, out_features) when out_features > 1) (+ per-layer weights)."""
        h = self.inp(x)
        weights = []
        for layer in self.layers:
            out = layer(h, need_weights=need_weights)
            h, w = out if need_weights else (out, None)
            weights.append(w and w["self"])
        y = self.head(h)
        y = y.squeeze(-1) if self.out_features == 1 else y
        return (y, weights) if need_weights else y

    def attention_maps(self, x: Tensor) -> list[Tensor]:
        import torch
        with torch.no_grad():
            return self.forward(x, need_weights=True)[1]
