r"""What :class:`~kernel_attention.backends.fused.FusedBackend` says about the path it runs a call on
(``explain``): one line per route, with the reasons a blocked path is blocked and what a sparse filter's
blocks compute.  Kept apart from the routing itself, which :meth:`FusedBackend._route` decides once per
call for both running and describing.  The thresholds are read from :mod:`~kernel_attention.backends.fused`
at each call (tests change them).
"""

from __future__ import annotations

from kernel_attention.backends import native
from kernel_attention.backends.base import Problem
from kernel_attention.backends.chunked import plan_blocks
from kernel_attention.backends import fused
from kernel_attention.backends.fused import FusedBackend, Route, _has_form
from kernel_attention.backends.sliced import kept_blocks

__all__ = ["describe_route", "filter_note"]


def describe_route(backend: FusedBackend, p: Problem, route: Route) -> str:
    """The description of ``p`` on ``route`` (:meth:`FusedBackend.describe`)."""
    if route.path == "direct":
        how = "key bias" if p.kernel.sdpa_layout(backend.key_bias) == "bias" else "features"
        extra = " + concatenated positional features" if p.terms is not None and p.terms.q_feat is not None else ""
        mask = ", causal" if route.is_causal else (", padding mask" if p.keep is not None else "")
        return f"fused: one SDPA call on {p.kernel.name} {how}{extra}{mask}"
    if route.path == "banded":
        c = route.clip
        far = ("one causal SDPA call on the shifted sequences" if p.causal else
               "two SDPA calls per block of rows (the keys before and after its window)")
        return (f"fused: shaw clipped at {c}: keys farther than {c} (one bias per row) as {far}, the keys "
                f"within {c - 1} formed explicitly, merged by log-sum-exp")
    if route.path == "sliced":
        what = ("the positional features are shared by the batch: a head's (rows, Tk) logits are formed once "
                "per block for all of it" if route.shared else
                "Transformer-XL's relative term: the skewed relative logits of each slice")
        rows = backend._slice_rows(p)
        blocks = plan_blocks(p.keep, p.shape[2], p.shape[3], rows)[1]
        note = "" if p.keep is None or backend._direct_mask(p)[0] else "; " + filter_note(p, blocks)
        off = native.why_not(p.q.dtype)
        loop = ("both passes per (head, block, batch element) slice, compiled (backends/native.py)" if off is None
                else "the flash kernel's mask in the forward pass, the backward per (head, block, batch element) "
                     f"slice, in Python (compiled loop: {off})")
        if off is None:
            keeps = kept_blocks(blocks, p.shape[0], p.shape[1], backend.kept)
            loop += (f"; when training, the forward keeps the logits of {sum(keeps)} of the {len(keeps)} blocks "
                     f"(kept={backend.kept} elements), whose backward then skips two products")
        return f"fused: {what}; {len(blocks)} blocks of {rows} query rows, {loop}{note}"
    b, h, tq, tk = p.shape
    rows = backend._rows(p, route.shared)
    _, blocks = plan_blocks(p.keep, tq, tk, rows)
    why = []
    if route.path == "squared":
        why.append(f"kernel {p.kernel.name!r} is ((phi(q)·phi(k))/n)^2 + eps times a per-key factor, so k "
                   f"itself is formed per block and normalised as k / sum k (no log or exp per pair)"
                   + ("; its magnitude dropout is drawn per block, and the pairs that keep their magnitude "
                      "and those that drop it are summed apart" if getattr(p.kernel, "drops_magnitude", False)
                      else ""))
    elif not _has_form(p):
        why.append(f"kernel {p.kernel.name!r} has no SDPA features, so log k is formed per block"
                   + (f" (its squared form is not used: {route.squared})" if route.squared else ""))
    if (route.path == "blocked" and p.kernel.sdpa_layout(backend.key_bias) == "bias"
            and (p.dropout_p > 0 or p.q.device.type != "cpu")):
        why.append("the key bias has a one-call form only on the CPU without dropout")
    if route.large_dropout:
        why.append(f"with dropout, SDPA on the CPU forms the (Tq, Tk) weights whole; above "
                   f"{fused.DROPOUT_BLOCKED_ELEMENTS} (B, H, Tq, Tk) elements (here {p.pairs}), "
                   f"blocks are faster")
    if p.terms is not None and (p.terms.relative or p.terms.relative_factors):
        why.append("relative positions add a gathered (rows, Tk) term per block")
    if backend._sliced_but_short(p):
        why.append(f"Tk={tk} is below the {fused.SLICED_MIN_KEYS} keys from which the sliced path (per (head, "
                   f"block, batch element) slice) is faster")
    if p.terms is not None and p.terms.bias is not None:
        why.append("a dense float bias is added per block")
    if route.shared:
        why.append("the positional features are shared by the batch: their (rows, Tk) logits are formed "
                   "once per block for all of it and added as the mask of the flash kernel, which is "
                   "cheaper on the CPU than concatenating them to the features (twice the head size)")
    if p.terms is not None and p.terms.value:
        why.append("the relative value term needs the weights, formed explicitly per block")
    if p.keep is not None and not backend._direct_mask(p)[0]:
        why.append(filter_note(p, blocks))
    if route.path == "flex":
        return ("fused: FlexAttention (score_mod for the additive terms, block mask for the filter); "
                + "; ".join(why or ["the kernel's per-key term as a score_mod"]))
    what = "the kernel per block" if route.path == "squared" else "blocked SDPA"
    return f"fused: {what}, {len(blocks)} blocks of {rows} query rows; " + "; ".join(why)


def filter_note(p: Problem, blocks: list) -> str:
    """What a filter that is not one SDPA call keeps, and what the blocks of ``p`` compute of it."""
    b, h, tq, tk = p.shape
    kept = sum((r1 - r0) * (hi - lo) for r0, r1, lo, hi in blocks) / max(1, tq * tk)
    density = float(p.keep.float().mean())
    return (f"filter {p.filter!r} keeps {100 * density:.0f}% of the (Tq, Tk) pairs; blocks skip keys outside their "
            f"span and compute {100 * kept:.0f}%"
            + ("" if kept < 2 * density + 0.05 else
               " (inside the span the mask is applied, not exploited: dense emulation of the sparsity)"))
