r"""Soft-max attention over blocks of query rows, with any additive log-kernel term, in memory that
grows as rows x Tk instead of Tq x Tk.

For a block of query rows R and the span of keys C they may see,

    s = scale · q'_R k'_C^T + b(R, C)        (b: log k of a kernel without features, log k_T, masks)
    out_R = softmax(s) v_C  [+ value term]   lse_R = logsumexp(s)

``b`` is produced by a callback from compact inputs (relative logits, features, key biases) and is
*recomputed* in the backward pass instead of being stored, so nothing of size Tq x Tk outlives a
block.  The forward uses PyTorch's fused CPU flash kernel when it can (no dropout, no value term) and
explicit block soft-max otherwise; the backward is the flash-attention backward written per block:

    P = exp(s - lse),  dP = dO v^T,  dS = P ⊙ (dP - rowsum(P ⊙ dP)),
    dq' = scale · dS k',  dk' += scale · dS^T q',  dv += P^T dO,  db = dS  (through autograd to b's inputs)

Blocks skip keys outside the span the filter keeps for their rows (a local window touches only a
band of keys; a causal block only the keys up to its last row).  A query whose filtered set is empty
gets P = 0: zero output and zero gradient.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import Tensor

from kernel_attention.backends.amp import autocast_state, replay
from kernel_attention.backends.base import Problem, pad_last, row_bounds, sum_to
from kernel_attention.backends.first_order import first_order
from kernel_attention.dropout import keep_mask

__all__ = ["ChunkSpec", "plan_blocks", "block_spans", "chunked_smoother"]

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclasses.dataclass
class ChunkSpec:
    """Everything that is not a differentiable tensor.

    ``bias_fn(rows, cols, extras)`` -> (B|1, H|1, |rows|, |cols|) or None: the additive term;
    ``value_fn(weights, rows, cols, extras)`` -> (B, H, |rows|, Dv) or None: a term added to the output
    that depends on the weights (Shaw's a^V).  ``extras`` are the tensors these read, in the order they
    were passed to :func:`chunked_smoother`."""

    scale: float
    blocks: list
    keep: Tensor | None = None
    bias_fn: Callable | None = None
    value_fn: Callable | None = None
    dropout_p: float = 0.0
    seed: int = 0
    #: per extra, how the callbacks read it: "rows" (x[..., rows, :]), "cols" (x[..., cols, :]),
    #: "keys" (x[..., cols]) or None (whole).  Sliced extras get per-block gradients written into
    #: their slice instead of a full-size gradient per block.
    axes: list | None = None

    @property
    def explicit(self) -> bool:
        return self.dropout_p > 0 or self.value_fn is not None


def plan_blocks(keep: Tensor | None, tq: int, tk: int, rows: int) -> tuple[Tensor | None, list]:
    """Split the queries into blocks of ``rows`` and find, for each, the span [lo, hi) of keys that
    any of its rows keeps.  Returns the mask as a 4-d (B|1, H|1, Tq, Tk) view and the blocks
    [(r0, r1, lo, hi)]; hi == lo means the whole block sees no key."""
    if keep is not None:
        while keep.dim() < 4:
            keep = keep.unsqueeze(0)
        if keep.shape[-2:] != (tq, tk):  # (…, 1, Tk) or (…, Tq, 1): expand only the last two dims
            keep = keep.expand(*keep.shape[:2], tq, tk)
        # Dims broadcast by stride 0 (e.g. an expanded padding mask) are reduced for free.
        keep_any = keep
        for dim in (0, 1):
            if keep_any.shape[dim] != 1 and keep_any.stride(dim) == 0:
                keep_any = keep_any.narrow(dim, 0, 1)
    blocks = []
    for r0 in range(0, tq, rows):
        r1 = min(tq, r0 + rows)
        if keep is None:
            blocks.append((r0, r1, 0, tk))
            continue
        kr = keep_any[..., r0:r1, :]
        if kr.stride(-2) == 0:
            kr = kr[..., :1, :]
        cols = kr.any(-2).any(1).any(0).nonzero()
        if len(cols) == 0:
            blocks.append((r0, r1, 0, 0))
        else:
            blocks.append((r0, r1, int(cols[0]), int(cols[-1]) + 1))
    return keep, blocks


def block_spans(p: Problem, rows: int) -> list:
    """The blocks of :func:`plan_blocks` for problem ``p``: from its filter's row bounds while its mask is
    deferred (``explain``: no (Tq, Tk) tensor is formed), else from the mask."""
    tq, tk = p.shape[2], p.shape[3]
    bounds = row_bounds(p)
    if bounds is None:
        return plan_blocks(p.keep, tq, tk, rows)[1]
    lo, hi = bounds
    kept = lo < hi
    n = -(-tq // rows)
    pad = n * rows - tq  # rows past Tq keep nothing
    first = torch.nn.functional.pad(lo.masked_fill(~kept, tk), (0, pad), value=tk).view(n, rows).amin(1)
    last = torch.nn.functional.pad(hi.masked_fill(~kept, 0), (0, pad), value=0).view(n, rows).amax(1)
    return [(i * rows, min(tq, (i + 1) * rows), a, b) if a < b else (i * rows, min(tq, (i + 1) * rows), 0, 0)
            for i, (a, b) in enumerate(zip(first.tolist(), last.tolist()))]


def _masked_bias(spec: ChunkSpec, bias: Tensor | None, rows: slice, cols: slice, like: Tensor):
    """The block's bias with -inf where the filter drops the key (None when nothing to add)."""
    if spec.keep is None:
        return bias
    kb = spec.keep[..., rows, cols]
    if bool(kb.all()):
        return bias
    base = bias if bias is not None else like.new_zeros(())
    return torch.where(kb, base, torch.tensor(float("-inf"), dtype=like.dtype, device=like.device))


def _logits(spec, qf, kf, rows, cols, bias):
    s = None
    if qf is not None:
        s = torch.matmul(qf[..., rows, :], kf[..., cols, :].transpose(-1, -2)) * spec.scale
    if bias is not None:
        s = bias if s is None else s + bias
    return s


def _dropout_mask(spec: ChunkSpec, i: int, like: Tensor) -> Tensor:
    """The block's dropout multiplier, regenerated identically in the backward pass."""
    keep = keep_mask(like.shape, spec.dropout_p, spec.seed + i, like.device)
    return keep.to(like.dtype).mul_(1.0 / (1.0 - spec.dropout_p))


class _Sliced:
    """Stands for an extra inside one block: indexing it with the block's slice returns the block's
    own leaf (whose gradient is the slice's gradient)."""

    def __init__(self, leaf: Tensor, key: tuple):
        self.leaf, self.key = leaf, key

    def __getitem__(self, key):
        if key != self.key:
            raise RuntimeError(f"blocked attention: extra read as [{key}] where [{self.key}] was declared")
        return self.leaf


def _block_key(axis: str, rows: slice, cols: slice) -> tuple:
    return {"rows": (Ellipsis, rows, slice(None)), "cols": (Ellipsis, cols, slice(None)),
            "keys": (Ellipsis, cols)}[axis]


class _Chunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec: ChunkSpec, qf, kf, v, *extras):
        b, h, tq = v.shape[0], v.shape[1], spec.blocks[-1][1]
        dv = v.shape[-1]
        out = v.new_zeros(b, h, tq, dv)
        lse = None
        flash = not spec.explicit and qf is not None and v.device.type == "cpu"
        if flash:
            d = max(qf.shape[-1], dv)  # the flash kernel wants one head size for q, k and v
            qp, kp, vp = pad_last(qf, d), pad_last(kf, d), pad_last(v, d)
        for i, (r0, r1, lo, hi) in enumerate(spec.blocks):
            if hi <= lo:
                continue
            rows, cols = slice(r0, r1), slice(lo, hi)
            bias = spec.bias_fn(rows, cols, extras) if spec.bias_fn is not None else None
            bias = _masked_bias(spec, bias, rows, cols, v)
            if flash:
                if bias is not None:
                    bias = bias.expand(b if bias.shape[0] != 1 else 1, h if bias.shape[1] != 1 else 1,
                                       *bias.shape[2:]).to(v.dtype)
                o, l = _flash(qp[..., rows, :], kp[..., cols, :], vp[..., cols, :], 0.0, False,
                              attn_mask=bias, scale=spec.scale)
                o = o[..., :dv]
            else:
                s = _logits(spec, qf, kf, rows, cols, bias).expand(b, h, r1 - r0, hi - lo)
                l = torch.logsumexp(s, -1)
                l = l.masked_fill(torch.isinf(l), 0.0)  # empty rows: P = exp(-inf) = 0
                p = torch.exp(s - l.unsqueeze(-1))
                if spec.dropout_p > 0:
                    p = p * _dropout_mask(spec, i, p)
                o = torch.matmul(p, v[..., cols, :])
                if spec.value_fn is not None:
                    o = o + spec.value_fn(p, rows, cols, extras)
            if lse is None:
                lse = l.new_zeros(b, h, tq)
            out[..., rows, :] = o
            lse[..., rows] = l
        if lse is None:
            lse = v.new_zeros(b, h, tq)
        ctx.spec, ctx.autocast = spec, autocast_state(v)
        ctx.save_for_backward(qf, kf, v, out, lse, *extras)
        return out

    @staticmethod
    @first_order
    def backward(ctx, gout):
        with replay(ctx.autocast):  # the forward's autocast: a float32 term beside bf16 values (backends/amp.py)
            return _Chunked._backward(ctx, gout)

    @staticmethod
    def _backward(ctx, gout):
        spec = ctx.spec
        qf, kf, v, out, lse, *extras = ctx.saved_tensors
        b, h = v.shape[0], v.shape[1]
        dq = torch.zeros_like(qf) if qf is not None else None
        dk = torch.zeros_like(kf) if kf is not None else None
        dv = torch.zeros_like(v)
        leaves = [x if x is None or x.is_leaf or not x.requires_grad else x.detach().requires_grad_()
                  for x in extras]
        want = [j for j, x in enumerate(leaves) if x is not None and x.requires_grad]
        axes = spec.axes or [None] * len(extras)
        gext = [torch.zeros_like(extras[j]) if j in want and axes[j] else None for j in range(len(extras))]
        block = {}  # extra index -> (its leaf in this block, the block's index into the extra)

        def accumulate(grads, idx):
            for j, g in zip(idx, grads):
                if g is None:
                    continue
                if j in block:
                    gext[j][block[j][1]] += g
                else:
                    gext[j] = g if gext[j] is None else gext[j] + g

        def block_inputs(idx):
            return [block[j][0] if j in block else leaves[j] for j in idx]

        for i, (r0, r1, lo, hi) in enumerate(spec.blocks):
            if hi <= lo:
                continue
            rows, cols = slice(r0, r1), slice(lo, hi)
            ex = list(leaves)
            block.clear()
            for j in want:
                if axes[j]:
                    key = _block_key(axes[j], rows, cols)
                    leaf = extras[j][key].detach().requires_grad_()
                    block[j] = (leaf, key)
                    ex[j] = _Sliced(leaf, key)
            with torch.enable_grad():
                bias_g = spec.bias_fn(rows, cols, ex) if spec.bias_fn is not None else None
            # In-place from here on: each (B, H, rows, cols) buffer is allocated once.
            bias = bias_g.detach() if bias_g is not None else None
            if qf is not None:
                s = torch.matmul(qf[..., rows, :], kf[..., cols, :].transpose(-1, -2)).mul_(spec.scale)
                if bias is not None:  # in the forward's dtype: a float32 term makes the logits float32
                    s = s.add_(bias) if s.dtype == torch.promote_types(s.dtype, bias.dtype) else s + bias
            else:
                s = bias.expand(b, h, r1 - r0, hi - lo).clone()
            if spec.keep is not None:
                kb = spec.keep[..., rows, cols]
                if not bool(kb.all()):
                    s.masked_fill_(~kb, float("-inf"))
            p = s.sub_(lse[..., rows].unsqueeze(-1).to(s.dtype)).exp_()
            dm = _dropout_mask(spec, i, p) if spec.dropout_p > 0 else None
            pu = p * dm if dm is not None else p
            g = gout[..., rows, :]
            dv[..., cols, :] += torch.matmul(pu.transpose(-1, -2), g)
            dp = torch.matmul(g, v[..., cols, :].transpose(-1, -2))
            if spec.value_fn is not None:
                with torch.enable_grad():
                    pl = pu.detach().requires_grad_()
                    term = spec.value_fn(pl, rows, cols, ex)
                    grads = torch.autograd.grad(term, [pl] + block_inputs(want), g, allow_unused=True)
                dp.add_(grads[0])
                accumulate(grads[1:], want)
            if dm is not None:
                dp.mul_(dm)
            # sum_j P_ij dP_ij = dO_i · O_i (the output is linear in P, dropout and value term included)
            delta = (g * out[..., rows, :]).sum(-1, keepdim=True)
            ds = dp.sub_(delta).mul_(p)
            if qf is not None:
                dq[..., rows, :] = torch.matmul(ds, kf[..., cols, :]).mul_(spec.scale)
                dk[..., cols, :] += torch.matmul(ds.transpose(-1, -2), qf[..., rows, :]).mul_(spec.scale)
            if bias_g is not None and bias_g.requires_grad:
                idx = [j for j in want]
                grads = torch.autograd.grad(bias_g, block_inputs(idx), sum_to(ds, bias_g.shape),
                                            allow_unused=True)
                accumulate(grads, idx)
        # an extra no block reached (every query's set empty) gets a zero gradient, not none
        gext = [torch.zeros_like(extras[j]) if g is None and j in want else g for j, g in enumerate(gext)]
        return (None, dq, dk, dv, *gext)


def chunked_smoother(spec: ChunkSpec, qf: Tensor | None, kf: Tensor | None, v: Tensor, *extras: Tensor) -> Tensor:
    """Blockwise soft-max attention (see the module docstring): qf (B, H, Tq, D') and kf (B, H, Tk, D')
    the features whose scaled inner product enters the logits (or both None), v (B, H, Tk, Dv),
    ``extras`` the tensors ``spec.bias_fn`` / ``spec.value_fn`` read.  Returns (B, H, Tq, Dv).

    Under autocast, q', k' and v are cast to its dtype here, so the tensors the backward keeps share one
    dtype; the terms the callbacks give may still come in float32 (a positional bias, the implicit kernels'
    log k), and the backward replays the forward's autocast for them (backends/amp.py)."""
    dev = v.device.type
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        qf, kf = (None if x is None else x.to(dt) for x in (qf, kf))
        v = v.to(dt)
    return _Chunked.apply(spec, qf, kf, v, *extras)
