r"""``linear``: kernels with a finite feature map, in time linear in the sequence length.

With k(a, b) = <phi(a), phi(b)> (``FeatureMap.feature_map``: ``linear`` phi(x) = x, ``poly`` the tensor
power, any random-feature kernel that exposes one) the smoother of Definition 1 factorises
(Katharopoulos et al. 2020):

    out_i = phi(q_i)^T S / g(phi(q_i)^T z),    S = sum_j phi(k_j) v_j^T  (F, Dv),   z = sum_j phi(k_j)  (F,)

where g is the guard of :func:`~kernel_attention.smoother.normalise_direct` (|den| < eps -> +-eps), so
the result equals the dense direct normalisation exactly whenever the dense one is defined.

* non-causal (full or padding filter): S and z summed over key blocks, then one product per query block.
  With grouped key/value heads (grouped-query attention) every query of a group reads its head's one state, so
  the group's query heads run as more rows of that head.
* causal: query/key blocks of ``chunk`` rows; block c uses the state of the blocks before it plus
  its own (chunk, chunk) lower-triangular kernel block (Yang et al., chunked linear attention), so no
  (B, H, T, F, Dv) prefix tensor is built -- only one (F, Dv) state per block.

Both scans have their backward pass written out (:mod:`~kernel_attention.backends.full_scan`,
:mod:`~kernel_attention.backends.causal_scan`), so neither pass keeps a (B, H, T, F) tensor alive
or runs a forward product again.  Filters other than full, causal and padding, positional factors,
dropout and need_weights are not supported (the dispatcher says so and picks another backend).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_attention.backends.base import BACKENDS, Backend, Problem
from kernel_attention.backends.policy import policy
from kernel_attention.backends.causal_scan import causal_scan
from kernel_attention.backends.full_scan import full_scan
from kernel_attention.registry import Param
from kernel_attention.kernels.capabilities import feature_map

__all__ = ["linear_crossover", "LinearBackend", "feature_size"]


def feature_size(p: Problem) -> int | None:
    """F, the size of the kernel's feature map on this problem's heads (None: no finite map)."""
    phi = feature_map(p.kernel, p.q[:1, :1, :1, :])
    return None if phi is None else phi.shape[-1]


def _structure(p: Problem):
    """("full" | "causal", key mask (B|1, H|1, Tk, 1) or None) when the filter is full, padding, causal
    or causal & padding; None otherwise.  Told by the filter's kind where the problem has one (no value
    read, so it traces under ``torch.compile``); a bare mask tensor is read instead."""
    b, h, tq, tk = p.shape
    if p.full:
        return "full", None
    km = None if p.key_mask is None else p.key_mask[:, None, :, None]
    filt = p.filter
    if filt is not None and p.key_mask is not None and (filt.kind == "full" or filt.name == "padding"):
        return "full", km
    if filt is not None and filt.kind == "causal" and tq == tk:
        return "causal", km
    if filt is not None and filt.by_spec:  # a mask of the filter's own spec: its kind said it all
        return None
    return _structure_from_values(p, p.keep)


def _structure_from_values(p: Problem, keep):
    """:func:`_structure` read off the mask itself, so any spelling of it qualifies."""
    b, h, tq, tk = p.shape
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


@BACKENDS.register("linear", [
    Param("chunk", int, 256, check=lambda x: x >= 1, rule=">= 1", doc="rows per block"),
    Param("slices", int, None, optional=True, check=lambda x: x >= 1, rule=">= 1",
          doc="on CPU, (batch, head) slices per group of a scan (default: blocks of at most 2^23 feature elements)"),
])
class LinearBackend(Backend):
    """Feature-map attention, non-causal and chunked causal (see the module docstring)."""

    name = "linear"
    # supports() reads a bool mask's values to find its structure, and the scans' written-out backward passes run
    # autograd inside them: under torch.compile ``auto`` leaves poly and linear to dense
    traceable = False

    def __init__(self, chunk: int = 256, slices: int | None = None):
        self.chunk, self.slices = chunk, slices

    def supports(self, p: Problem) -> str | None:
        if p.need_weights:
            return "need_weights=True: the linear form never forms the weights"
        if feature_size(p) is None:
            return (f"kernel {p.kernel.name!r} has no finite feature map (capability FeatureMap)"
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

    def declines(self, p: Problem) -> str | None:
        f, tk = feature_size(p), p.shape[3]
        cross = linear_crossover(f, p.q.device)
        if tk < cross:
            if torch.compiler.is_compiling():  # formatting a symbolic length would fix it to this call's
                return "Tk is below its crossover with dense"
            return f"Tk={tk} is below its crossover with dense ({cross} keys for F={f})"
        return None

    def describe(self, p: Problem) -> str:
        f = feature_size(p)
        mode, km = _structure(p)
        grouped = ", one state per key/value head" if _folds_groups(p, mode, km) else ""
        mode = f"causal, chunks of {self.chunk} rows" if mode == "causal" else f"non-causal{grouped}"
        b, h = p.shape[:2]
        bg, hg = _group_sizes(p.q, p.k, p.kernel, self.chunk, f, self.slices)
        groups = (-(-b // bg)) * (-(-h // hg))
        split = f", in {groups} groups of {bg * hg} (batch, head) slices" if groups > 1 else ""
        return f"feature map of size F={f}, {mode}{split}; cost ~ T·F·Dv instead of T^2·D"

    def run(self, p: Problem):
        mode, km = _structure(p)
        km = None if km is None else km.to(p.q.dtype)  # (B|1, H|1, Tk, 1)
        scan = causal_scan if mode == "causal" else full_scan
        if _folds_groups(p, mode, km):
            # every query of a group of heads reads its key/value head's one state (S, z): the group's query heads
            # as more rows of one head, (B, H, Tq, D) -> (B, H / G, G·Tq, D)
            k, v, groups = p.grouped_kv()
            b, h, tq, d = p.q.shape
            q = p.q.reshape(b, h // groups, groups * tq, d)
            out = _in_groups(scan, q, k, v, km, p.kernel, self.chunk, feature_size(p), self.slices)
            return out.reshape(b, h, tq, out.shape[-1]), None
        return _in_groups(scan, p.q, p.k, p.v, km, p.kernel, self.chunk, feature_size(p), self.slices), None


def _folds_groups(p: Problem, mode: str, km: Tensor | None) -> bool:
    """Whether grouped key/value heads run as they are held (non-causal, a key mask shared by the heads, a feature
    map without parameters, which could differ per head); otherwise they are repeated."""
    return p.kv_groups > 1 and mode == "full" and (km is None or km.shape[1] == 1) and not _has_state(p.kernel)


def _has_state(kern) -> bool:
    """Whether the kernel has parameters or buffers, which may differ per head."""
    return any(True for _ in kern.parameters()) or any(True for _ in kern.buffers())


def linear_crossover(features: int, device) -> int:
    """Keys from which ``auto`` prefers ``linear`` to ``dense``: the linear form costs ~T·F·Dv per pass
    against T^2·D for dense, so they break even near T ~ F, scaled by the device policy."""
    pol = policy(device)
    return max(pol.linear_min_keys, pol.linear_feature_factor * features)


def _group_sizes(q: Tensor, k: Tensor, kern, chunk: int, f: int, slices: int | None = None) -> tuple[int, int]:
    """(batch entries, heads) per group of the scans of a kernel with f features: groups of at most
    ``slices`` (batch, head) slices, by default as many as keep a block within the device policy's
    ``scan_elements`` feature elements (phi is written and read one column slice at a time, fast only while
    the block stays in cache); equal groups of heads or of whole batch entries; always whole heads when
    the kernel has parameters or buffers (which may be per head).  CPU only: the groups are for the
    cache, and on a GPU they would only add kernel launches."""
    b, h = q.shape[:2]
    if q.device.type != "cpu":
        return b, h
    if slices is None:
        slices = max(1, policy(q.device).scan_elements // (min(chunk, max(q.shape[-2], k.shape[-2])) * f))
    if _has_state(kern) or slices >= h:
        return min(b, max(1, slices // h)), h
    return 1, -(-h // -(-h // slices))  # ceil(h / groups) heads in each of ceil(h / slices) groups


def _in_groups(scan, q: Tensor, k: Tensor, v: Tensor, km: Tensor | None, kern, chunk: int, f: int,
               slices: int | None = None) -> Tensor:
    """scan(q, k, v, km, kern, chunk) on the groups of (batch, head) slices of :func:`_group_sizes`
    (the slices are independent)."""
    b, h = q.shape[:2]
    bg, hg = _group_sizes(q, k, kern, chunk, f, slices)
    if bg >= b and hg >= h:
        return scan(q, k, v, km, kern, chunk)

    def group(b0, h0):  # the scan of [b0:b0+bg, h0:h0+hg] (broadcast dims of the mask kept whole)
        parts = []
        for x in (q, k, v, km):
            if x is not None:
                x = x[b0:b0 + bg] if x.shape[0] > 1 else x
                x = x[:, h0:h0 + hg] if x.shape[1] > 1 else x
            parts.append(x)
        return scan(*parts, kern, chunk)

    return torch.cat([torch.cat([group(b0, h0) for h0 in range(0, h, hg)], 1) for b0 in range(0, b, bg)], 0)
