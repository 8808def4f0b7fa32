r"""``triton``: the smoother as Triton flash-attention kernels, forward and backward, with the positional terms
formed per tile.

For an exp-family kernel on its SDPA features (:func:`~kernel_attention.backends.base.sdpa_features`: exp,
rbf, periodic; ``product``'s positions concatenated) the logit of a pair is

    s_ij = scale · <q'_i, k'_j> + kb_j + b_ij

with kb a per-key bias (rbf's -s||k_j||^2 with ``key_bias=mask``, Transformer-XL's u·k_j) and b_ij

* Shaw's clipped table (Transformer Dissection Eq. 6): L[i, clip(o + i - j, -c, c) + c], gathered per tile
  from the (Tq, 2c + 1) logits L = q a^K / sqrt(d);
* Transformer-XL's relative term (Eq. 5): qv_i · R[base + i - j], formed per tile from the BM + BN - 1 rows
  of R the tile meets (any Tk >= Tq: a memory in front of the segment);
* a float mask or bias (B|1, H|1, Tq|1, Tk|1), read per tile through its strides (its gradient, where it has
  one, is the (B, H, Tq, Tk) dS summed over its broadcast axes).

Shaw's value table a^V (positions in the value, Eq. 6) adds sum_j P_ij a^V[clip(o + i - j, -c, c) + c] to the
output: the forward kernel sums each row's weights per table row, Hv (B, H, Tq, 2c + 1), and the output gains
Hv a^V; the backward adds dHv[i, idx_ij] to dP_ij.

The filter is an intersection of a band (causal, local, Transformer-XL's memory), at most one sparse pattern
(strided, fixed) and a key mask (padding), computed per tile from the pairs' indices
(:mod:`~kernel_attention.backends.triton_filters`); tiles outside it are skipped, partial tiles masked, and a
query with no kept key gets zeros and zero gradient.  The forward keeps only the output and the row log-sum-exp
(O(T) memory); the backward recomputes the weights per tile (:mod:`~kernel_attention.backends.triton_kernels`).
No (Tq, Tk) tensor is formed in either pass, except the bias's gradient where the bias has one.

A kernel with :class:`~kernel_attention.kernels.base.SquaredForm` (the implicit kernels) runs instead as
k / sum k, (<q'_i, k'_j>^2 + eps) times a per-key factor, with magnitude dropout drawn per tile in training, over
the same filters and tiles (:mod:`~kernel_attention.backends.triton_squared`).

The kernels are two operators with fake implementations (``kernel_attention::triton_flash_forward`` and
``::triton_flash_backward``, the second the first's autograd formula), so ``torch.compile`` keeps a call in
its graph.  Triton is optional (``pip install 'kernel-attention[gpu]'``).  On CUDA the kernels are compiled;
on CPU tensors they run under Triton's interpreter (``TRITON_INTERPRET=1`` set before the kernels are first
loaded), which is for tests only: ``auto`` never picks it there.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import Tensor

from kernel_attention.backends.base import (BACKENDS, Backend, Problem, feature_kv, per_head_key_features,
                                            sdpa_features, sum_to)
from kernel_attention.backends.flex import flex_why_not
from kernel_attention.backends.policy import DevicePolicy, dense_preferred, policy
from kernel_attention.registry import Param
from kernel_attention.kernels.capabilities import has_squared_form, sdpa_layout
from kernel_attention.backends.triton_filters import FIXED, STRIDED, TileFilter, tile_filter
from kernel_attention.backends.triton_squared import triton_squared_smoother
from kernel_attention.backends.triton_support import (cdiv, compile_check, compile_failures, differentiates, direct,
                                                      eager_function, kernels, launch, pow2, shaw_terms, signature,
                                                      triton_why_not)

__all__ = ["TritonBackend", "triton_smoother", "flash_forward", "flash_backward", "filter_mask", "auto_declines"]


@dataclasses.dataclass(frozen=True)
class _Config:
    """What the kernels are specialised on, and the scalars they take."""

    filt: tuple  # TileFilter.args(): banded, off, lo, hi, pattern, stride, c
    scale: float
    c: int  # Shaw's clip (0: no table)
    soff: int  # Shaw's o in clip(o + i - j)
    xbase: int  # Transformer-XL's base in R[base + i - j]
    value: bool  # Shaw's value table: the forward writes Hv
    block: int

    def launch(self, q, v, kb, km, shaw, qv, table, bias) -> dict:
        """The keyword arguments every kernel takes."""
        has_xl = qv is not None
        dk, dv = q.shape[-1], v.shape[-1]
        dr = qv.shape[-1] if has_xl else 1
        hr, rlen = (table.shape[0], table.shape[1]) if has_xl else (1, 0)
        mode, off, lo, hi, pattern, stride, c = self.filt
        # a broadcast axis of the bias is read with stride 0
        sb = [0 if bias is None or bias.shape[a] == 1 else bias.stride(a) for a in range(4)]
        return dict(
            H=q.shape[1], G=q.shape[1] // v.shape[1], Tq=q.shape[2], Tk=v.shape[2], DK=dk, DV=dv, DR=dr,
            RSTRIDE=rlen * dr if hr > 1 else 0, Rlen=rlen, scale=self.scale, OFF=off, DLO=lo, DHI=hi,
            STRIDE=stride, SC=c, SOFF=self.soff, XBASE=self.xbase, SB0=sb[0], SB1=sb[1], SB2=sb[2], SB3=sb[3],
            HAS_KB=kb is not None, HAS_SHAW=shaw is not None, HAS_VAL=self.value, C=self.c, W=2 * self.c + 1,
            HAS_XL=has_xl, HAS_BIAS=bias is not None, MODE=mode, PAT=pattern, HAS_KM=km is not None,
            PREC="ieee" if q.dtype == torch.float32 else "tf32",
            BM=self.block, BN=self.block, BDK=pow2(dk), BDV=pow2(dv), BDR=pow2(dr), BW=pow2(2 * self.c + 1),
            # 8 warps where a tile holds more: Transformer-XL's (BM, 2·BN) window products, Shaw's table rows
            # (4 warps spill there), or 128-wide tiles
            WP=pow2(2 * self.block - 1), num_warps=8 if has_xl or shaw is not None or self.block > 64 else 4)


def _or(x, y):
    """x, or a placeholder pointer for a kernel argument it does not read."""
    return y if x is None else x


def _none_if_empty(x: Tensor) -> Tensor | None:
    return None if x.numel() == 0 else x


# The kernels as two operators with fake implementations (shapes only), so that torch.compile keeps them whole
# in a graph, and the backward as the forward operator's autograd formula; eager calls of plain tensors run the
# same implementation and formula as an autograd Function (triton_support.direct).  Inputs are contiguous
# (B, H, ...) tensors: q (B, H, Tq, DK), k (B, H, Tk, DK), v (B, H, Tk, DV); kb (B, H, Tk) float32; km (B, H, Tk) int8;
# shaw (B, H, Tq, 2c + 1) float32; qv (B, H, Tq, DR) and table (HR, Rlen, DR); bias (B|1, H|1, Tq|1, Tk|1)
# float32, any strides; absent ones None.  ``filt`` is TileFilter.args().  Hv, and a gradient of an absent input,
# come back as an empty tensor (an operator returns tensors only).

def _flash_forward(q: Tensor, k: Tensor, v: Tensor, kb: Optional[Tensor], km: Optional[Tensor], shaw: Optional[Tensor],
                   qv: Optional[Tensor], table: Optional[Tensor], bias: Optional[Tensor], filt: list[int],
                   scale: float, c: int, soff: int, xbase: int, value: bool,
                   block: int) -> tuple[Tensor, Tensor, Tensor]:
    """(out (B, H, Tq, DV), lse2 (B, H, Tq) float32: the row log2-sum-exp2 of log2(e)·s, +inf for an empty row,
    Hv (B, H, Tq, 2c + 1) float32 with ``value``, else empty)."""
    cfg = _Config(tuple(filt), scale, c, soff, xbase, value, block)
    b, h, tq, _ = q.shape
    out = torch.empty(b, h, tq, v.shape[-1], dtype=v.dtype, device=v.device)
    lse = torch.empty(b, h, tq, dtype=torch.float32, device=q.device)
    hv = torch.empty(b, h, tq, 2 * c + 1 if value else 0, dtype=torch.float32, device=q.device)
    launch(kernels("triton_kernels").flash_forward, (cdiv(tq, block), b * h))(
        q, k, v, _or(kb, q), _or(km, q), _or(shaw, q), _or(qv, q), _or(table, q), _or(bias, q), out, lse,
        _or(_none_if_empty(hv), lse), **cfg.launch(q, v, kb, km, shaw, qv, table, bias))
    return out, lse, hv


flash_forward = torch.library.custom_op("kernel_attention::triton_flash_forward", mutates_args=())(_flash_forward)


@flash_forward.register_fake
def _(q, k, v, kb, km, shaw, qv, table, bias, filt, scale, c, soff, xbase, value, block):
    b, h, tq, _ = q.shape
    return (v.new_empty(b, h, tq, v.shape[-1]), q.new_empty(b, h, tq, dtype=torch.float32),
            q.new_empty(b, h, tq, 2 * c + 1 if value else 0, dtype=torch.float32))


def _flash_backward(gout: Tensor, ghv: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, kb: Optional[Tensor],
                    km: Optional[Tensor], shaw: Optional[Tensor], qv: Optional[Tensor], table: Optional[Tensor],
                    bias: Optional[Tensor], out: Tensor, lse: Tensor, hv: Tensor, filt: list[int], scale: float,
                    c: int, soff: int, xbase: int, value: bool, block: int,
                    bias_grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dkb, dshaw, dqv, dtable, dbias), empty where the input is absent (dbias: where ``bias_grad``
    is False); ``ghv`` the gradient of Hv, or None."""
    cfg = _Config(tuple(filt), scale, c, soff, xbase, value, block)
    kern = kernels("triton_kernels")
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    gout = gout.contiguous()
    delta = (gout.float() * out.float()).sum(-1)  # (B, H, Tq): dO_i · out_i (+ dHv_i · Hv_i)
    if ghv is not None:
        ghv = ghv.float().contiguous()
        delta = delta + (ghv * hv).sum(-1)
    args = cfg.launch(q, v, kb, km, shaw, qv, table, bias)
    ptrs = (q, k, v, _or(kb, q), _or(km, q), _or(shaw, q), _or(qv, q), _or(table, q), _or(bias, q), _or(ghv, lse),
            gout, lse, delta)
    if value and ghv is None:  # Hv unused: its gradient is 0
        args["HAS_VAL"] = False
    groups = h // k.shape[1]
    dq = torch.empty_like(q)
    # dk, dv per query head in float32, summed over each group of query heads that shares a key/value head
    dk, dv = (x.new_empty(b, h, *x.shape[2:], dtype=torch.float32) if groups > 1 else torch.empty_like(x)
              for x in (k, v))
    empty = q.new_empty(0)
    dkb = torch.empty_like(kb) if kb is not None else empty
    dshaw = torch.empty_like(shaw) if shaw is not None else empty.clone()
    dqv = torch.empty_like(qv) if qv is not None else empty.clone()
    dtable = torch.zeros(table.shape, dtype=torch.float32, device=q.device) if table is not None else empty.clone()
    ds = torch.zeros(b, h, tq, tk, dtype=torch.float32, device=q.device) if bias_grad else None
    launch(kern.flash_backward_kv, (cdiv(tk, block), b * h))(*ptrs, dk, dv, _or(_none_if_empty(dkb), lse), **args)
    launch(kern.flash_backward_q, (cdiv(tq, block), b * h))(
        *ptrs, dq, _or(_none_if_empty(dshaw), lse), _or(_none_if_empty(dqv), q), _or(_none_if_empty(dtable), lse),
        _or(ds, lse), HAS_DBIAS=bias_grad, **args)
    if groups > 1:
        dk, dv = (g.view(b, h // groups, groups, *g.shape[2:]).sum(2).to(x.dtype) for g, x in ((dk, k), (dv, v)))
    if table is not None:
        dtable = dtable.to(table.dtype)
    dbias = sum_to(ds, bias.shape).to(bias.dtype) if bias_grad else empty.clone()
    return dq, dk, dv, dkb, dshaw, dqv, dtable, dbias


flash_backward = torch.library.custom_op("kernel_attention::triton_flash_backward", mutates_args=())(_flash_backward)


@flash_backward.register_fake
def _(gout, ghv, q, k, v, kb, km, shaw, qv, table, bias, out, lse, hv, filt, scale, c, soff, xbase, value, block,
      bias_grad):
    like = lambda x: q.new_empty(0) if x is None else torch.empty_like(x)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), like(kb), like(shaw), like(qv),
            like(table), like(bias if bias_grad else None))


def _setup_context(ctx, inputs, output):
    q, k, v, kb, km, shaw, qv, table, bias, *params = inputs
    ctx.params = params
    ctx.save_for_backward(q, k, v, kb, km, shaw, qv, table, bias, *output)


def _backward(ctx, gout, glse, ghv):
    q, k, v, kb, km, shaw, qv, table, bias, out, lse, hv = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[8]
    args = (gout, ghv if ghv is not None and hv.numel() else None, q, k, v, kb, km, shaw, qv, table, bias, out, lse,
            hv, *ctx.params, bias_grad)
    grads = (_flash_backward if direct(*args) else flash_backward)(*args)
    dq, dk, dv, dkb, dshaw, dqv, dtable, dbias = grads
    keep = lambda g, x: None if x is None else g
    return (dq, dk, dv, keep(dkb, kb), None, keep(dshaw, shaw), keep(dqv, qv), keep(dtable, table),
            dbias if bias_grad else None) + (None,) * len(ctx.params)


flash_forward.register_autograd(_backward, setup_context=_setup_context)
_Flash = eager_function("_Flash", _flash_forward, _setup_context, _backward)


def _warm(args: tuple, grad: bool) -> None:
    """The launches of a call of :func:`flash_forward` on ``args``, and with ``grad`` of its backward, for
    :func:`~kernel_attention.backends.triton_support.compile_check` (compiled, not run)."""
    out, lse, hv = _flash_forward(*args)
    if grad:
        q, k, v, kb, km, shaw, qv, table, bias, *params = args
        ghv = torch.empty_like(hv) if hv.numel() else None
        _flash_backward(torch.empty_like(out), ghv, q, k, v, kb, km, shaw, qv, table, bias, out, lse, hv, *params,
                        bias is not None and bias.requires_grad)


def _block(p: Problem, block: int | None) -> int:
    """Rows and keys per tile: ``block``, else 64 on CUDA and 16 under the interpreter."""
    return block or (16 if p.q.device.type == "cpu" else 64)


def triton_smoother(p: Problem, key_bias: str = "mask", block: int | None = None) -> Tensor:
    """The output (B, H, Tq, Dv) of ``p`` on the Triton kernels, differentiable (see the module docstring);
    ``block``: rows and keys per tile (default 64 on CUDA, 16 under the interpreter)."""
    from kernel_attention.backends.relative import toeplitz_base

    b, h, tq, tk = p.shape
    dtype = p.q.dtype
    tf, km = tile_filter(p)
    if km is not None:
        km = km.expand(b, h, 1, tk).reshape(b, h, tk).to(torch.int8).contiguous()
    if has_squared_form(p.kernel):
        return triton_squared_smoother(p, tf, km, _block(p, block))
    t = p.terms
    k, v, groups = feature_kv(p)
    qf, kf, scale, kbias = sdpa_features(p, key_bias, k=k)
    if kbias is not None and groups > 1:  # a key bias of the key heads, read per query head
        kbias = kbias.repeat_interleave(groups, dim=1)
    kbs = [x for x in (kbias, None if t is None else t.key_bias) if x is not None]
    kb = None
    if kbs:
        kb = kbs[0] if len(kbs) == 1 else kbs[0] + kbs[1]
        kb = kb.float().expand(b, h, 1, tk).reshape(b, h, tk).contiguous()
    c, soff = shaw_terms(p) or (0, 0)
    xbase = 0
    shaw = qv = table = bias = values = None
    if t is not None and t.relative:
        logits = t.relative[0][0]
        shaw = logits.float().expand(b, h, tq, logits.shape[-1]).contiguous()
    if t is not None and t.value:
        values = t.value[0][0]
    if t is not None and t.relative_factors:
        q_side, tab, index = t.relative_factors[0]
        xbase = toeplitz_base(index)
        qv = q_side.to(dtype).expand(b, h, tq, q_side.shape[-1]).contiguous()
        table = tab.to(dtype).contiguous()
    if t is not None and t.bias is not None:
        bias = t.bias.float()
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    args = (qf.to(dtype).contiguous(), kf.to(dtype).contiguous(), v.contiguous(), kb, km, shaw, qv, table, bias,
            tf.args(), float(scale), c, soff, xbase, values is not None, _block(p, block))
    if direct(*args):
        grad = differentiates(args)
        # what the kernels are specialised on: the tensors, the widths of q, v and Transformer-XL's q side, the
        # filter's kind and sparse pattern, Shaw's clip, the value table, the tiles (the offsets, the scale and the
        # lengths are runtime scalars); grouped heads and the bias's gradient change the backward's launches
        widths = args[0].shape[-1], args[2].shape[-1], None if qv is None else qv.shape[-1]
        key = ("flash", grad, p.q.device, groups > 1, bias is not None and bias.requires_grad, *signature(*args[:9]),
               *widths, tf.banded, tf.pattern, c, values is not None, args[-1])
        compile_check(key, lambda: _warm(args, grad))
        out, _, hv = _Flash.apply(*args)
    else:
        out, _, hv = flash_forward(*args)
    if values is not None:  # sum_j P_ij a^V[idx_ij] = Hv_i a^V
        out = out + torch.matmul(hv.to(dtype), values.to(dtype))
    return out


def filter_mask(p: Problem, block: int | None = None, by_keys: bool = False) -> Tensor:
    """(B, H, Tq, Tk) bool: the pairs that the kernels keep under ``p``'s filter, False in the tiles they skip,
    walking the tiles per query tile (the forward's walk) or, with ``by_keys``, per key tile (the backward's
    for the keys).  For tests: it forms the (Tq, Tk) mask that the kernels never do."""
    b, h, tq, tk = p.shape
    block = _block(p, block)
    tf, km = tile_filter(p)
    mode, off, lo, hi, pattern, stride, c = tf.args()
    keep = torch.zeros(b, h, tq, tk, dtype=torch.int8, device=p.q.device)
    if km is not None:
        km = km.expand(b, h, 1, tk).reshape(b, h, tk).to(torch.int8).contiguous()
    kernels("triton_tiles").filter_keep[(cdiv(tk if by_keys else tq, block), b * h)](
        _or(km, keep), keep, tq, tk, off, lo, hi, stride, c, MODE=mode, PAT=pattern, HAS_KM=km is not None,
        BY_KEYS=by_keys, BM=block, BN=block)
    return keep.bool()


def auto_declines(p: Problem, pol: DevicePolicy) -> str | None:
    """Why ``auto`` passes over ``triton`` for ``p`` on a device with policy ``pol``, or None: the policy does not
    let ``auto`` take it, or a later backend was measured faster (docs/benchmarks.md, "Figures behind the dispatch
    policy"): ``dense`` for kernels without SDPA features up to ``dense_preferred_elements``, FlexAttention's
    block mask for a sparse filter on an exp-family kernel without positional terms."""
    if not pol.triton_auto:
        return ("its compiled kernels have not passed their tests on this device yet (docs/benchmarks.md); ask "
                "for backend='triton' by name")
    what = dense_preferred(p, pol, xl_factors=False)
    if what is not None:
        return (f"dense was faster up to {pol.dense_preferred_elements} (B, H, Tq, Tk) elements for {what} "
                f"(here {p.pairs})")
    sparse = not (p.full or p.causal or p.key_only)
    if sparse and not p.terms and not has_squared_form(p.kernel) and flex_why_not(p, allow_cpu=True) is None:
        return "FlexAttention's block mask was faster for a sparse filter without positional terms"
    return None


def _describe_filter(tf: TileFilter, km: Tensor | None) -> str:
    """The filter and the tiles it skips, in words."""
    names = [n for n in dict.fromkeys(tf.names) if n != "padding"]
    name = " & ".join(names) or ("" if km is not None else "full")
    padding = (" with padding" if names else "padding") if km is not None else ""
    skip = []
    if tf.banded:
        skip.append("tiles past the diagonal skipped" if tf.lo == 0 and tf.hi is None else
                    "tiles outside the window skipped" if tf.lo == -tf.hi else "tiles outside the band skipped")
    if tf.pattern in (STRIDED, FIXED):
        skip.append(f"tiles that the {'strided' if tf.pattern == STRIDED else 'fixed'} pattern never keeps skipped"
                    f" and its pairs computed from their indices")
    if km is not None:
        skip.append("key tiles of padding skipped")
    return f"filter {name}{padding}" + "".join(", " + s for s in skip)


@BACKENDS.register("triton", [
    Param("key_bias", str, "mask", choices=("mask", "features"),
          doc="a per-key log-kernel term (rbf's -s||k||^2) as the kernels' key bias or as an augmented feature"),
    Param("block", int, None, optional=True, check=lambda x: x in (16, 32, 64, 128), rule="16, 32, 64 or 128",
          doc="query rows and keys per tile (default 64 on CUDA, 16 under Triton's interpreter)"),
])
class TritonBackend(Backend):
    """Triton flash kernels with Shaw's and Transformer-XL's terms per tile (see the module docstring)."""

    name = "triton"
    traceable = True  # the kernels are operators with fake implementations (flash_forward, flash_backward)

    def __init__(self, key_bias: str = "mask", block: int | None = None):
        self.key_bias, self.block = key_bias, block

    def supports(self, p: Problem) -> str | None:
        return triton_why_not(p, self.key_bias)

    def declines(self, p: Problem) -> str | None:
        if p.q.device.type == "cpu":
            return "Triton's interpreter is for tests; ask for backend='triton' by name"
        return auto_declines(p, policy(p.q.device))

    def describe(self, p: Problem) -> str:
        block = _block(p, self.block)
        t = p.terms
        parts = [f"Triton flash kernels in {block}x{block} tiles on {p.kernel.name} features"]
        if has_squared_form(p.kernel):
            parts = [f"Triton kernels in {block}x{block} tiles on {p.kernel.name}'s squared form: "
                     f"(q'·k')^2 + eps times a per-key factor, summed in float32 and normalised as k / sum k"]
            if getattr(p.kernel, "drops_magnitude", False):
                parts.append("magnitude dropout drawn per pair from the call's seed, again in the backward")
        kb = sdpa_layout(p.kernel, self.key_bias) == "bias" or (t is not None and t.key_bias is not None)
        if kb:
            parts.append("a key bias")
        if t is not None and t.q_feat is not None:
            parts.append("concatenated positional features")
        if t is not None and t.relative:
            parts.append("Shaw's table gathered per tile")
        if t is not None and t.value:
            parts.append("Shaw's value table from each row's weights summed per table row")
        if t is not None and t.relative_factors:
            parts.append("Transformer-XL's term from the R rows each tile meets")
        if t is not None and t.bias is not None:
            parts.append("a float mask or bias read per tile")
        if p.kv_groups > 1 and not has_squared_form(p.kernel) and not per_head_key_features(p):
            parts.append("on the grouped key/value heads")
        failed = compile_failures()
        note = (f"; Triton failed to compile {len(failed)} of its kernels' specialisations in this process "
                f"({failed[0]}{', ...' if len(failed) > 1 else ''}): attention() runs calls of those on the next "
                f"backend" if failed else "")
        return ", ".join(parts) + "; " + _describe_filter(*tile_filter(p)) + note

    def run(self, p: Problem):
        return triton_smoother(p, self.key_bias, self.block), None
