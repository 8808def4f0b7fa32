r"""Encoder-decoder Transformer for translation, in the shape of fairseq's ``transformer_iwslt_de_en``.

    model = TranslationModel(src_vocab=8000, tgt_vocab=8000)                       # the Vaswani baseline
    model = TranslationModel(8000, 8000, pe_at_input=False,
                             encoder_attention={"position": "product", "symmetric": True},
                             cross_attention={"position": "product", "symmetric": True},
                             decoder_attention={"position": "none"})            # TD Table 3, no PE in C
    logits = model(src, tgt_in, src_key_mask, tgt_key_mask)                      # (B, T, V_tgt)
    enc = model.encode(src); lp, state = model.step(prefix, {"enc": enc, "cache": None})   # decoding

Shape (defaults = fairseq ``transformer_iwslt_de_en``): 6 encoder + 6 decoder post-LN blocks, d = 512,
FFN 1024, 4 heads, dropout 0.3, token embeddings scaled by sqrt(d), decoder output tied to the decoder
input embedding (``tie_output``), optionally one embedding shared by source and target
(``share_embeddings``; needs a joint vocabulary).

Attention per place -- each a dict of :class:`~kernel_attention.nn.attention.KernelAttention` arguments:

    A  encoder self-attention        ``encoder_attention``   filter: full (+ source padding)
    B  encoder-decoder attention     ``cross_attention``     t_q = decoder position, t_k = encoder position
    C  decoder self-attention        ``decoder_attention``   filter: always intersected with causal

With ``position="xl"`` the u/v biases are shared by the layers of a place, as Transformer-XL shares them.

Positions t are integer indices 0..T-1 handed to *every* attention layer (features f and positions t stay
separate through the stack).  ``pe_at_input=True`` is the standard baseline instead: the sinusoid of t is
added once to the embeddings (Vaswani's direct sum) and the attentions usually use ``position="none"``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from kernel_attention.dropout import Dropout
from kernel_attention.nn.block import TransformerBlock
from kernel_attention.models.common import (KernelRegularized, ScaledEmbedding, attention_config,
                                            causal_filter, config_place, share_xl_biases, sinusoidal_input)

__all__ = ["TranslationModel"]


class TranslationModel(KernelRegularized, nn.Module):
    """Encoder-decoder Transformer with kernel attention.

    Args:
        src_vocab, tgt_vocab: vocabulary sizes.  pad_id: padding id (0 in :class:`~kernel_attention.data.Vocab`).
        d_model, n_heads, d_ff, enc_layers, dec_layers: sizes.  dropout: residual / embedding dropout.
        attention_dropout: dropout on attention weights (fairseq ``--attention-dropout``), used where a
            place's config sets no ``dropout``.
        encoder_attention, cross_attention, decoder_attention: attention configs for A, B, C.
        pe_at_input: add the sinusoid of t once to the embeddings (the Vaswani baseline).
        share_embeddings: one embedding matrix for source and target (``src_vocab == tgt_vocab``).
        tie_output: decoder output projection = decoder input embedding (fairseq
            ``--share-decoder-input-output-embed``).
        norm: ``"post"`` (fairseq default) or ``"pre"``.
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, *, d_model: int = 512, n_heads: int = 4, d_ff: int = 1024,
                 enc_layers: int = 6, dec_layers: int = 6, dropout: float = 0.3, attention_dropout: float = 0.0,
                 encoder_attention: dict | None = None, cross_attention: dict | None = None,
                 decoder_attention: dict | None = None, pe_at_input: bool = True,
                 share_embeddings: bool = False, tie_output: bool = True, norm: str = "post", pad_id: int = 0):
        super().__init__()
        if share_embeddings and src_vocab != tgt_vocab:
            raise ValueError(f"share_embeddings needs one joint vocabulary, got src_vocab={src_vocab} "
                             f"and tgt_vocab={tgt_vocab}")
        base = {"dropout": attention_dropout}
        self.attn_cfg = {
            "encoder": attention_config(encoder_attention, "encoder_attention (A)", **base),
            "cross": attention_config(cross_attention, "cross_attention (B)", **base),
            "decoder": attention_config(decoder_attention, "decoder_attention (C)", **base),
        }
        dec_cfg = dict(self.attn_cfg["decoder"])
        dec_cfg["filter"] = causal_filter(dec_cfg.get("filter"))
        self.d_model, self.pad_id, self.pe_at_input = d_model, pad_id, pe_at_input
        self.src_embed = ScaledEmbedding(src_vocab, d_model, pad_id)
        self.tgt_embed = self.src_embed if share_embeddings else ScaledEmbedding(tgt_vocab, d_model, pad_id)
        # A kernel that pools over positions is refused under a filter that hides keys, which the blocks check.
        with config_place("encoder_attention (A)"):
            self.encoder = nn.ModuleList(
                TransformerBlock(d_model, n_heads, d_ff, attention=self.attn_cfg["encoder"], norm=norm,
                                 dropout=dropout)
                for _ in range(enc_layers))
        with config_place("decoder_attention (C)"):  # its filter is what a cross-attention kernel may conflict with
            self.decoder = nn.ModuleList(
                TransformerBlock(d_model, n_heads, d_ff, attention=dec_cfg, cross_attention=self.attn_cfg["cross"],
                                 norm=norm, dropout=dropout)
                for _ in range(dec_layers))
        # xl positions: one u/v pair per place, shared by that place's layers (as Transformer-XL shares
        # r_w_bias / r_r_bias across its layers); registered as xl_biases.<place>.{0,1}.
        self.xl_biases = nn.ModuleDict()
        for place, attns in (("encoder", [b.self_attn for b in self.encoder]),
                             ("cross", [b.cross_attn for b in self.decoder]),
                             ("decoder", [b.self_attn for b in self.decoder])):
            pair = share_xl_biases(attns)
            if pair is not None:
                self.xl_biases[place] = nn.ParameterList(pair)
        # Pre-LN stacks end with a LayerNorm (fairseq normalize_before); post-LN blocks already end normalised.
        self.enc_norm = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()
        self.dec_norm = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()
        self.drop = Dropout(dropout)
        self.output = None
        if not tie_output:
            self.output = nn.Linear(d_model, tgt_vocab, bias=False)
            nn.init.normal_(self.output.weight, std=d_model ** -0.5)
        self.finish_kernels()

    # -- encoder -------------------------------------------------------------------------------------
    def _embed(self, embed: ScaledEmbedding, tokens: Tensor, pos: Tensor) -> Tensor:
        x = embed(tokens)
        if self.pe_at_input:
            x = sinusoidal_input(x, pos)
        return self.drop(x)

    def encode(self, src: Tensor, src_key_mask: Tensor | None = None, need_weights: bool = False) -> dict[str, Any]:
        """Encoder states: ``{"out": (B, S, d), "key_mask": (B, S) bool}`` (+ ``"weights"``)."""
        if src_key_mask is None:
            src_key_mask = src.ne(self.pad_id)
        x = self._embed(self.src_embed, src, torch.arange(src.shape[1], device=src.device))
        weights = []
        for block in self.encoder:
            out = block(x, key_mask=src_key_mask, need_weights=need_weights)  # positions 0..S-1: the default
            x, w = out if need_weights else (out, None)
            weights.append(w and w["self"])
        state = {"out": self.enc_norm(x), "key_mask": src_key_mask}
        if need_weights:
            state["weights"] = weights
        return state

    # -- decoder -------------------------------------------------------------------------------------
    def decode(self, tgt_in: Tensor, enc: dict[str, Any], tgt_key_mask: Tensor | None = None,
               need_weights: bool = False):
        """Logits (B, T, V) for every target prefix position given encoder states ``enc``."""
        pos = torch.arange(tgt_in.shape[1], device=tgt_in.device)
        x = self._embed(self.tgt_embed, tgt_in, pos)
        weights = []
        for block in self.decoder:
            out = block(x, key_mask=tgt_key_mask, context=enc["out"], context_key_mask=enc["key_mask"],
                        need_weights=need_weights)
            x, w = out if need_weights else (out, None)
            weights.append(w)
        x = self.dec_norm(x)
        weight = self.tgt_embed.weight if self.output is None else self.output.weight
        logits = x @ weight.t()
        return (logits, weights) if need_weights else logits

    def decode_step(self, prefix: Tensor, enc: dict[str, Any]) -> Tensor:
        """Log-probabilities (B, V) of the next token after ``prefix`` (B, t), recomputing the whole prefix
        (the reference for :meth:`step`)."""
        logits = self.decode(prefix, enc)[:, -1]
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return torch.log_softmax(logits, dim=-1)

    def step(self, prefix: Tensor, state: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
        """Incremental decoding: log-probabilities (B, V) of the token after ``prefix`` (B, t), and the new state.

        ``state`` = ``{"enc": encode(...) output, "cache": None | one (B, n, d) tensor per decoder layer}``.
        Only the prefix tokens not yet cached (the last one, normally) go through the decoder; each layer's
        self-attention gets the cached *inputs* of the earlier positions as ``memory`` (keys = [cache; new],
        positions 0..n-1 before the new ones), the Transformer-XL mechanism.  With the causal filter this is
        exactly :meth:`decode` on the whole prefix (tested), at the cost of one position per layer and step.
        """
        enc, cache = state["enc"], state.get("cache")
        n = 0 if cache is None else cache[0].shape[1]
        t = prefix.shape[1]
        if t <= n:
            raise ValueError(f"prefix of length {t} has nothing new after the {n} cached positions")
        dev = prefix.device
        x = self._embed(self.tgt_embed, prefix[:, n:], torch.arange(n, t, device=dev))
        new_cache = []
        for i, block in enumerate(self.decoder):
            mem = None if cache is None else cache[i]
            new_cache.append(x if mem is None else torch.cat([mem, x], 1))
            x = block(x, memory=mem, context=enc["out"], context_key_mask=enc["key_mask"])
        x = self.dec_norm(x[:, -1])
        weight = self.tgt_embed.weight if self.output is None else self.output.weight
        logits = x @ weight.t()
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return torch.log_softmax(logits, dim=-1), {"enc": enc, "cache": new_cache}

    @staticmethod
    def reorder_state(state: dict[str, Any], index: Tensor) -> dict[str, Any]:
        """Batch rows ``index`` of encoder states or of an incremental state (beam search expands and
        reorders hypotheses)."""
        if "enc" in state:
            cache = state.get("cache")
            return {"enc": TranslationModel.reorder_state(state["enc"], index),
                    "cache": None if cache is None else [c.index_select(0, index) for c in cache]}
        return {k: (v.index_select(0, index) if isinstance(v, Tensor) else v)
                for k, v in state.items() if k != "weights"}

    def forward(self, src: Tensor, tgt_in: Tensor, src_key_mask: Tensor | None = None,
                tgt_key_mask: Tensor | None = None, need_weights: bool = False):
        """
        Args:
            src: (B, S) source ids.  tgt_in: (B, T) decoder input ids (BOS + target[:-1]).
            src_key_mask, tgt_key_mask: (B, S), (B, T) bool, True = real token (default: id != pad_id).
            need_weights: also return ``{"encoder": [(B,H,S,S)] per layer, "decoder": [{"self": (B,H,T,T),
                "cross": (B,H,T,S)}] per layer}``.
        Returns:
            logits (B, T, V_tgt), or ``(logits, weights)``.
        """
        if tgt_key_mask is None:
            tgt_key_mask = tgt_in.ne(self.pad_id)
        enc = self.encode(src, src_key_mask, need_weights=need_weights)
        out = self.decode(tgt_in, enc, tgt_key_mask, need_weights=need_weights)
        if not need_weights:
            return out
        logits, dec_w = out
        return logits, {"encoder": enc["weights"], "decoder": dec_w}

    def attention_maps(self, src: Tensor, tgt_in: Tensor, src_key_mask=None, tgt_key_mask=None) -> dict:
        """Attention weights per layer and head (see :meth:`forward`), without gradients."""
        with torch.no_grad():
            return self.forward(src, tgt_in, src_key_mask, tgt_key_mask, need_weights=True)[1]
