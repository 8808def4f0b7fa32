r"""FlexAttention form of the ``fused`` backend, for CUDA devices.

The same decomposition as :mod:`kernel_attention.backends.fused` -- log k = scale · <q', k'> + b --
with b applied inside the kernel as a ``score_mod`` (key biases, relative-position tables gathered by
distance, dense biases) and the filter as a ``BlockMask`` that skips fully masked tiles (local,
strided, causal).  Compiled once per (shape, mask) and cached by PyTorch.

Used only where it can run and is faster: on CUDA, with no dropout and no value term (Shaw's a^V
needs the weights).  On CPU FlexAttention cannot train (no backward), so it is never chosen there;
the SDPA paths stay the fall-back everywhere.  :func:`flex_why_not` says why it does not apply.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from kernel_attention.backends.base import Problem

__all__ = ["flex_why_not", "flex_smoother"]


@functools.lru_cache(maxsize=1)
def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False) if torch.cuda.is_available() else flex_attention
    return compiled, create_block_mask


def flex_why_not(p: Problem, allow_cpu: bool = False) -> str | None:
    """None when the FlexAttention path applies to ``p``; otherwise why not."""
    if p.q.device.type != "cuda" and not allow_cpu:
        return "FlexAttention is used on CUDA only (on CPU it has no backward pass)"
    try:
        _flex()
    except Exception as e:  # pragma: no cover - depends on the PyTorch build
        return f"FlexAttention is unavailable ({type(e).__name__}: {e})"
    if p.dropout_p > 0:
        return "dropout on the weights is not available in FlexAttention"
    t = p.terms
    if t is not None and t.value:
        return "the relative value term needs the weights"
    if t is not None and t.relative_factors:
        return "relative factors (Transformer-XL) would need their (Tq, R) logits formed first"
    return None


def flex_smoother(p: Problem, qf: Tensor, kf: Tensor, scale: float, key_bias: Tensor | None) -> Tensor:
    """softmax(scale · qf kf^T + b) v over the filter, with b from the key bias and ``p.terms``."""
    flex, create_block_mask = _flex()
    b, h, tq, tk = p.shape
    t = p.terms
    kb = key_bias
    if t is not None and t.key_bias is not None:
        kb = t.key_bias if kb is None else kb + t.key_bias
    if t is not None and t.q_feat is not None:
        qf = torch.cat([qf, t.q_feat.expand(b, *t.q_feat.shape[1:]) / scale], -1)
        kf = torch.cat([kf, t.k_feat.expand(b, *t.k_feat.shape[1:])], -1)
    rel = [] if t is None else [(lg.expand(b, h, *lg.shape[2:]), ix.expand(b, tq, tk)) for lg, ix in t.relative]
    dense = None
    if t is not None and t.bias is not None:
        dense = t.bias
        while dense.dim() < 4:
            dense = dense.unsqueeze(0)
        dense = dense.expand(b, h, tq, tk)
    kbx = None if kb is None else kb.expand(b, h, 1, tk)[:, :, 0, :]

    def score_mod(score, bi, hi, qi, ki):
        if kbx is not None:
            score = score + kbx[bi, hi, ki]
        for lg, ix in rel:
            score = score + lg[bi, hi, qi, ix[bi, qi, ki]]
        if dense is not None:
            score = score + dense[bi, hi, qi, ki]
        return score

    block_mask = None
    if p.keep is not None:
        keep = p.keep
        while keep.dim() < 4:
            keep = keep.unsqueeze(0)
        keep = keep.expand(keep.shape[0], keep.shape[1], tq, tk)
        kb_, kh_ = keep.shape[0], keep.shape[1]

        def mask_mod(bi, hi, qi, ki):
            return keep[bi if kb_ > 1 else 0, hi if kh_ > 1 else 0, qi, ki]

        block_mask = create_block_mask(mask_mod, kb_, kh_, tq, tk, device=p.q.device)
    # One head size for q and k (multiple of 16); v keeps its own.
    d = -(-qf.shape[-1] // 16) * 16
    pad = lambda x: torch.nn.functional.pad(x, (0, d - x.shape[-1])) if x.shape[-1] != d else x
    out = flex(pad(qf), pad(kf), p.v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    if p.keep is not None:
        nonempty = p.keep.any(-1, keepdim=True)
        out = out * nonempty.to(out.dtype)  # rows with no key: zero, never NaN
    return out
