r"""``flex``: FlexAttention, for CUDA devices.

The decomposition log k = scale · <q', k'> + b of :mod:`~kernel_attention.backends.sdpa` and
:mod:`~kernel_attention.backends.blockwise`,
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

from kernel_attention.backends.base import (BACKENDS, Backend, Problem, feature_kv, pad_last, per_head_key_features,
                                            sdpa_features)
from kernel_attention.positions.difference_index import DifferenceIndex
from kernel_attention.kernels.capabilities import sdpa_layout

__all__ = ["FlexBackend", "flex_why_not", "flex_smoother"]


#: Compiled FlexAttention kernels per process.  Each (shape, dtype, block mask, score_mod form) is one
#: compilation of the same function, so dynamo's default of 8 per function would send later calls to
#: the unfused eager FlexAttention (T x T scores); a model uses few forms, a test or benchmark grid many.
RECOMPILE_LIMIT = 256


@functools.lru_cache(maxsize=1)
def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if not torch.cuda.is_available():
        return flex_attention, create_block_mask
    import torch._dynamo.config as dc

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(dc, name):
            setattr(dc, name, max(getattr(dc, name), RECOMPILE_LIMIT))
    return torch.compile(flex_attention, dynamic=False), create_block_mask


def flex_why_not(p: Problem, allow_cpu: bool = False) -> str | None:
    """None when the FlexAttention path applies to ``p``; otherwise why not."""
    if p.q.device.type != "cuda" and not allow_cpu:
        return "FlexAttention is used on CUDA only (on CPU it has no backward pass)"
    try:
        _flex()
    except Exception as e:  # pragma: no cover - depends on the PyTorch build
        return f"FlexAttention is unavailable ({type(e).__name__}: {e})"
    if p.need_weights:
        return "need_weights=True: only dense forms the (Tq, Tk) weights"
    if sdpa_layout(p.kernel) is None:
        return f"kernel {p.kernel.name!r} has no SDPA features (capability SDPAFeatures)"
    if p.dropout_p > 0:
        return "dropout on the weights is not available in FlexAttention"
    t = p.terms
    if t is not None and t.value:
        return "the relative value term needs the weights"
    if t is not None and t.relative_factors:
        return "relative factors (Transformer-XL) would need their (Tq, R) logits formed first"
    return None


_BLOCK_MASKS: dict = {}


def _block_mask(p: Problem, create_block_mask):
    """The BlockMask of ``p.keep``.  Building one evaluates the mask over every tile (milliseconds at
    T = 4096, more than the attention itself), so masks of spec filters are kept per (filter, Tq, Tk,
    device): a model's layers and steps share one."""
    b, h, tq, tk = p.shape
    by_spec = p.key_mask is None and p.filter is not None and p.filter.by_spec
    key = (p.filter.spec_key, tq, tk, str(p.q.device)) if by_spec else None
    if key is not None and key in _BLOCK_MASKS:
        return _BLOCK_MASKS[key]
    keep = p.keep
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    keep = keep.expand(keep.shape[0], keep.shape[1], tq, tk)
    kb_, kh_ = keep.shape[0], keep.shape[1]

    def mask_mod(bi, hi, qi, ki):
        return keep[bi if kb_ > 1 else 0, hi if kh_ > 1 else 0, qi, ki]

    mask = create_block_mask(mask_mod, kb_, kh_, tq, tk, device=p.q.device)
    if key is not None:
        if len(_BLOCK_MASKS) >= 64:
            _BLOCK_MASKS.pop(next(iter(_BLOCK_MASKS)))
        _BLOCK_MASKS[key] = mask
    return mask


def flex_smoother(p: Problem, qf: Tensor, kf: Tensor, scale: float, key_bias: Tensor | None,
                  v: Tensor | None = None) -> Tensor:
    """softmax(scale · qf kf^T + b) v over the filter, with b from the key bias and ``p.terms``.

    ``qf``, ``kf``: the kernel's SDPA features with any positional features (``product``) already
    concatenated (:func:`kernel_attention.backends.base.sdpa_features`); ``v``: the values, ``p.v`` by default.
    kf and v with fewer heads than qf run as grouped-query attention (FlexAttention's ``enable_gqa``); a key bias
    is per query head."""
    from kernel_attention.backends.banded import shaw_clip

    flex, create_block_mask = _flex()
    b, h, tq, tk = p.shape
    t = p.terms
    kb = key_bias
    if t is not None and t.key_bias is not None:
        kb = t.key_bias if kb is None else kb + t.key_bias
    rel, clipped, diff = [], [], []
    for lg, ix in ([] if t is None else t.relative):
        c = shaw_clip(ix, tq, tk)
        if c is not None and lg.shape[-1] == 2 * c + 1:  # the index is clip(i - j) + c: computed in the kernel
            clipped.append((lg.expand(b, h, *lg.shape[2:]), c))
        elif isinstance(ix, DifferenceIndex):  # a_i - c_j (clipped): from its vectors, no (Tq, Tk) index
            diff.append((lg.expand(b, h, *lg.shape[2:]), ix.a.expand(b, tq), ix.c.expand(b, tk), ix.clip))
        else:
            rel.append((lg.expand(b, h, *lg.shape[2:]), ix.expand(b, tq, tk)))
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
        for lg, c in clipped:
            score = score + lg[bi, hi, qi, torch.clamp(qi - ki, -c, c) + c]
        for lg, ix in rel:
            score = score + lg[bi, hi, qi, ix[bi, qi, ki]]
        for lg, a, c, clip in diff:
            d = a[bi, qi] - c[bi, ki]
            score = score + lg[bi, hi, qi, d if clip is None else torch.clamp(d, -clip, clip) + clip]
        if dense is not None:
            score = score + dense[bi, hi, qi, ki]
        return score

    block_mask = None if p.keep is None else _block_mask(p, create_block_mask)
    # One head size for q and k, v its own, each a multiple of 16 (FlexAttention's Triton kernels
    # take no smaller or odd sizes); the zero padding adds nothing to <q', k'> and is cut from out.
    r16 = lambda n: -(-n // 16) * 16
    v = p.v if v is None else v
    dv = v.shape[-1]
    d = r16(qf.shape[-1])
    opts = {}
    if v.shape[1] != h:
        opts["enable_gqa"] = True
        if block_mask is not None:
            # Inductor's decoding kernel, which it picks for short query lengths, finds no valid configuration for
            # grouped heads under a block mask (torch 2.11 on CUDA); the main kernel runs them, at any length
            opts["kernel_options"] = {"FORCE_USE_FLEX_ATTENTION": True}
    out = flex(pad_last(qf, d), pad_last(kf, d), pad_last(v, r16(dv)), score_mod=score_mod,
               block_mask=block_mask, scale=scale, **opts)
    if out.shape[-1] != dv:
        out = out[..., :dv]
    if p.keep is not None:
        nonempty = p.keep.any(-1, keepdim=True)
        out = out * nonempty.to(out.dtype)  # rows with no key: zero, never NaN
    return out


@BACKENDS.register("flex")
class FlexBackend(Backend):
    """FlexAttention with the additive terms as a ``score_mod`` and the filter as a block mask (see the
    module docstring)."""

    name = "flex"

    def supports(self, p: Problem) -> str | None:
        return flex_why_not(p)

    def describe(self, p: Problem) -> str:
        grouped = ", on the grouped key/value heads" if p.kv_groups > 1 and not per_head_key_features(p) else ""
        return f"FlexAttention: score_mod for the additive terms, a block mask for the filter{grouped}"

    def run(self, p: Problem):
        k, v, groups = feature_kv(p)
        qf, kf, scale, key_bias = sdpa_features(p, k=k)
        if key_bias is not None and groups > 1:  # a key bias of the key heads, read per query head
            key_bias = key_bias.repeat_interleave(groups, dim=1)
        return flex_smoother(p, qf, kf, scale, key_bias, v), None
