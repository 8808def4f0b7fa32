r"""``sdpa``: the smoother as one call of PyTorch's ``scaled_dot_product_attention`` on kernel features.

A positive kernel smoother is softmax(log k_F + log k_T) (Transformer Dissection, Definition 1, in log
space), so it is one fused attention call whenever

    log k(x_i, x_j) = scale · <q'_i, k'_j> + kb_j + (constant along row i)

with features q', k' (:meth:`SDPAFeatures.sdpa_form`: ``exp``; ``rbf`` with its key-norm term -s||k_j||^2 as an
augmented feature or a key bias kb; ``periodic`` as Fourier features), a positional factor that is absent
or an inner product (``product``: its features are concatenated), and a filter that is full, causal
(Tq = Tk) or a padding mask.  No (Tq, Tk) tensor is formed.

A padding mask enters as a float mask with a large finite negative (not -inf) at padded keys, and the
rows of a sequence with no real key are zeroed after the call: a query whose filtered set is empty gets
zeros and zero gradient without reading the mask back to the host.  The causal filter with padding (a
decoder's batch) enters so too, as its formed (B, 1, Tq, Tk) mask, up to the device policy's
``sdpa_mask_max_keys``.

A call that needs gradients in bfloat16 or float16 (its inputs, or autocast) runs in float32 up to the device
policy's ``sdpa_float32_max_keys``, its output cast back to that dtype: on short sequences the CPU's fused
backward in reduced precision was slower than in float32.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from kernel_attention.backends.base import (BACKENDS, Backend, Problem, key_only_mask, pad_last, per_head_key_features,
                                            sdpa_features)
from kernel_attention.backends.keybias import KeyBiasSDPA
from kernel_attention.backends.policy import policy
from kernel_attention.registry import Param
from kernel_attention.kernels.capabilities import sdpa_layout

__all__ = ["SdpaBackend", "shared_positions", "causal_padding"]


def causal_padding(p: Problem) -> bool:
    """Whether the filter is the causal set (Tq = Tk) intersected with a key mask, its mask formed."""
    return (p.filter is not None and p.filter.kind == "causal" and p.key_mask is not None and not p.deferred
            and p.shape[2] == p.shape[3])


def shared_positions(p: Problem) -> bool:
    """Whether ``product``'s positional features are shared by a batch of B > 1 (the features have batch
    size 1): ``blockwise`` then forms their logits once per block for the whole batch."""
    t = p.terms
    return (t is not None and t.q_feat is not None and t.q_feat.shape[0] == 1 and t.k_feat.shape[0] == 1
            and p.shape[0] > 1)


def float32_inside(p: Problem) -> torch.dtype | None:
    """The reduced precision (bfloat16, float16) the call would run in, where the device policy has it run in
    float32 instead (gradients needed, at most ``sdpa_float32_max_keys`` keys); None otherwise."""
    limit = policy(p.q.device).sdpa_float32_max_keys
    if limit is None or p.shape[3] > limit:
        return None
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (p.q, p.k, p.v))):
        return None
    dev = p.q.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else p.q.dtype
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


#: ``scaled_dot_product_attention(enable_gqa=True)``, from PyTorch 2.5
NATIVE_GQA = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def _runs_grouped(p: Problem, key_bias: str) -> bool:
    """Whether one SDPA call takes the problem's grouped key/value heads as they are: the fused kernel's own
    ``enable_gqa``, with no per-head term on the key side (``product``'s positional features are per query
    head) and no key bias, whose hand-written backward runs full heads."""
    return NATIVE_GQA and not per_head_key_features(p) and sdpa_layout(p.kernel, key_bias) != "bias"


@BACKENDS.register("sdpa", [
    Param("key_bias", str, "features", choices=("features", "mask"),
          doc="a per-key log-kernel term (rbf's -s||k||^2) as an augmented feature or as the bias of the fused "
              "kernel (CPU, no dropout)"),
])
class SdpaBackend(Backend):
    """One ``scaled_dot_product_attention`` call (see the module docstring)."""

    name = "sdpa"

    def __init__(self, key_bias: str = "features"):
        self.key_bias = key_bias

    def supports(self, p: Problem) -> str | None:
        if p.need_weights:
            return "need_weights=True: only dense forms the (Tq, Tk) weights"
        layout = sdpa_layout(p.kernel, self.key_bias)
        if layout is None:
            return f"kernel {p.kernel.name!r} has no SDPA features (capability SDPAFeatures)"
        t = p.terms
        if t is not None and (t.relative or t.relative_factors or t.bias is not None or t.value
                              or t.key_bias is not None):
            return "positional terms other than product's inner product (shaw, xl, float masks) enter log k per pair"
        b, h, tq, tk = p.shape
        if not (p.full or (p.causal and tq == tk) or p.key_only or causal_padding(p)):
            return f"filter {p.filter!r} is neither full, causal (Tq = Tk), padding nor causal with padding"
        if layout == "bias" and (p.dropout_p > 0 or p.q.device.type != "cpu"):
            return "a key bias as the fused kernel's mask is differentiable on the CPU without dropout only"
        return None

    def declines(self, p: Problem) -> str | None:
        pol = policy(p.q.device)
        if torch.compiler.is_compiling():  # the alternatives below are not traceable
            return None
        if pol.dropout_blocked_elements is not None and p.dropout_p > 0 and p.pairs > pol.dropout_blocked_elements:
            return (f"with dropout, the CPU's fused kernel forms the (Tq, Tk) weights whole; above "
                    f"{pol.dropout_blocked_elements} (B, H, Tq, Tk) elements (here {p.pairs}) blockwise is faster")
        if causal_padding(p) and (pol.sdpa_mask_max_keys is None or p.shape[3] > pol.sdpa_mask_max_keys):
            return ("the causal filter with padding is a (Tq, Tk) mask" + (
                    f"; above {pol.sdpa_mask_max_keys} keys (here {p.shape[3]}) blockwise, which skips the blocks "
                    f"past the diagonal, is faster" if pol.sdpa_mask_max_keys is not None else
                    " that this device's policy does not give SDPA"))
        if pol.sliced_min_keys is not None and p.dropout_p == 0 and shared_positions(p):
            return ("product's positions are shared by the batch: their logits formed once per block "
                    "(blockwise, or dense on short sequences) were faster than concatenated features")
        return None

    def describe(self, p: Problem) -> str:
        how = "key bias" if sdpa_layout(p.kernel, self.key_bias) == "bias" else "features"
        extra = " + concatenated positional features" if p.terms is not None and p.terms.q_feat is not None else ""
        mask = (", causal with padding (its mask formed)" if causal_padding(p) else
                ", causal" if not p.full and not p.key_only else (", padding mask" if not p.full else ""))
        grouped = ", on the grouped key/value heads" if p.kv_groups > 1 and _runs_grouped(p, self.key_bias) else ""
        up = float32_inside(p)
        f32 = f", in float32 (not {str(up).removeprefix('torch.')})" if up is not None else ""
        return f"one scaled_dot_product_attention call on {p.kernel.name} {how}{extra}{mask}{grouped}{f32}"

    def run(self, p: Problem):
        k, v, groups = p.grouped_kv()
        if groups > 1 and not _runs_grouped(p, self.key_bias):
            k, v, groups = p.k, p.v, 1
        qf, kf, scale, key_bias = sdpa_features(p, self.key_bias, k=k)
        up = float32_inside(p)
        dev = qf.device.type
        if up is not None:
            qf, kf, v = qf.float(), kf.float(), v.float()
            key_bias = None if key_bias is None else key_bias.float()
        elif key_bias is not None and torch.is_autocast_enabled(dev):
            # the fused op that KeyBiasSDPA calls is not on autocast's lists: cast as autocast casts SDPA's inputs
            low = torch.get_autocast_dtype(dev)
            qf, kf, v, key_bias = qf.to(low), kf.to(low), v.to(low), key_bias.to(low)
        keep = key_only_mask(p)
        if keep is None and causal_padding(p):
            keep = p.keep
        is_causal = p.keep is not None and keep is None
        mask = empty = None
        if keep is not None:
            big = -0.5 * torch.finfo(qf.dtype).max  # finite: a row with no key stays finite, then is zeroed
            mask = torch.zeros(keep.shape, dtype=qf.dtype, device=qf.device).masked_fill(~keep, big)
            empty = ~keep.any(-1, keepdim=True)  # (B|1, H|1, 1 | Tq, 1)
        # autocast would cast the float32 call back to its own dtype
        with torch.autocast(dev, enabled=False) if up is not None else contextlib.nullcontext():
            if key_bias is not None:
                out = KeyBiasSDPA.apply(qf, kf, v, key_bias, mask, is_causal, scale)
            else:
                dv = v.shape[-1]
                d = max(qf.shape[-1], dv)
                if p.q.device.type == "cuda":  # CUDA's flash and memory-efficient kernels need D % 8 == 0
                    d = -(-d // 8) * 8
                gqa = {"enable_gqa": True} if groups > 1 else {}
                out = F.scaled_dot_product_attention(pad_last(qf, d), pad_last(kf, d), pad_last(v, d), attn_mask=mask,
                                                     dropout_p=p.dropout_p, is_causal=is_causal, scale=scale, **gqa)
                out = out if d == dv else out[..., :dv]
        out = out if up is None else out.to(up)
        return (out if empty is None else out.masked_fill(empty, 0.0)), None
