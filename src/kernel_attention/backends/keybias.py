"""A per-key log-kernel term (rbf's -s||k||^2) as a differentiable bias of the CPU flash kernel, without
a (Tq, Tk) tensor in either pass: the ``sdpa:key_bias=mask`` form of
:class:`~kernel_attention.backends.sdpa.SdpaBackend`."""

from __future__ import annotations

import torch

from kernel_attention.backends.base import pad_last
from kernel_attention.backends.first_order import first_order

__all__ = ["KeyBiasSDPA"]

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class KeyBiasSDPA(torch.autograd.Function):
    """softmax(scale · q k^T + kb_j [+ mask]) v with a differentiable per-key bias kb (B, H, 1, Tk).

    Forward: the flash kernel with kb as its additive mask.  Backward: the flash backward on the
    augmented features q~ = [q, 1], k~ = [k, kb / scale], whose logits are the same, so dk~'s last
    column is scale · d(kb).  No (Tq, Tk) tensor in either pass."""

    @staticmethod
    def forward(ctx, q, k, v, kb, mask, is_causal: bool, scale: float):
        dv = v.shape[-1]
        d = max(q.shape[-1], dv)
        am = kb if mask is None else kb + mask
        out, lse = _flash(pad_last(q, d), pad_last(k, d), pad_last(v, d), 0.0, is_causal,
                          attn_mask=am, scale=scale)
        out = out[..., :dv]
        ctx.is_causal, ctx.scale = is_causal, scale
        ctx.save_for_backward(q, k, v, kb, mask, out, lse)
        return out

    @staticmethod
    @first_order
    def backward(ctx, gout):
        q, k, v, kb, mask, out, lse = ctx.saved_tensors
        scale, dq_size, dv = ctx.scale, q.shape[-1], v.shape[-1]
        b, h, tk = k.shape[0], k.shape[1], k.shape[2]
        qa = torch.cat([q, q.new_ones(*q.shape[:-1], 1)], -1)
        kba = kb.expand(b, h, 1, tk).transpose(-1, -2) / scale
        ka = torch.cat([k, kba], -1)
        d = max(dq_size + 1, dv)
        dqa, dka, dva = _flash_backward(pad_last(gout.contiguous(), d), pad_last(qa, d), pad_last(ka, d),
                                        pad_last(v, d), pad_last(out, d), lse, 0.0, ctx.is_causal,
                                        attn_mask=mask, scale=scale)
        dkb = (dka[..., dq_size] / scale).unsqueeze(-2)  # (B, H, 1, Tk)
        return dqa[..., :dq_size], dka[..., :dq_size], dva[..., :dv], dkb, None, None, None
