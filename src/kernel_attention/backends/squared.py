r"""The implicit kernels as k / sum k, without a logarithm or an exponential per pair.

The implicit kernels of Song et al. (2021, Eqs. 12-16) are, per head (:class:`SquaredForm`),

    k(q_i, k_j) = c_i · (s_ij^2 + eps) · exp(m_j),     s_ij = <phi_q(q_i), phi(k_j)>

(phi_q = phi / n, c_i = exp(m(q_i)) constant along a row).  Their soft-max of log k is k / sum_j k, so
with w_j = exp(m_j - max_kept m) and V' = [w ∘ v, w] (Tk, Dv + 1), for each block of query rows R and
the span C of keys they may see (filter M):

    N_R = P V'_C,   P = (s_RC^2 + eps) ⊙ M_RC,     out_R = N_R[:, :Dv] / N_R[:, Dv]

One product of width F (= 2R random features) for s, one of width Dv + 1 for N and a square per pair:
the blocked soft-max path instead forms log(s^2 + eps) + m per pair and exponentiates it again.  The
backward pass recomputes s per block:

    dV'_C += P^T dN_R,   dP = dN_R V'_C^T,   dS = 2 s ⊙ dP ⊙ M,
    dphi_q[R] = dS phi[C],   dphi[C] += dS^T phi_q[R]

V' and the division are formed outside the block loop with autograd (their cost is linear in T).  A
query whose filtered set is empty has N_R = 0 and gets a zero output and zero gradient.

**Magnitude dropout** (the official form in training, :class:`SquaredForm` with ``drop`` > 0) drops a
pair's magnitude, so k_ij = (s_ij^2 + eps) · exp(a_i + m_j) where the block's mask D keeps the pair and
s_ij^2 + eps where it drops it (a = ``query_log``).  The two sets are summed apart, with the same V' for
the kept pairs and V1 = [v, 1] for the dropped ones:

    N1_R = (P ⊙ D) V'_C,   N2_R = (P ⊙ (1 - D)) V1_C,
    out_i = (e^{c_i} N1_i[:Dv] + N2_i[:Dv]) / (e^{c_i} N1_i[Dv] + N2_i[Dv]),   c_i = a_i + max_kept m

and combined per row as g · N1 / N1[Dv] + (1 - g) · N2 / N2[Dv], g = sigmoid(c_i + log N1[Dv] - log
N2[Dv]), which no size of c_i overflows.  D is drawn per block from the form's seed, again in the
backward pass (:func:`kernel_attention.dropout.keep_mask` in the layout below; the blocked path draws the
same distribution in (rows, keys) layout, so the two paths' masks differ for one seed), which adds
dP = D ⊙ dN1 V'^T + (1 - D) ⊙ dN2 V1^T: two more thin products per block.

**Layout.**  A block's (rows, keys) tensors are formed key-major, as their transposes (B, H, |C|, |R|):
s^T = phi[C] phi_q[R]^T, and every product then reads them in the order the CPU's matrix kernels take
fastest -- N_R = (V'_C^T P^T)^T, dV'_C = P^T dN_R (faster than row-major for the products with P;
docs/benchmarks.md, "Figures behind the design").

**Range.**  w_j underflows where m_j lies far below the largest kept m.  :func:`key_spread` measures
max - min of m over the keys some query keeps; :func:`squared_route` takes this path only while it is
at most ``MAX_SPREAD`` = 40 (then every kept w is at least e^-40 and the smallest kernel value, about
eps · e^-40 = 4e-23, is a normal float32 or bfloat16 number) and otherwise leaves the soft-max path,
which has no such limit (Lp magnitudes with small p, whose norms grow like D^(2/p), need it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_attention.backends.base import BACKENDS, Backend, Problem, kept_keys
from kernel_attention.backends.first_order import first_order
from kernel_attention.backends.triton_filters import kept_key_log, tile_filter
from kernel_attention.backends.chunked import block_spans, plan_blocks
from kernel_attention.backends.policy import block_rows, policy
from kernel_attention.registry import Param
from kernel_attention.dropout import block_seed, keep_mask
from kernel_attention.kernels import SquaredForm
from kernel_attention.kernels.capabilities import has_squared_form

__all__ = ["SquaredBackend", "MAX_SPREAD", "masked_key_log", "key_spread", "squared_route", "squared_smoother"]

#: Largest max - min of the per-key log factor over kept keys that this path accepts (module docstring).
MAX_SPREAD = 40.0

#: dtypes whose exponent range holds eps · e^-MAX_SPREAD (float16's smallest normal is 6e-5).
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def masked_key_log(key_log: Tensor, keep: Tensor | None) -> Tensor:
    """``key_log`` (B, H, Tk) with -inf at the keys that no query keeps (``keep`` broadcastable to
    (B, H, Tq, Tk)): the factor's range, and the maximum that :func:`squared_smoother` subtracts, are
    over the kept keys alone."""
    if keep is None:
        return key_log
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    return key_log.masked_fill(~keep.any(-2), float("-inf"))


def key_spread(m: Tensor) -> float:
    """max - min of a masked key log ``m`` (B, H, Tk) over its finite entries, the largest over
    (B, H); 0 where a (B, H) slice keeps no key."""
    m = m.detach()
    hi = m.amax(-1)
    lo = torch.where(torch.isinf(m), torch.full_like(m, float("inf")), m).amin(-1)
    spread = torch.where(torch.isinf(hi), torch.zeros_like(hi), hi - lo)
    return float(spread.max()) if spread.numel() else 0.0


def squared_route(p: Problem) -> tuple[Tensor | None, str | None]:
    """(m, None) when ``p`` can run on this path, m = :func:`masked_key_log` of the kernel's per-key
    log factor (with its gradient; pass it to :meth:`SquaredFeatures.squared_form`); (None, "") when the kernel
    has no :class:`SquaredForm`; otherwise (None, why not, in words), which :class:`SquaredBackend`
    gives as its reason."""
    if not has_squared_form(p.kernel):
        return None, ""
    t = p.terms
    if p.q.device.type != "cpu":
        return None, "measured on the CPU only"
    if t is not None and (t.relative or t.relative_factors or t.bias is not None or t.value
                          or t.key_bias is not None or t.q_feat is not None):
        return None, "positional terms enter log k"
    if p.dropout_p > 0:
        return None, "dropout acts on the soft-max weights"
    if p.q.dtype not in DTYPES:
        return None, f"dtype {p.q.dtype} cannot hold eps · e^-{MAX_SPREAD:g}"
    # while explain describes a call, a structured filter's kept keys come without its (Tq, Tk) mask: from the
    # rows' ranges, or from a sparse pattern's tile form
    keys = kept_keys(p)
    tiles = tile_filter(p) if keys is None and p.deferred else None
    if tiles is not None and not isinstance(tiles, str):
        m = kept_key_log(p, *tiles)
    else:
        m = masked_key_log(p.kernel.squared_key_log(p.k), p.keep if keys is None else keys)
    spread = key_spread(m)
    if spread > MAX_SPREAD:
        return None, (f"the per-key log factor spans {spread:.3g} (more than {MAX_SPREAD:g}), so its "
                      f"exponentials would underflow")
    return m, None


def _t(x: Tensor) -> Tensor:
    """``x`` with its last two axes swapped (a view): the blocks' key-major layout (module docstring)."""
    return x.transpose(-1, -2)


def _block_weights(fq: Tensor, fk: Tensor, keep: Tensor | None, eps: float, drop: float, seed: int,
                   rows: slice, cols: slice):
    """(s^T, P^T, P^T of the dropped pairs or None, the dropout mask or None, the filter's mask or None) of
    one block, each (B, H, |cols|, |rows|) (module docstring, "Layout"); without magnitude dropout P holds
    every pair the filter keeps, with it those whose magnitude the dropout mask keeps."""
    st = torch.matmul(fk[..., cols, :], _t(fq[..., rows, :]))
    p = torch.addcmul(st.new_full((), eps), st, st)  # s^2 + eps in one pass
    kb = None
    if keep is not None:
        kb = keep[..., rows, cols]
        if bool(kb.all()):
            kb = None
        else:
            kb = _t(kb).contiguous()
            p.masked_fill_(~kb, 0.0)
    if not drop:
        return st, p, None, None, kb
    kd = keep_mask(p.shape, drop, block_seed(seed, rows.start, cols.start), p.device)
    kept = torch.where(kd, p, 0.0)
    return st, kept, p.sub_(kept), kd, kb  # p - kept: exactly the dropped pairs' P, no second select


class _SquaredProduct(torch.autograd.Function):
    """N = ((phi_q phi^T)^2 + eps) ⊙ M  V', block by block (module docstring): (B, H, Tq, Dv + 1); with
    magnitude dropout (``v1`` given) [N1, N2] (module docstring), (B, H, Tq, 2 (Dv + 1))."""

    @staticmethod
    def forward(ctx, blocks, keep, eps, drop, seed, fq, fk, vw, v1):
        b, h, tq = fq.shape[0], fq.shape[1], fq.shape[2]
        width = vw.shape[-1]
        out = vw.new_zeros(max(b, vw.shape[0]), h, tq, 2 * width if drop else width)
        for r0, r1, lo, hi in blocks:
            if hi <= lo:
                continue
            rows, cols = slice(r0, r1), slice(lo, hi)
            _, p, p2, _, _ = _block_weights(fq, fk, keep, eps, drop, seed, rows, cols)
            out[..., rows, :width] = _t(torch.matmul(_t(vw[..., cols, :]), p))
            if drop:
                out[..., rows, width:] = _t(torch.matmul(_t(v1[..., cols, :]), p2))
        ctx.blocks, ctx.keep, ctx.eps, ctx.drop, ctx.seed = blocks, keep, eps, drop, seed
        ctx.save_for_backward(fq, fk, vw, v1)
        return out

    @staticmethod
    @first_order
    def backward(ctx, g):
        fq, fk, vw, v1 = ctx.saved_tensors
        drop, width = ctx.drop, vw.shape[-1]
        dfq, dfk, dvw = torch.zeros_like(fq), torch.zeros_like(fk), torch.zeros_like(vw)
        dv1 = torch.zeros_like(v1) if drop else None
        for r0, r1, lo, hi in ctx.blocks:
            if hi <= lo:
                continue
            rows, cols = slice(r0, r1), slice(lo, hi)
            st, p, p2, kd, kb = _block_weights(fq, fk, ctx.keep, ctx.eps, drop, ctx.seed, rows, cols)
            gr = g[..., rows, :width]
            dvw[..., cols, :] += torch.matmul(p, gr)
            dst = torch.matmul(vw[..., cols, :], _t(gr * 2.0))  # dP^T, with the 2 of d(s^2) on the thin side
            if drop:
                g2 = g[..., rows, width:]
                dv1[..., cols, :] += torch.matmul(p2, g2)
                dst = torch.where(kd, dst, torch.matmul(v1[..., cols, :], _t(g2 * 2.0)))
            dst.mul_(st)
            if kb is not None:
                dst.masked_fill_(~kb, 0.0)
            dfq[..., rows, :] = torch.matmul(_t(dst), fk[..., cols, :])
            dfk[..., cols, :] += torch.matmul(dst, fq[..., rows, :])
        return None, None, None, None, None, dfq, dfk, dvw, dv1


def squared_smoother(form: SquaredForm, v: Tensor, keep: Tensor | None, blocks: list) -> Tensor:
    """The smoother of a kernel in :class:`SquaredForm`: v (B, H, Tk, Dv), ``keep`` the 4-d filter mask
    (or None) and ``blocks`` [(r0, r1, lo, hi)] from :func:`~kernel_attention.backends.chunked.plan_blocks`.
    Returns (B, H, Tq, Dv).  ``form.key_log`` must be masked (:func:`masked_key_log`) and its
    :func:`key_spread` at most ``MAX_SPREAD``: :func:`squared_route` checks both."""
    m = form.key_log.to(v.dtype)
    top = m.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # a slice that keeps no key
    w = torch.exp(m - top).unsqueeze(-1)                                # (B, H, Tk, 1), 0 at dropped keys
    vw = torch.cat([v * w, w.expand(*v.shape[:-1], 1)], -1)
    if form.drop and form.query_log is None:
        raise ValueError("SquaredForm with drop > 0 needs query_log: the dropped pairs lose the query's factor")
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], -1) if form.drop else None
    n = _SquaredProduct.apply(blocks, keep, form.eps, form.drop, form.seed, form.q.to(v.dtype),
                              form.k.to(v.dtype), vw, v1)
    if not form.drop:
        return _ratio(n)
    n1, n2 = n[..., :vw.shape[-1]], n[..., vw.shape[-1]:]
    d1, d2 = n1[..., -1:], n2[..., -1:]
    tiny = torch.finfo(n.dtype).tiny
    c = (form.query_log.to(v.dtype) + top).unsqueeze(-1)
    # log of the kept pairs' share against the dropped pairs'; +-inf where one set is empty in this row
    logit = c + d1.clamp_min(tiny).log() - d2.clamp_min(tiny).log()
    logit = torch.where(d2 > 0, torch.where(d1 > 0, logit, float("-inf")), float("inf"))
    r2 = _ratio(n2)
    return r2 + torch.sigmoid(logit) * (_ratio(n1) - r2)


def _ratio(n: Tensor) -> Tensor:
    """n[..., :-1] / n[..., -1:], 0 where the denominator is 0 (no key kept; then the numerator is 0 too, and
    dividing by 1 there keeps the gradient finite)."""
    num, den = n[..., :-1], n[..., -1:]
    return num / torch.where(den > 0, den, torch.ones_like(den))


@BACKENDS.register("squared", [
    Param("block", int, None, optional=True, check=lambda x: x >= 1024, rule=">= 1024",
          doc="elements of one (B, H, rows, Tk) block (default: the device policy's)"),
])
class SquaredBackend(Backend):
    """The implicit kernels as k / sum k per block of query rows (see the module docstring)."""

    name = "squared"
    traceable = False  # the per-key factor's range is read back to decide whether its exponentials underflow

    def __init__(self, block: int | None = None):
        self.block = block

    def supports(self, p: Problem) -> str | None:
        if p.need_weights:
            return "need_weights=True: only dense forms the (Tq, Tk) weights"
        why = _route(p)[1]
        if why == "":
            return f"kernel {p.kernel.name!r} has no squared form (capability SquaredFeatures)"
        return why

    def declines(self, p: Problem) -> str | None:
        limit = policy(p.q.device).squared_dropout_dense_elements
        if getattr(p.kernel, "drops_magnitude", False) and p.pairs <= limit:
            return (f"kernel {p.kernel.name!r} draws magnitude dropout (training); dense was faster up to {limit} "
                    f"(B, H, Tq, Tk) elements (here {p.pairs})")
        return None

    def rows(self, p: Problem) -> int:
        pol = policy(p.q.device)
        b, h, tq, tk = p.shape
        return block_rows(b, h, tq, tk, self.block or pol.block_elements, pol.max_block_rows)

    def describe(self, p: Problem) -> str:
        blocks = block_spans(p, self.rows(p))
        drop = ("; its magnitude dropout is drawn per block, and the pairs that keep their magnitude and those "
                "that drop it are summed apart" if getattr(p.kernel, "drops_magnitude", False) else "")
        return (f"{len(blocks)} block{'s' if len(blocks) != 1 else ''} of {self.rows(p)} query rows; k = ((phi(q)·phi(k))/n)^2 + eps times a "
                f"per-key factor, formed per block and normalised as k / sum k (no log or exp per pair){drop}")

    def run(self, p: Problem):
        key_log, why = _route(p)
        b, h, tq, tk = p.shape
        keep, blocks = plan_blocks(p.keep, tq, tk, self.rows(p))
        form = p.kernel.squared_form(p.q, p.k, key_log=key_log)
        return squared_smoother(form, p.v, keep, blocks), None


def _route(p: Problem) -> tuple[Tensor | None, str | None]:
    """:func:`squared_route` once per call: ``supports`` and ``run`` both need it, and it reads the key factor's
    range back from the tensors."""
    if "squared" not in p.memo:
        p.memo["squared"] = squared_route(p)
    return p.memo["squared"]
