r"""The Transformer block of Transformer Networks (Thickstun), Eqs. 1-6, with kernel attention.

Post-LayerNorm (the original, Eqs. 4 and 6):

    u = LayerNorm(x + Attention(x))                  (Eqs. 1-4)
    z = LayerNorm(u + W_2 ReLU(W_1 u))               (Eqs. 5-6)

Pre-LayerNorm (``norm="pre"``): u = x + Attention(LayerNorm(x)); z = u + FFN(LayerNorm(u)).

A decoder block (``cross_attention`` given) puts encoder-decoder attention between the two:
u' = LayerNorm(u + CrossAttention(u, encoder)).  Dropout (``dropout``) is applied to each sub-layer's
output before the residual sum, as in Vaswani et al.  Positions are passed to every attention, so the
features f and positions t stay separate through the stack.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kernel_attention.dropout import Dropout
from kernel_attention.nn.arguments import check_rate, check_sizes
from kernel_attention.nn.attention import KernelAttention, attention_options, hides_keys
from kernel_attention.positions.encodings import as_positions
from kernel_attention.registry import SpecError

__all__ = ["TransformerBlock"]


class TransformerBlock(nn.Module):
    """One Transformer block with kernel attention.

    Args:
        d_model: width d.  n_heads: heads H.  d_ff: feed-forward width m.
        attention: keyword arguments of the self-attention :class:`KernelAttention` (kernel=,
            symmetric=, position=, value_position=, filter=, ...).
        cross_attention: keyword arguments of an encoder-decoder attention; None = no cross-attention.
        norm: ``"post"`` (Eqs. 4, 6) or ``"pre"``.
        dropout: residual dropout.  activation: ``"relu"`` (Eq. 5) or ``"gelu"``.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, attention: dict | None = None,
                 cross_attention: dict | None = None, norm: str = "post", dropout: float = 0.0,
                 activation: str = "relu"):
        super().__init__()
        check_sizes("TransformerBlock", d_model=d_model, n_heads=n_heads, d_ff=d_ff)
        check_rate("TransformerBlock", "dropout", dropout)
        if norm not in ("post", "pre"):
            raise ValueError(f"norm must be 'post' or 'pre', got {norm!r}")
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
        self.norm = norm
        attention = attention_options(attention, "TransformerBlock: attention")
        if cross_attention is not None:
            cross_attention = attention_options(cross_attention, "TransformerBlock: cross_attention")
        self.self_attn = KernelAttention(d_model, n_heads, **attention)
        self.ln1 = nn.LayerNorm(d_model)
        self.cross_attn = None
        if cross_attention is not None:
            self.cross_attn = KernelAttention(d_model, n_heads, **cross_attention)
            self.ln_cross = nn.LayerNorm(d_model)
            kernel = self.cross_attn.kernel
            if getattr(kernel, "pools_queries", False) and hides_keys(self.self_attn.filter):
                raise SpecError(
                    f"cross-attention kernel {kernel.name!r} infers its spectral density from the queries pooled "
                    f"over every target position, and this block's self-attention filter '{self.self_attn.filter}' "
                    f"hides later positions: a target token would see them through the spectral points; use "
                    f"'{kernel.name}:amortized=keys' (the encoder's keys only) or '{kernel.name}:amortized=false'")
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU() if activation == "relu" else nn.GELU(),
                                 Dropout(dropout), nn.Linear(d_ff, d_model))
        self.ln2 = nn.LayerNorm(d_model)
        self.drop = Dropout(dropout)

    def _sublayer(self, x: Tensor, ln: nn.LayerNorm, fn) -> tuple[Tensor, object]:
        if self.norm == "pre":
            out = fn(ln(x))
            y, extra = out if isinstance(out, tuple) else (out, None)
            return x + self.drop(y), extra
        out = fn(x)
        y, extra = out if isinstance(out, tuple) else (out, None)
        return ln(x + self.drop(y)), extra

    def forward(self, x: Tensor, *, pos: Tensor | None = None, mask=None, key_mask: Tensor | None = None,
                memory: Tensor | None = None, memory_pos: Tensor | None = None,
                context: Tensor | None = None, context_pos: Tensor | None = None,
                context_key_mask: Tensor | None = None, need_weights: bool = False):
        """
        Args:
            x: (B, T, d) features.  pos: (T,), (T, A) or (B, T, A) positions of x (default 0..T-1,
                after the memory).
            mask / key_mask: extra filter and (B, M+T) padding mask for self-attention.
            memory: (B, M, d) cached, detached states of the previous segment (Transformer-XL);
                memory_pos: their positions (default: the M positions before the segment).
            context: (B, S, d) encoder output for cross-attention; context_pos, context_key_mask.
            need_weights: also return a dict of attention weights {"self": ..., "cross": ...}.
        Returns:
            (B, T, d), or ``(output, weights)``.
        """
        pos_q = pos_k = None
        if pos is not None:
            pos_q = pos
            if memory is not None:
                if memory_pos is None:
                    raise ValueError("with explicit positions and a memory, pass memory_pos too")
                pos_k = _cat_positions(memory_pos, pos)
            else:
                pos_k = pos
        weights = {}

        def self_fn(h):
            mem = memory
            if self.norm == "pre" and memory is not None:
                mem = self.ln1(memory)
            return self.self_attn(h, None, pos_q=pos_q, pos_k=pos_k, memory=mem, mask=mask,
                                  key_mask=key_mask, need_weights=need_weights)

        x, weights["self"] = self._sublayer(x, self.ln1, self_fn)
        if self.cross_attn is not None:
            if context is None:
                raise ValueError("this block has cross-attention; pass context=(B, S, d) encoder states")

            # The segment's own positions: after the memory when there is one, as in self-attention.
            offset = memory.shape[1] if pos is None and memory is not None and self.cross_attn.axes == 1 else None

            # the segment's real tokens, for a kernel that pools over the queries
            query_mask = None if key_mask is None else key_mask[:, key_mask.shape[1] - x.shape[1]:]

            def cross_fn(h):
                return self.cross_attn(h, context, pos_q=pos, pos_k=context_pos, query_offset=offset,
                                       key_mask=context_key_mask, need_weights=need_weights, query_mask=query_mask)

            x, weights["cross"] = self._sublayer(x, self.ln_cross, cross_fn)
        x, _ = self._sublayer(x, self.ln2, self.ffn)
        return (x, weights) if need_weights else x


def _cat_positions(a: Tensor, b: Tensor) -> Tensor:
    """Positions of [memory; segment]: (M[, A]) and (T[, A]) -> (Bp, M + T, A)."""
    axes = a.shape[-1] if a.dim() >= 2 else 1
    a, b = as_positions(a, axes), as_positions(b, axes)
    if a.shape[0] != b.shape[0]:
        n = max(a.shape[0], b.shape[0])
        a, b = a.expand(n, -1, -1), b.expand(n, -1, -1)
    return torch.cat([a, b], dim=1)
