r"""Device policy: the sizes and crossovers that decide how ``auto`` runs a call, as data, one record per
device type.

Each number is a measurement, cited in docs/benchmarks.md ("Figures behind the dispatch policy"); a new
device, or a re-measured one, changes this table and nothing else.  Element counts are of dense's
(B, H, Tq, Tk) tensors unless a field says otherwise.

    from kernel_attention.backends.policy import policy
    policy("cuda").dense_preferred_elements
"""

from __future__ import annotations

import dataclasses

__all__ = ["DevicePolicy", "POLICIES", "policy", "block_rows", "dense_preferred"]


@dataclasses.dataclass(frozen=True)
class DevicePolicy:
    #: (B, H, rows, Tk) elements of one block of ``blockwise`` and ``squared``.
    block_elements: int
    #: the same for ``product`` positions shared by the batch (``blockwise``'s shared form).
    shared_block_elements: int
    #: Most query rows per block: smaller blocks follow a sparse or causal filter more closely.
    max_block_rows: int
    #: Up to this many elements, ``auto`` runs on ``dense`` what ``blockwise`` was measured slower at (kernels
    #: without SDPA features, Transformer-XL's relative term; None: never).
    dense_preferred_elements: int | None
    #: Keys from which ``blockwise`` runs the relative term and shared positions per (rows, head, batch
    #: element) slice (the compiled CPU loops); below, ``auto`` prefers ``dense``.  None: no slice loops.
    sliced_min_keys: int | None
    #: (rows, Tk) elements of one slice of the slice loops.
    slice_elements: int
    #: (B, H, rows, Tk) elements of logits the slice loops keep for the backward pass (0 recomputes them).
    kept_logits_elements: int
    #: Above this many elements a call with dropout on the weights runs on ``blockwise`` rather than as one
    #: ``sdpa`` call (whose CPU kernel forms the weights whole with dropout), and below it ``auto`` keeps a
    #: kernel that draws magnitude dropout on ``dense`` rather than ``blockwise``.
    dropout_blocked_elements: int | None
    #: Up to this many elements ``auto`` keeps a kernel that draws magnitude dropout on ``dense`` rather
    #: than ``squared``.
    squared_dropout_dense_elements: int
    #: ``linear`` from max(linear_min_keys, linear_feature_factor · F) keys, F the feature-map size.
    linear_min_keys: int
    linear_feature_factor: int
    #: (slices, chunk, F) feature elements of one block of ``linear``'s scans, above which they run on
    #: groups of (batch, head) slices (CPU only).
    scan_elements: int
    #: Query rows per block of ``banded`` under the full and the causal filter.
    banded_rows_full: int
    banded_rows_causal: int
    #: Up to this many keys ``sdpa`` runs the causal filter with padding as one call on the formed (B, 1, Tq, Tk)
    #: mask; above, blockwise, which skips the blocks past the diagonal, was faster.  None: never.
    sdpa_mask_max_keys: int | None = None
    #: Up to this many keys ``sdpa`` runs a call that needs gradients in bfloat16 or float16 (its inputs' dtype,
    #: or autocast's) as a float32 call, the output cast back: the fused kernel's reduced-precision backward was
    #: the slower there.  None: never.
    sdpa_float32_max_keys: int | None = None
    #: Whether ``auto`` takes ``triton`` where it runs a call and no rule of its own passes it over: only once its
    #: kernels, compiled for the device, have passed their tests there and were timed there.
    triton_auto: bool = False


POLICIES: dict[str, DevicePolicy] = {
    "cpu": DevicePolicy(block_elements=1 << 23, shared_block_elements=1 << 25, max_block_rows=256,
                        dense_preferred_elements=None, sliced_min_keys=256, slice_elements=1 << 24,
                        kept_logits_elements=1 << 25, dropout_blocked_elements=1 << 25,
                        squared_dropout_dense_elements=1 << 23, linear_min_keys=256, linear_feature_factor=1,
                        scan_elements=1 << 23,
                        banded_rows_full=256, banded_rows_causal=64, sdpa_mask_max_keys=512,
                        sdpa_float32_max_keys=256),
    "cuda": DevicePolicy(block_elements=1 << 25, shared_block_elements=1 << 25, max_block_rows=256,
                         dense_preferred_elements=1 << 27, sliced_min_keys=None, slice_elements=1 << 24,
                         kept_logits_elements=0, dropout_blocked_elements=None,
                         squared_dropout_dense_elements=0, linear_min_keys=4096, linear_feature_factor=4,
                         scan_elements=1 << 23,
                         banded_rows_full=256, banded_rows_causal=64, triton_auto=True),
}


def policy(device) -> DevicePolicy:
    """The policy of a device (a ``torch.device`` or its type name); devices not measured take CUDA's."""
    kind = getattr(device, "type", device)
    return POLICIES.get(kind, POLICIES["cuda"])


def block_rows(b: int, h: int, tq: int, tk: int, budget: int, max_rows: int = 256) -> int:
    """Query rows per block so that a (B, H, rows, Tk) block has at most ``budget`` elements
    (at least 16 rows, at most ``max_rows`` and Tq)."""
    rows = max(16, min(max_rows, budget // max(1, b * h * tk)))
    return min(tq, rows)


def dense_preferred(p, pol: DevicePolicy, xl_factors: bool = True) -> str | None:
    """What makes ``dense`` the faster choice for problem ``p`` than a blocked or tiled backend under ``pol``, in
    words, or None: Transformer-XL's relative factors, or a kernel without SDPA features, with no other positional
    term, under a full, causal or key-only filter, up to ``dense_preferred_elements`` (B, H, Tq, Tk) elements.

    ``xl_factors=False`` for a backend that runs Transformer-XL's factors faster than dense within that budget
    (triton; blockwise's blocks do not): the factors are then no reason to prefer dense."""
    from kernel_attention.kernels.capabilities import sdpa_layout

    t = p.terms
    if pol.dense_preferred_elements is None or p.pairs > pol.dense_preferred_elements:
        return None
    if not (p.full or p.causal or p.key_only):
        return None
    if t is not None and (t.relative or t.value or t.bias is not None or t.q_feat is not None):
        return None
    if t is not None and t.relative_factors:
        return "Transformer-XL's relative factors" if xl_factors else None
    if sdpa_layout(p.kernel) is None:
        return f"kernel {p.kernel.name!r} has no SDPA features"
    return None
