r"""``blockwise``: the generic tiled engine -- soft-max of log k over blocks of query rows, any positive
kernel, any positional term, any filter, in memory that grows as rows x Tk instead of Tq x Tk.

For a block of query rows R and the span of keys C its filter keeps,

    s = scale · q'_R k'_C^T + b(R, C),    out_R = softmax(s) v_C  [+ Shaw's value term]

with q', k' the kernel's SDPA features (or none: log k formed per block, :meth:`BlockState.blockwise`) and b
every additive term (key biases, ``product``'s positional logits, Shaw's table, Transformer-XL's relative
term, a float mask), formed per block and recomputed in the backward pass
(:mod:`~kernel_attention.backends.blocked`, :mod:`~kernel_attention.backends.chunked`).  Sparse filters
skip the keys outside each block's span.

On the CPU, Transformer-XL's relative term and ``product``'s positions shared by a batch run their inner
loop per (block of rows, head, batch element) slice, whose buffers stay in cache, as compiled loops
(:mod:`~kernel_attention.backends.sliced`, :mod:`~kernel_attention.backends.native`), from
``policy.sliced_min_keys`` keys on.
"""

from __future__ import annotations

from kernel_attention.backends import native
from kernel_attention.backends.base import BACKENDS, Backend, Problem, sdpa_features
from kernel_attention.backends.blocked import blocked_spec
from kernel_attention.backends.chunked import block_spans, chunked_smoother, plan_blocks
from kernel_attention.backends.policy import block_rows, dense_preferred, policy
from kernel_attention.backends.sdpa import shared_positions
from kernel_attention.backends.sliced import SliceSpec, kept_blocks, relative_base, sliced_smoother
from kernel_attention.registry import Param
from kernel_attention.kernels.capabilities import sdpa_layout

__all__ = ["BlockwiseBackend"]


@BACKENDS.register("blockwise", [
    Param("block", int, None, optional=True, check=lambda x: x >= 1024, rule=">= 1024",
          doc="elements of one (B, H, rows, Tk) block (default: the device policy's)"),
    Param("kept", int, None, optional=True, check=lambda x: x >= 0, rule=">= 0",
          doc="on the CPU, (B, H, rows, Tk) elements of the slice loops' logits that the forward keeps for the "
              "backward (default: the device policy's; 0 recomputes all)"),
])
class BlockwiseBackend(Backend):
    """Blocks of query rows (see the module docstring)."""

    name = "blockwise"
    traceable = False  # blocks are planned from the mask's values; the CPU slice loops are compiled C++

    def __init__(self, block: int | None = None, kept: int | None = None):
        self.block, self.kept = block, kept

    def supports(self, p: Problem) -> str | None:
        if p.need_weights:
            return "need_weights=True: only dense forms the (Tq, Tk) weights"
        if not p.kernel.positive:
            return (f"kernel {p.kernel.name!r} is direct (k may be zero or negative and is normalised as "
                    f"k / sum k), so it is not a soft-max of log k")
        return None

    # ---- how a problem runs ---------------------------------------------------------------------
    def _sliced(self, p: Problem) -> str | None:
        """``"relative"`` or ``"shared"`` when ``p`` runs on the slice loops, else None."""
        pol = policy(p.q.device)
        if pol.sliced_min_keys is None or p.shape[3] < pol.sliced_min_keys or sdpa_layout(p.kernel) is None:
            return None
        if relative_base(p) is not None:
            return "relative"
        t = p.terms
        if (shared_positions(p) and p.dropout_p == 0 and not t.relative and not t.relative_factors
                and t.bias is None and not t.value and t.key_bias is None):
            return "shared"
        return None

    def _shared(self, p: Problem) -> bool:
        """``product``'s features enter per block instead of being concatenated (where the device has the
        slice loops: the CPU)."""
        return (policy(p.q.device).sliced_min_keys is not None and p.dropout_p == 0 and shared_positions(p)
                and sdpa_layout(p.kernel) is not None)

    def rows(self, p: Problem) -> int:
        pol = policy(p.q.device)
        b, h, tq, tk = p.shape
        if self._sliced(p):
            return block_rows(b, h, tq, tk, self.block) if self.block else block_rows(1, 1, tq, tk, pol.slice_elements)
        budget = self.block or (pol.shared_block_elements if self._shared(p) else pol.block_elements)
        return block_rows(b, h, tq, tk, budget, pol.max_block_rows)

    def declines(self, p: Problem) -> str | None:
        pol, n = policy(p.q.device), p.pairs
        direct_filter = p.full or p.causal or p.key_only
        drops = getattr(p.kernel, "drops_magnitude", False)
        if drops and pol.dropout_blocked_elements is not None and n <= pol.dropout_blocked_elements:
            return (f"kernel {p.kernel.name!r} draws magnitude dropout (training); dense was faster up to "
                    f"{pol.dropout_blocked_elements} (B, H, Tq, Tk) elements (here {n})")
        if pol.sliced_min_keys is not None and p.shape[3] < pol.sliced_min_keys and direct_filter and (
                self._shared(p) or (sdpa_layout(p.kernel) is not None and relative_base(p) is not None)):
            return (f"Tk={p.shape[3]} is below the {pol.sliced_min_keys} keys from which its slice loops run; "
                    f"dense was faster than its blocks at such lengths")
        what = dense_preferred(p, pol)
        if what is not None:
            return (f"its blocks are launch-bound on this device ({what}); dense was faster up to "
                    f"{pol.dense_preferred_elements} (B, H, Tq, Tk) elements (here {n})")
        return None

    def describe(self, p: Problem) -> str:
        rows = self.rows(p)
        blocks = block_spans(p, rows)
        mode = self._sliced(p)
        what = "log k per block" if sdpa_layout(p.kernel) is None else "SDPA features per block"
        text = f"{len(blocks)} block{'s' if len(blocks) != 1 else ''} of {rows} query rows, {what}"
        if mode is not None:
            off = native.why_not(p.q.dtype)
            term = ("Transformer-XL's relative term as a skewed view" if mode == "relative"
                    else "product's positions shared by the batch, formed once per block")
            loop = "compiled loops" if off is None else f"Python loops (compiled loops: {off})"
            text += f"; {term}, per (head, block, batch element) slice on {loop}"
            if off is None:
                keeps = kept_blocks(blocks, p.shape[0], p.shape[1], self._kept(p))
                text += f"; the forward keeps the logits of {sum(keeps)} of {len(keeps)} blocks for the backward"
        elif not (p.full or p.causal or p.key_only):
            kept = sum((r1 - r0) * (hi - lo) for r0, r1, lo, hi in blocks) / max(1, p.shape[2] * p.shape[3])
            text += f"; filter {p.filter!r}: blocks skip keys outside their span and compute {100 * kept:.0f}% of the pairs"
        return text

    def _kept(self, p: Problem) -> int:
        return policy(p.q.device).kept_logits_elements if self.kept is None else self.kept

    # ---- running --------------------------------------------------------------------------------
    def run(self, p: Problem):
        mode = self._sliced(p)
        shared = mode == "shared" or (mode is None and self._shared(p))
        # the slice loops add a key bias to their term in a pass they make anyway; as a feature it would widen
        # every product of the slice by one column
        qf, kf, scale, key_bias = sdpa_features(p, "mask" if mode else "features", positions=not shared)
        rows = self.rows(p)
        if mode is None:
            spec, extras = blocked_spec(p, qf, kf, scale, key_bias, rows, shared)
            return chunked_smoother(spec, qf, kf, p.v, *extras), None
        t = p.terms
        b, h, tq, tk = p.shape
        keep, blocks = plan_blocks(p.keep, tq, tk, rows)
        kb = [x for x in (key_bias, t.key_bias) if x is not None]
        kb = None if not kb else (kb[0] if len(kb) == 1 else kb[0] + kb[1]).to(qf.dtype)
        if mode == "shared":
            spec = SliceSpec(scale=scale, keep=keep, blocks=blocks, term="shared", kept_elements=self._kept(p))
            return sliced_smoother(spec, qf, kf, p.v, kb, t.q_feat.to(qf.dtype), t.k_feat.to(qf.dtype)), None
        q_side, table, _ = t.relative_factors[0]
        spec = SliceSpec(scale=scale, keep=keep, blocks=blocks, term="relative", base=relative_base(p),
                         kept_elements=self._kept(p))
        return sliced_smoother(spec, qf, kf, p.v, kb, q_side.to(qf.dtype), table.to(qf.dtype)), None
