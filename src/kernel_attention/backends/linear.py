r"""``linear``: kernels with a finite feature map, in time linear in the sequence length.

With k(a, b) = <phi(a), phi(b)> (``Kernel.feature_map``: ``linear`` phi(x) = x, ``poly`` the tensor
power, any random-feature kernel that exposes one) the smoother of Definition 1 factorises
(Katharopoulos et al. 2020):

    out_i = phi(q_i)^T S / g(phi(q_i)^T z),    S = sum_j phi(k_j) v_j^T  (F, Dv),   z = sum_j phi(k_j)  (F,)

where g is the guard of :func:`~kernel_attention.smoother.normalise_direct` (|den| < eps -> +-eps), so
the result equals the dense direct normalisation exactly whenever the dense one is defined.

* non-causal (full or padding filter): S and z summed over key blocks, then one product per query block.
* causal: query/key blocks of ``chunk`` rows; block c uses the state of the blocks before it plus
  its own (chunk, chunk) lower-triangular kernel block (Yang et al., chunked linear attention), so no
  (B, H, T, F, Dv) prefix tensor is built -- only one (F, Dv) state per block.

Every block is checkpointed when the features are large (poly: F = D(D+1)/2), so neither pass
keeps a (B, H, T, F) tensor alive.  Filters other than full, causal and padding, positional factors,
dropout and need_weights are not supported (the dispatcher says so and picks another backend).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from kernel_attention.backends.base import BACKENDS, Backend, Problem
from kernel_attention.registry import Param
from kernel_attention.smoother import DIRECT_EPS

__all__ = ["LinearBackend", "feature_size"]


def feature_size(p: Problem) -> int | None:
    """F, the size of the kernel's feature map on this problem's heads (None: no finite map)."""
    phi = p.kernel.feature_map(p.q[:1, :1, :1, :])
    return None if phi is None else phi.shape[-1]


def _structure(p: Problem):
    """("full" | "causal", key mask (B|1, H|1, Tk, 1) or None) when the filter is full, padding, causal
    or causal & padding; None otherwise.  Read off the mask itself, so any spelling of it qualifies."""
    b, h, tq, tk = p.shape
    keep = p.keep
    if keep is None:
        return "full", None
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    last = keep[..., -1:, :]  # for causal (Tq == Tk) the last query sees every real key
    km = None if bool(last.all()) else last.transpose(-1, -2)
    if p.key_only:
        return "full", km
    if tq != tk:
        return None
    causal = torch.ones(tq, tk, dtype=torch.bool, device=keep.device).tril()
    if torch.equal(keep.expand(*keep.shape[:2], tq, tk), (causal & last).expand(*keep.shape[:2], tq, tk)):
        return "causal", km
    return None


def _guard(den: Tensor) -> Tensor:
    small = den.abs() < DIRECT_EPS
    return torch.where(small, torch.where(den < 0, -DIRECT_EPS, DIRECT_EPS).to(den.dtype), den)


@BACKENDS.register("linear", [
    Param("chunk", int, 256, check=lambda x: x >= 1, rule=">= 1", doc="rows per block"),
])
class LinearBackend(Backend):
    """Feature-map attention, non-causal and chunked causal (see the module docstring)."""

    name = "linear"

    def __init__(self, chunk: int = 256):
        self.chunk = chunk

    def why_not(self, p: Problem) -> str | None:
        if p.need_weights:
            return "need_weights=True: the linear form never forms the weights"
        if feature_size(p) is None:
            return (f"kernel {p.kernel.name!r} has no finite feature map (Kernel.feature_map is None)"
                    + ("; exp-family kernels need infinitely many features" if p.kernel.positive else
                       "; poly of this degree would need too many features"))
        t = p.terms
        if t is not None and (t.has_logits or t.value):
            return ("positional terms (shaw, xl, product, float masks) multiply k elementwise and do not "
                    "factor through the feature map")
        if p.dropout_p > 0:
            return "dropout acts on the weights, which the linear form never forms"
        if _structure(p) is None:
            b, h, tq, tk = p.shape
            extra = " (causal with Tq != Tk, a memory in front of the segment, is not implemented)" if tq != tk else ""
            return (f"filter {p.filter!r} is neither full, causal nor padding (nor causal & padding){extra}: a "
                    f"feature-map scan cannot drop arbitrary (query, key) pairs")
        return None

    def describe(self, p: Problem) -> str:
        f = feature_size(p)
        mode = _structure(p)[0]
        mode = f"causal, chunks of {self.chunk} rows" if mode == "causal" else "non-causal"
        return f"linear: feature map of size F={f}, {mode}; cost ~ T·F·Dv instead of T^2·D"

    def run(self, p: Problem):
        q, k, v, kern = p.q, p.k, p.v, p.kernel
        b, h, tq, tk = p.shape
        f = feature_size(p)
        heavy = f > 2 * q.shape[-1] and torch.is_grad_enabled()
        ck = (lambda fn, *a: checkpoint(fn, *a, use_reentrant=False)) if heavy else (lambda fn, *a: fn(*a))
        mode, km = _structure(p)
        km = None if km is None else km.to(q.dtype)  # (B|1, H|1, Tk, 1)

        # The states S, z are sums over every key: kept in float32 under bf16 / fp16 inputs (as fused
        # attention keeps its soft-max sums), so their rounding does not grow with the sequence.
        acc = torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype

        def state(kc, vc, mc):
            phi = kern.feature_map(kc)
            if mc is not None:
                phi = phi * mc
            return torch.matmul(phi.transpose(-1, -2), vc).to(acc), phi.sum(-2, dtype=acc)

        c = self.chunk
        if mode == "full":
            s = z = None
            for j in range(0, tk, c):
                cols = slice(j, min(tk, j + c))
                ds, dz = ck(state, k[..., cols, :], v[..., cols, :], None if km is None else km[..., cols, :])
                s, z = (ds, dz) if s is None else (s + ds, z + dz)

            def read(qc, s, z):
                phi = kern.feature_map(qc).to(acc)
                return (torch.matmul(phi, s) / _guard(torch.matmul(phi, z.unsqueeze(-1)))).to(q.dtype)

            return torch.cat([ck(read, q[..., r:r + c, :], s, z) for r in range(0, tq, c)], -2), None

        def causal_block(qc, kc, vc, mc, s, z):
            kk = kern.kernel(qc, kc)
            n = kc.shape[-2]
            kk = kk * torch.ones(n, n, dtype=torch.bool, device=kk.device).tril()
            if mc is not None:
                kk = kk * mc.transpose(-1, -2)
            num = torch.matmul(kk, vc).to(acc)
            den = kk.sum(-1, keepdim=True, dtype=acc)
            if s is not None:
                phi = kern.feature_map(qc).to(acc)
                num = num + torch.matmul(phi, s)
                den = den + torch.matmul(phi, z.unsqueeze(-1))
            return (num / _guard(den)).to(q.dtype)

        outs, s, z = [], None, None
        for j in range(0, tq, c):
            rows = slice(j, min(tq, j + c))
            mc = None if km is None else km[..., rows, :]
            outs.append(ck(causal_block, q[..., rows, :], k[..., rows, :], v[..., rows, :], mc, s, z))
            if j + c < tq:
                ds, dz = ck(state, k[..., rows, :], v[..., rows, :], mc)
                s, z = (ds, dz) if s is None else (s + ds, z + dz)
        return torch.cat(outs, -2), None
