r"""``fused``: every positive kernel as a soft-max of log k on PyTorch's fused attention.

A positive kernel smoother is softmax(log k_F + log k_T) (Transformer Dissection, Definition 1, in
log space), so it runs on ``scaled_dot_product_attention`` once log k is written as

    log k(x_i, x_j) = scale · <q'_i, k'_j> + b_ij + (constant along row i).

Five paths, chosen per call (:meth:`FusedBackend.describe` says which):

* **direct** -- one SDPA call, no (Tq, Tk) tensor at all: the kernel has features
  (:meth:`Kernel.sdpa_form`: ``exp``; ``rbf`` with the key-norm term as an augmented feature or as a
  key bias; ``periodic`` as Fourier features), the positional factor is absent or an inner product
  (``product``: its features are concatenated), and the filter is full, causal or padding.
  On the CPU, ``product`` positions shared by the batch go to the sliced path instead (below), and so
  do calls with dropout of more than ``DROPOUT_BLOCKED_ELEMENTS`` (B, H, Tq, Tk) elements to the blocked
  path (SDPA's CPU flash kernel takes no dropout; its math path forms the (Tq, Tk) weights whole).
* **banded** -- Shaw's clipped table (Eq. 6) under a full or causal filter: keys farther than the clip
  share one bias per row, so they run on SDPA without a mask (per block of rows, the key ranges before
  and after its window; causal: one causal call on the shifted sequences), and only the keys within
  the clip are formed explicitly (:mod:`kernel_attention.backends.banded`).
* **sliced** -- on the CPU from ``SLICED_MIN_KEYS`` keys on, a kernel with SDPA features and one additive
  term that is cheap to form per block of rows, any filter, no dropout (:mod:`kernel_attention.backends.sliced`):
  Transformer-XL's relative term (``xl`` with default positions or any index base + i - j), and ``product``
  positions shared by a batch of B > 1.  Both passes run per (block of rows, head, batch element) slice,
  whose buffers stay in cache, as compiled loops (:mod:`kernel_attention.backends.native`, built on first
  use); without them the term is the flash kernel's mask in the forward pass and the backward's slices run
  in Python.  When training, the compiled forward keeps the logits of as many blocks as fit in
  ``KEPT_LOGITS_ELEMENTS`` (``fused:kept=N``), whose backward then forms the weights from them instead of
  recomputing the content product and the term's.  Concatenated, ``product``'s features would double the
  head size of every product of the flash kernel, whose CPU version also pads v to that size (about 2x
  SDPA); as a (rows, Tk) term formed once per head and block for the whole batch it costs 1.1-1.3x with
  the compiled loops (measured, docs/benchmarks.md).  At B = 1 nothing is shared and the one-call form is
  kept; ``fused:shared_positions=false`` asks for it always.
* **squared** -- the implicit kernels on the CPU (:mod:`kernel_attention.backends.squared`): their k is
  ((phi(q)·phi(k))/n)^2 + eps times a per-key magnitude, so k itself is formed per block and
  normalised as k / sum k -- the same soft-max of log k without a logarithm and an exponential per
  pair, under any filter, with their magnitude dropout in training -- while the magnitude's range allows
  it (else, and with positional terms or dropout on the weights, blocked).
* **blocked** -- everything else (Shaw's table beyond the banded path, ``xl`` with dropout or an index
  that is not Toeplitz, dense float biases, kernels with only ``log_kernel`` such as ``rbf-only`` or the
  implicit kernels off the squared path -- their magnitude dropout drawn per block there too,
  :meth:`SimilarityMagnitudeKernel.block_magnitude` --, sparse filters with other terms, dropout with a
  value term or above ``DROPOUT_BLOCKED_ELEMENTS``, and the sliced path's cases with ``sliced=false``):
  query rows are processed in blocks with b formed per block (:mod:`kernel_attention.backends.blocked`)
  and recomputed in the backward pass (:mod:`kernel_attention.backends.chunked`), so extra memory grows as
  rows x Tk.
  Sparse filters skip the keys outside each block's span (a local window costs a band, not a square).

On CUDA the same decomposition can run on FlexAttention (:mod:`kernel_attention.backends.flex`) where
it is faster; the SDPA paths stay the fallback and the only path on CPU.
"""

from __future__ import annotations

import dataclasses

import torch.nn.functional as F
from torch import Tensor

from kernel_attention.backends.base import (BACKENDS, Backend, Problem, as_float_mask, block_rows, sdpa_features,
                                            empty_rows, pad_last, BLOCK_ELEMENTS)
from kernel_attention.backends.banded import banded_clip, shaw_banded
from kernel_attention.backends.blocked import blocked_spec
from kernel_attention.backends.chunked import chunked_smoother, plan_blocks
from kernel_attention.backends.keybias import KeyBiasSDPA
from kernel_attention.backends.sliced import (KEPT_LOGITS_ELEMENTS, SLICE_ELEMENTS, SliceSpec, relative_base,
                                              sliced_smoother)
from kernel_attention.backends.squared import squared_route, squared_smoother
from kernel_attention.registry import Param

__all__ = ["FusedBackend"]

#: Elements of one blocked-path block on CUDA, and on the CPU for ``product`` positions shared by the
#: batch (see :meth:`FusedBackend._rows`).
LARGE_BLOCK_ELEMENTS = 1 << 25

#: Up to this many (B, H, Tq, Tk) elements ``auto`` runs on dense what the blocked path was measured slower
#: at (:meth:`FusedBackend.dense_preferred`): T = 2048 at B=4, H=8, about 1.5 GB of dense's peak in bf16.
DENSE_PREFERRED_ELEMENTS = 1 << 27

#: Keys from which the sliced path runs (below, the blocked path): its per-slice calls cost more than its
#: cache-resident slices save on short sequences.  Measured on the CPU, one thread, fwd+bwd (a one-off sweep,
#: docs/benchmarks.md): ``xl`` at B=4, H=8, D=64 sliced / blocked 1.45x at T=32, 0.95x at 128, 0.75x at 256;
#: at the main job's B=64, H=4, D=8, T=8: 18.0 ms against 3.1 ms.
SLICED_MIN_KEYS = 256

#: (B, H, Tq, Tk) elements above which, on the CPU, a call with dropout runs on the blocked path: one with a
#: one-call form (SDPA's CPU flash kernel takes no dropout, so such a call runs on its math path, which forms
#: the (Tq, Tk) weights whole), and a kernel that draws magnitude dropout on the blocked path (the implicit
#: kernels' ``official`` form in training with dropout on the weights too, which ``auto`` otherwise runs on
#: dense; on the squared path the limit is ``SQUARED_DROPOUT_DENSE_ELEMENTS``).  At or below it, forming the weights whole is
#: the faster way; above it (float32 weights over 128 MiB) the blocks are.  Measured by the benchmark (heap
#: malloc as the CLI sets it, one thread, fwd+bwd; docs/benchmarks.md, "training calls"):
#: ``ikan-direct:official=true,p=3.0`` with dropout 0.1, H=8, D=8, blocked / dense: 1.17x at B=50, T=100;
#: 1.09x at B=1, T=1030 and 2048 (2^25 elements), 1.25x at B=4, T=1024 (2^25); 0.54x at B=1, T=2500, 0.50x
#: at 2900, 0.40x at 4096.  ``exp`` with dropout 0.1, blocked / one SDPA call: 1.18x at B=1, H=4, D=16,
#: T=2048; 1.20x at B=1, H=8, D=64, T=2048 (2^25); 1.01x at H=4, T=2900; 0.64x at 4096; 0.48x at B=4, H=8,
#: D=64, T=2048; 0.57x at B=32, H=8, D=64, T=512.
DROPOUT_BLOCKED_ELEMENTS = 1 << 25

#: (B, H, Tq, Tk) elements up to which ``auto`` keeps a kernel that draws magnitude dropout on ``dense`` on the
#: CPU when ``fused`` would run it on the squared path (:mod:`kernel_attention.backends.squared`; on the blocked
#: path the limit is ``DROPOUT_BLOCKED_ELEMENTS``).  Measured by the benchmark (one thread, fwd+bwd, heap malloc;
#: docs/benchmarks.md, "magnitude dropout on the squared path"): ``ikan-direct:official=true,p=3.0``, H=8, D=8,
#: squared / dense: 1.11x at B=50, T=60, 1.05x at T=100; at B=1 1.17x at T=256, 1.02x at 506, 1.01x at 1030
#: (1.01 x 2^23 elements), 0.65x at 2048 (2^25); 0.92x at B=4, T=1024 (2^25).
SQUARED_DROPOUT_DENSE_ELEMENTS = 1 << 23


@dataclasses.dataclass
class Route:
    """How :class:`FusedBackend` runs one problem, with what deciding it computed, so that
    :meth:`FusedBackend.run` and :meth:`FusedBackend.describe` decide once per call."""

    path: str                       #: "flex", "banded", "sliced", "direct", "squared" or "blocked"
    shared: bool = False            #: ``product`` positions as a per-block mask (FusedBackend._shared_positions)
    clip: int | None = None         #: banded: Shaw's clip c
    base: int | None = None         #: sliced: the Toeplitz base of the relative index
    mask: Tensor | None = None      #: direct: SDPA's float mask
    is_causal: bool = False         #: direct: SDPA's causal flag
    squared: str | None = ""        #: None on the squared path, else why not ("": the kernel has no such form)
    key_log: Tensor | None = None   #: squared: the per-key log factor, -inf at keys no query keeps
    large_dropout: bool = False     #: blocked although one SDPA call would do: dropout, > DROPOUT_BLOCKED_ELEMENTS


@BACKENDS.register("fused", [
    Param("key_bias", str, "features", choices=("features", "mask"),
          doc="a per-key log-kernel term (rbf's -s||k||^2) as an augmented feature or as an SDPA bias (the "
              "sliced path always adds it to its term, where it costs no product)"),
    Param("block", int, None, optional=True, check=lambda x: x >= 1024, rule=">= 1024",
          doc="elements of one (B, H, rows, Tk) block on the blocked and sliced paths (default: 2^23 on CPU, 2^25 on "
              "CUDA; the sliced path's default is 2^20 per (rows, Tk) slice)"),
    Param("flex", bool, True, doc="on CUDA, run biases and sparse filters on FlexAttention"),
    Param("banded", bool, True,
          doc="on CPU, run Shaw's clipped table as SDPA on the keys beyond the clip plus an explicit band"),
    Param("shared_positions", bool, True,
          doc="on CPU, product positions shared by a batch of B > 1 as a per-block mask instead of concatenated "
              "features"),
    Param("sliced", bool, True,
          doc="on CPU, Transformer-XL's relative term and product positions shared by the batch with the backward "
              "per (head, block, batch element) slice instead of per block of all slices (the blocked path)"),
    Param("kept", int, KEPT_LOGITS_ELEMENTS, check=lambda x: x >= 0, rule=">= 0",
          doc="on CPU, (B, H, rows, Tk) elements of the sliced path's logits that the forward keeps for the "
              "backward, which then forms the weights from them instead of recomputing two products (2^25: 128 MiB "
              "in float32; 0 recomputes all)"),
    Param("squared", bool, True,
          doc="on CPU, the implicit kernels as k / sum k per block ((phi_q·phi_k)^2 + eps times a per-key factor) "
              "instead of a soft-max of log k"),
])
class FusedBackend(Backend):
    """Positive kernels on ``scaled_dot_product_attention`` (see the module docstring)."""

    name = "fused"

    def __init__(self, key_bias: str = "features", block: int | None = None, flex: bool = True,
                 banded: bool = True, shared_positions: bool = True, sliced: bool = True,
                 kept: int = KEPT_LOGITS_ELEMENTS, squared: bool = True):
        self.key_bias, self.block, self.flex, self.banded = key_bias, block, flex, banded
        self.shared_positions, self.sliced, self.squared = shared_positions, sliced, squared
        self.kept = kept

    def _rows(self, p: Problem, shared: bool) -> int:
        """Query rows per block of the blocked path.  A GPU runs one block as a handful of kernels, so
        small blocks leave it launch-bound: 4x the CPU's budget there (at B=4, H=8, T=4096, 256 rows, a
        (B, H, rows, Tk) block 1/16 of the (T, T) tensors of dense).  The same larger budget serves
        ``product`` positions shared by the batch on the CPU (with ``sliced=false``): at T=4096 its full
        filter went from 1.80x to 1.58x SDPA with 256-row blocks instead of 64 (causal 1.46x either way), where
        ``xl`` gained in one filter and lost in the other, so the CPU default stays for the rest.  ``shared``: whether
        ``p`` runs in that form (:meth:`_shared_positions`)."""
        large = p.q.device.type == "cuda" or shared
        budget = self.block or (LARGE_BLOCK_ELEMENTS if large else BLOCK_ELEMENTS)
        b, h, tq, tk = p.shape
        return block_rows(b, h, tq, tk, budget)

    def _slice_rows(self, p: Problem) -> int:
        """Query rows per block of the sliced path: a (rows, Tk) slice buffer of at most SLICE_ELEMENTS, unless
        ``block`` sets the budget of a (B, H, rows, Tk) block (which tests use to run several blocks on small
        inputs)."""
        b, h, tq, tk = p.shape
        return block_rows(b, h, tq, tk, self.block) if self.block else block_rows(1, 1, tq, tk, SLICE_ELEMENTS)

    def why_not(self, p: Problem) -> str | None:
        if p.need_weights:
            return "need_weights=True: only dense materialises the (Tq, Tk) weights"
        if not p.kernel.positive:
            return (f"kernel {p.kernel.name!r} is direct (k may be zero or negative and is normalised as "
                    f"k / sum k), so it is not a soft-max of log k")
        return None

    def dense_preferred(self, p: Problem, device: str | None = None) -> str | None:
        """Why ``auto`` should run ``p`` on ``dense`` although this backend can, or None.

        On CUDA the blocked path is launch-bound.  Measured on an H100 in bf16 (docs/benchmarks.md, GPU;
        B=4, H=8, D=64, two runs), dense ran ``xl``, ``ikas`` and ``rbf-only`` 2-3x faster at T=1024 (at 3x
        the blocked path's memory) and 0.9-2x as fast at T=4096 (at 10x).  So for what was measured -- a
        kernel with no SDPA features (the implicit kernels, ``rbf-only``) or Transformer-XL's relative
        factors, under a full, causal or padding filter -- dense is preferred while its (B, H, Tq, Tk)
        tensors have at most ``DENSE_PREFERRED_ELEMENTS`` elements; above that, the blocked path's
        memory is.  Shaw's table is left out: dense's backward scatter-adds into the table (26x slower
        than FlexAttention at T=4096).

        On the CPU the same holds for what the sliced path runs but below its ``SLICED_MIN_KEYS`` keys
        (:meth:`_sliced_but_short`): dense 15-20% faster than the blocked path there, fwd+bwd (``xl`` 20.4 / 23.4
        ms at T=128, B=4, H=8, D=64; docs/benchmarks.md), and for a kernel that draws magnitude dropout up to
        ``SQUARED_DROPOUT_DENSE_ELEMENTS`` elements where fused would run it on the squared path (dense up to
        1.1x faster there) and up to ``DROPOUT_BLOCKED_ELEMENTS`` where on the blocked path (weight dropout, or
        a key factor too wide for the squared path; dense 1.1-1.25x faster there).  Otherwise the blocked path is
        faster on the CPU for ``xl`` and ``rbf-only``; for the implicit kernels the two trade places with the
        size and filter.  ``device`` overrides ``p``'s device (to test the rule on a CPU)."""
        n, t = p.pairs, p.terms
        if p.need_weights or n > DENSE_PREFERRED_ELEMENTS:
            return None
        if (device or p.q.device.type) != "cuda":  # the cheap tests first: attention() asks this on every call
            # above DROPOUT_BLOCKED_ELEMENTS (the larger limit) neither applies: no route check on large calls
            if n <= DROPOUT_BLOCKED_ELEMENTS and getattr(p.kernel, "drops_magnitude", False):
                squared = self.squared and squared_route(p)[1] is None
                limit = SQUARED_DROPOUT_DENSE_ELEMENTS if squared else DROPOUT_BLOCKED_ELEMENTS
                if n <= limit:
                    return (f"on the CPU, kernel {p.kernel.name!r} draws magnitude dropout (training), which "
                            f"fused's {'squared' if squared else 'blocked'} path draws per block; dense was faster "
                            f"up to {limit} (B, H, Tq, Tk) elements (here {n}); pass backend='fused' to use it")
            if not self._sliced_but_short(p) or not self._direct_mask(p)[0]:
                return None
            what = ("product's positions shared by the batch" if t.q_feat is not None
                    else "Transformer-XL's relative term")
            return (f"on the CPU, {what} with Tk={p.shape[3]} keys (below the sliced path's {SLICED_MIN_KEYS}) "
                    f"would run on fused's blocked path, which dense was faster than at such lengths; its "
                    f"(B, H, Tq, Tk) tensors have {n} elements (at most {DENSE_PREFERRED_ELEMENTS}); pass "
                    f"backend='fused' to use it")
        factors = t is not None and bool(t.relative_factors)
        if t is not None and (t.relative or t.value or t.bias is not None or t.q_feat is not None):
            return None
        if not (factors or not _has_form(p)) or not self._direct_mask(p)[0]:
            return None
        what = "Transformer-XL's relative factors" if factors else f"kernel {p.kernel.name!r} has no SDPA features"
        return (f"on CUDA, fused would run its blocked path ({what}), which is launch-bound there; dense was "
                f"faster where measured and its (B, H, Tq, Tk) tensors have {n} elements (at most "
                f"{DENSE_PREFERRED_ELEMENTS}); pass backend='fused' for the blocked path's smaller memory")

    # ---- planning -------------------------------------------------------------------------------
    def _direct_mask(self, p: Problem):
        """(ok, float mask or None, is_causal) for the one-call path."""
        b, h, tq, tk = p.shape
        if p.keep is None:
            return True, None, False
        if p.causal and tq == tk:
            return True, None, True
        if p.key_only and empty_rows(p.keep) is None:
            keep = p.keep
            while keep.dim() < 4:
                keep = keep.unsqueeze(0)
            return True, as_float_mask(keep[..., :1, :], p.q.dtype), False  # (B|1, H|1, 1, Tk)
        return False, None, False

    def _shared_positions(self, p: Problem) -> bool:
        """Whether ``product``'s positional features enter as a per-block bias shared by the batch
        instead of being concatenated: on the CPU, features with batch size 1 for a batch B > 1, no
        dropout, unless ``shared_positions=false`` (the module docstring says why)."""
        t = p.terms
        return (self.shared_positions and t is not None and t.q_feat is not None and p.q.device.type == "cpu"
                and p.dropout_p == 0
                and t.q_feat.shape[0] == 1 and t.k_feat.shape[0] == 1 and p.shape[0] > 1
                and _has_form(p))

    def _sliced_but_short(self, p: Problem) -> bool:
        """Whether ``p`` has a term the sliced path runs (Transformer-XL's relative term, ``product``'s shared
        positions) but fewer than ``SLICED_MIN_KEYS`` keys, so that it goes to the blocked path instead."""
        return self.sliced and p.shape[3] < SLICED_MIN_KEYS and (
            self._shared_positions(p) or (_has_form(p) and relative_base(p) is not None))

    def _dropout_blocked(self, p: Problem) -> bool:
        """Whether a call with dropout goes to the blocked path although it has a one-call form: on the CPU
        above ``DROPOUT_BLOCKED_ELEMENTS`` (B, H, Tq, Tk) elements."""
        return p.dropout_p > 0 and p.q.device.type == "cpu" and p.pairs > DROPOUT_BLOCKED_ELEMENTS

    def _route(self, p: Problem) -> Route:
        """The path of ``p``, in the order the module docstring lists them.  A key bias has a one-call
        form only on the CPU without dropout (:class:`KeyBiasSDPA`; CUDA's SDPA cannot differentiate a
        (B, H, 1, Tk) mask), so elsewhere it goes to FlexAttention or the blocked path."""
        t = p.terms
        layout = p.kernel.sdpa_layout(self.key_bias)
        shared = self._shared_positions(p)
        additive = t is not None and bool(t.relative or t.relative_factors or t.bias is not None or t.value
                                          or t.key_bias is not None)
        ok, mask, is_causal = (False, None, False) if additive or shared or layout is None else self._direct_mask(p)
        one_call = ok and (layout == "features" or (p.dropout_p == 0 and p.q.device.type == "cpu"))
        large_dropout = one_call and self._dropout_blocked(p)
        one_call = one_call and not large_dropout
        if p.q.device.type == "cuda" and self.flex and layout is not None and not one_call:
            from kernel_attention.backends.flex import flex_why_not

            if flex_why_not(p) is None:
                return Route("flex", shared)
        clip = banded_clip(p, self.key_bias) if self.banded else None
        if clip is not None:
            return Route("banded", clip=clip)
        long = p.shape[3] >= SLICED_MIN_KEYS
        base = relative_base(p) if self.sliced and long and layout is not None else None
        if base is not None:
            return Route("sliced", base=base)
        if one_call:
            return Route("direct", mask=mask, is_causal=is_causal)
        if layout is None:
            if not self.squared:
                why = "squared=false" if p.kernel.has_squared_form() else ""
                return Route("blocked", squared=why)
            key_log, why = squared_route(p)
            if why is None:
                return Route("squared", squared=None, key_log=key_log)
            return Route("blocked", squared=why)
        if shared and self.sliced and long and not additive:
            return Route("sliced", shared=True)
        return Route("blocked", shared, large_dropout=large_dropout)

    def describe(self, p: Problem) -> str:
        from kernel_attention.backends.fused_describe import describe_route  # it imports this module

        return describe_route(self, p, self._route(p))

    # ---- running --------------------------------------------------------------------------------
    def run(self, p: Problem):
        route = self._route(p)
        v = p.v
        if route.path == "squared":
            b, h, tq, tk = p.shape
            keep, blocks = plan_blocks(p.keep, tq, tk, self._rows(p, False))
            form = p.kernel.squared_form(p.q, p.k, key_log=route.key_log)
            return squared_smoother(form, v, keep, blocks), None
        # the sliced path adds a key bias to its term in a pass it makes anyway; as a feature it would widen
        # every product of the slice by one column (rbf with xl at T=1024: 2-4% slower, measured)
        form = "mask" if route.path == "sliced" else self.key_bias
        qf, kf, scale, key_bias = sdpa_features(p, form, positions=not route.shared)
        if route.path == "flex":
            from kernel_attention.backends.flex import flex_smoother

            return flex_smoother(p, qf, kf, scale, key_bias), None
        if route.path == "sliced":
            return self._sliced(p, qf, kf, scale, key_bias, route), None
        if route.path == "banded":
            return shaw_banded(qf, kf, v, p.terms.relative[0][0].to(qf.dtype), route.clip, p.causal, scale), None
        if route.path == "direct":
            if key_bias is not None:
                return KeyBiasSDPA.apply(qf, kf, v, key_bias, route.mask, route.is_causal, scale), None
            d = max(qf.shape[-1], v.shape[-1])
            if p.q.device.type == "cuda":  # CUDA's flash and memory-efficient kernels need D % 8 == 0
                d = -(-d // 8) * 8
            out = F.scaled_dot_product_attention(pad_last(qf, d), pad_last(kf, d), pad_last(v, d),
                                                 attn_mask=route.mask, dropout_p=p.dropout_p,
                                                 is_causal=route.is_causal, scale=scale)
            return (out if d == v.shape[-1] else out[..., :v.shape[-1]]), None
        return self._blocked(p, qf, kf, scale, key_bias, route.shared), None

    def _sliced(self, p: Problem, qf, kf, scale, key_bias, route: Route):
        """``product``'s shared features or Transformer-XL's relative term on :func:`sliced_smoother`; the
        kernel's key bias (``rbf`` as a mask) and the scheme's (u·k) enter as one."""
        t = p.terms
        b, h, tq, tk = p.shape
        keep, blocks = plan_blocks(p.keep, tq, tk, self._slice_rows(p))
        kb = [x for x in (key_bias, t.key_bias) if x is not None]
        kb = None if not kb else (kb[0] if len(kb) == 1 else kb[0] + kb[1]).to(qf.dtype)
        if route.shared:
            spec = SliceSpec(scale=scale, keep=keep, blocks=blocks, term="shared", kept_elements=self.kept)
            return sliced_smoother(spec, qf, kf, p.v, kb, t.q_feat.to(qf.dtype), t.k_feat.to(qf.dtype))
        q_side, table, _ = t.relative_factors[0]
        spec = SliceSpec(scale=scale, keep=keep, blocks=blocks, term="relative", base=route.base,
                         kept_elements=self.kept)
        return sliced_smoother(spec, qf, kf, p.v, kb, q_side.to(qf.dtype), table.to(qf.dtype))

    def _blocked(self, p: Problem, qf, kf, scale, key_bias, shared: bool):
        """``shared``: ``product``'s features are not in qf / kf (:meth:`_shared_positions`)."""
        spec, extras = blocked_spec(p, qf, kf, scale, key_bias, self._rows(p, shared), shared)
        return chunked_smoother(spec, qf, kf, p.v, *extras)


def _has_form(p: Problem) -> bool:
    """Whether the kernel has SDPA features."""
    return p.kernel.sdpa_layout() is not None
