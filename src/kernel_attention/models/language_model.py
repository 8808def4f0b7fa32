r"""Decoder-only language model with Transformer-XL segment memory (Dai et al. 2019, ``MemTransformerLM``).

    model = LanguageModel(vocab=267735, d_model=410, n_heads=10, d_ff=2100, n_layers=16, mem_len=150)
    logits, mems = model(tokens)              # tokens (B, T); mems: one (B, M, d) tensor per layer
    logits, mems = model(next_tokens, mems)   # the next segment attends to the cached states
    nll, mems = model(tokens, mems, targets=next_words)    # (B, T) -log p(target | context), for training

Per segment of T tokens with cached memory m^l (B, M, d) for each layer l:

    h^0 = dropout(sqrt(d) E[tokens])                       (+ sinusoid(t) when pe_at_input)
    h^l = Block_l(h^l-1, memory = m^l-1)                   keys = [m^l-1 ; h^l-1], filter S_1 u S_mem
    logits = dropout(h^L) E^T                              (tied input / output embeddings)
             or log p(w | h^L) of an adaptive soft-max     (``adaptive``: Grave et al. 2017; tied to an adaptive
                                                            input embedding as Transformer-XL's, or untied)
    new m^l = last mem_len steps of [m^l ; h^l], detached  (l = 0 .. L-1: each layer's *input*,
                                                            the first being the embedding output, as TXL's ``hids``)

Attention (``attention=``, a dict of KernelAttention arguments): default is Transformer-XL's --
``kernel="exp"``, ``position="xl"``, ``bias=False`` -- with one pair of u/v biases shared by all layers
(:meth:`XLPosition.share_biases`).  Any kernel / position / value function can replace it; the filter is
always intersected with ``memory`` (query i sees key j <= i + M).  Positions: keys of the window
[memory; segment] are numbered 0 .. M+T-1 and queries sit on the last T (only differences matter for the
relative schemes; ``product`` and ``absolute`` see window positions, the same every segment).
``clamp_len`` clamps xl distances (TXL evaluation); ``same_length`` makes every query see the same number
of keys at evaluation (TXL ``--same_length``).  The ``pe_at_input`` baseline adds the sinusoid of the
window positions of the segment once to the embeddings (TXL ``attn_type=2`` without its memory quirk).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernel_attention.dropout import Dropout
from kernel_attention.filters import make_filter
from kernel_attention.nn.block import TransformerBlock
from kernel_attention.models.adaptive_softmax import AdaptiveEmbedding, TiedAdaptiveLogSoftmax, check_cutoffs
from kernel_attention.models.common import (KernelRegularized, ScaledEmbedding, attention_config,
                                            share_xl_biases, sinusoidal_input, with_position_param)
from kernel_attention.positions import XLPosition

__all__ = ["LanguageModel"]


class LanguageModel(KernelRegularized, nn.Module):
    """Transformer-XL-style decoder-only LM with kernel attention.

    Args:
        vocab: vocabulary size.  d_model, n_heads, d_ff, n_layers: sizes; d_head: per-head width
            (default d_model / n_heads; TXL base uses 41 with d_model 410, 10 heads).
        dropout: embedding / residual / output dropout.  attention_dropout: on attention weights (TXL dropatt).
        attention: attention config (see module docstring).
        mem_len: cached steps per layer (0 = no memory).  clamp_len: clamp relative distances (xl only).
        same_length: at evaluation every query sees the same number of keys.
        pe_at_input: add sinusoidal positions once at the input (the Vaswani baseline).
        tie_output: logits = h E^T with the input embedding E.  norm: "post" (TXL default) or "pre".
        adaptive: ``{"cutoffs": [c_1, ..., c_n], "div_value": x}``: an adaptive soft-max, the c_1 most
            frequent words in the head and the rest in clusters of width d / x^k.  With ``tie_output`` it is
            Transformer-XL's: tied to an adaptive input embedding of the same clusters (x defaults to 1, one
            d-wide table as Transformer-XL's WikiText-103 models; :mod:`.adaptive_softmax`); without, torch's
            :class:`~torch.nn.AdaptiveLogSoftmaxWithLoss` (x defaults to 4) beside a plain embedding.  The model
            then returns log-probabilities as its logits (normalised, so their cross-entropy is the NLL), and with
            ``targets`` scores each target's cluster alone.  Word ids must be ordered by frequency (the LM
            vocabularies are).
    """

    def __init__(self, vocab: int, *, d_model: int = 410, n_heads: int = 10, d_ff: int = 2100, n_layers: int = 16,
                 d_head: int | None = None, dropout: float = 0.1, attention_dropout: float = 0.0,
                 attention: dict | None = None, mem_len: int = 0, clamp_len: int | None = None,
                 same_length: bool = False, pe_at_input: bool = False, tie_output: bool = True,
                 norm: str = "post", pad_id: int | None = None, adaptive: dict | None = None):
        super().__init__()
        if mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {mem_len}")
        if same_length and mem_len == 0:
            raise ValueError("same_length=True needs mem_len >= 1: every query sees mem_len keys at evaluation")
        cfg = attention_config(attention, "attention", kernel="exp", position="xl", bias=False,
                               dropout=attention_dropout)
        if d_head is not None:
            cfg.setdefault("d_head", d_head)
        cfg = with_position_param(cfg, "xl", "clamp_len", clamp_len)
        user_filter = cfg.get("filter", "full")
        cfg["filter"] = make_filter("memory") if user_filter in (None, "full", "memory") else \
            make_filter("memory") & make_filter(user_filter)
        self.attn_cfg = cfg
        self.d_model, self.mem_len, self.same_length, self.pe_at_input = d_model, mem_len, same_length, pe_at_input
        if adaptive is not None:
            unknown = sorted(set(adaptive) - {"cutoffs", "div_value"})
            if unknown or not isinstance(adaptive.get("div_value", 1.0), (int, float)) or \
                    not adaptive.get("div_value", 1.0) >= 1:
                raise ValueError(f"model.adaptive must be {{cutoffs: [c_1 < ... < c_n], div_value: x >= 1}}, got "
                                 f"{adaptive!r}")
            try:
                cutoffs = check_cutoffs(adaptive.get("cutoffs"), vocab)
            except ValueError as e:
                raise ValueError(f"model.adaptive: {e}") from None
        self.embed = (AdaptiveEmbedding(vocab, d_model, cutoffs, float(adaptive.get("div_value", 1.0)))
                      if adaptive and tie_output else ScaledEmbedding(vocab, d_model, pad_id))
        self.layers = nn.ModuleList(TransformerBlock(d_model, n_heads, d_ff, attention=cfg, norm=norm,
                                                     dropout=dropout) for _ in range(n_layers))
        self.final_norm = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()
        self.drop = Dropout(dropout)
        self.output = None if tie_output or adaptive else nn.Linear(d_model, vocab, bias=False)
        self.adaptive = None
        if adaptive and tie_output:
            self.adaptive = TiedAdaptiveLogSoftmax(self.embed)
        elif adaptive:
            self.adaptive = nn.AdaptiveLogSoftmaxWithLoss(d_model, vocab, cutoffs,
                                                          div_value=float(adaptive.get("div_value", 4.0)))
        # Transformer-XL's r_w_bias / r_r_bias: one (H, d) pair for the whole model.
        pair = share_xl_biases([layer.self_attn for layer in self.layers])
        if pair is not None:
            self.u, self.v = pair
        self.finish_kernels()

    def _update_mems(self, hids: list[Tensor], mems: list[Tensor] | None) -> list[Tensor] | None:
        if self.mem_len == 0:
            return None
        with torch.no_grad():
            if mems is None:
                return [h[:, -self.mem_len:].detach() for h in hids]
            return [torch.cat([m, h], dim=1)[:, -self.mem_len:].detach() for m, h in zip(mems, hids)]

    def set_clamp_len(self, clamp_len: int | None) -> None:
        """Clamp xl relative distances from now on (TXL sets ``clamp_len`` only for evaluation)."""
        for layer in self.layers:
            if isinstance(layer.self_attn.position, XLPosition):
                layer.self_attn.position.clamp_len = clamp_len

    def forward(self, tokens: Tensor, mems: list[Tensor] | None = None, need_weights: bool = False,
                targets: Tensor | None = None):
        """
        Args:
            tokens: (B, T) ids of the segment.
            mems: None or one (B, M, d) detached tensor per layer (from the previous call).
            need_weights: also return a list of (B, H, T, M+T) attention weights, one per layer.
            targets: (B, T) ids of the next words: return their negative log-likelihood instead of the logits
                (the adaptive soft-max then evaluates each target's cluster only, not all V words).
        Returns:
            ``(logits (B, T, V), new_mems)``, or ``(nll (B, T), new_mems)`` with ``targets`` (+ weights);
            ``new_mems`` is None when ``mem_len == 0``.
        """
        b, t = tokens.shape
        m = 0 if mems is None else mems[0].shape[1]
        if mems is not None and len(mems) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} memory tensors (one per layer), got {len(mems)}")
        x = self.embed(tokens)
        if self.pe_at_input:
            x = sinusoidal_input(x, torch.arange(m, m + t, device=tokens.device))  # the segment after the memory
        x = self.drop(x)
        mask = None
        if self.same_length and not self.training:
            mask = make_filter({"name": "memory", "same_length": True, "mem_len": self.mem_len})
        hids, weights = [], []
        for i, layer in enumerate(self.layers):
            hids.append(x)
            mem = None if mems is None else mems[i]
            # positions [memory; segment] = 0..M+T-1, the default: not passed, so that they are never read
            out = layer(x, memory=mem, mask=mask, need_weights=need_weights)
            x, w = out if need_weights else (out, None)
            weights.append(w and w["self"])
        x = self.drop(self.final_norm(x))
        if self.adaptive is not None:
            # in float32 outside autocast: torch's adaptive soft-max writes its clusters' log-probabilities
            # into an output of the input's dtype, which CPU autocast's bfloat16 log_softmax does not match
            with torch.autocast(x.device.type, enabled=False):
                h = x.to(torch.promote_types(x.dtype, torch.float32)).reshape(b * t, -1)
                logits = (self._adaptive_nll(h, targets.reshape(-1)).view(b, t) if targets is not None
                          else self.adaptive.log_prob(h).view(b, t, -1))
        else:
            logits = x @ (self.embed.weight if self.output is None else self.output.weight).t()
            if targets is not None:
                wide = torch.promote_types(logits.dtype, torch.float32)  # bf16 logits: the NLL in float32
                logits = F.cross_entropy(logits.to(wide).reshape(b * t, -1), targets.reshape(-1),
                                         reduction="none").view(b, t)
        new_mems = self._update_mems(hids, mems)
        return (logits, new_mems, weights) if need_weights else (logits, new_mems)

    def _adaptive_nll(self, h: Tensor, targets: Tensor) -> Tensor:
        """(N, d), (N,) -> (N,) -log p(target | h) of the adaptive soft-max."""
        if isinstance(self.adaptive, TiedAdaptiveLogSoftmax):
            return self.adaptive(h, targets)
        return -self.adaptive(h, targets).output

    def attention_maps(self, tokens: Tensor, mems: list[Tensor] | None = None) -> list[Tensor]:
        """(B, H, T, M+T) attention weights per layer, without gradients."""
        with torch.no_grad():
            return self.forward(tokens, mems, need_weights=True)[2]
