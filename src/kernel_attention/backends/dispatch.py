r"""Choosing a backend, and saying why.

``auto`` tries, in order:

1. ``dense`` when the weights are asked for (only it forms them);
2. ``fused`` for every positive kernel (soft-max of log k), except where its blocked path was measured
   slower than dense and dense's tensors are small enough -- on CUDA, and on the CPU for Transformer-XL's
   relative term and ``product``'s shared positions below the sliced path's 256 keys
   (:meth:`~kernel_attention.backends.fused.FusedBackend.dense_preferred`);
3. ``linear`` for kernels with a finite feature map once the keys are at least
   :func:`linear_crossover` (below it the quadratic form is faster on CPU);
4. ``dense`` otherwise -- the fall-back, with the reasons the others gave.

A backend asked for by name that cannot run the call raises :class:`BackendError` with its reason.
"""

from __future__ import annotations

import dataclasses
import functools

from kernel_attention.backends.base import BACKENDS, Backend, Problem
from kernel_attention.registry import SpecError

__all__ = ["BackendError", "Choice", "choose", "resolve_backend", "linear_crossover", "AUTO"]

AUTO = "auto"


class BackendError(ValueError):
    """A backend was asked for by name but cannot run this combination."""


@dataclasses.dataclass
class Choice:
    """The backend that runs a call (``name``, ``backend``) and, for every backend, why it was or was
    not chosen (``reasons``)."""

    name: str
    backend: Backend
    reasons: dict

    def __str__(self) -> str:
        lines = [f"backend: {self.name}"]
        lines += [f"  {n}: {r}" for n, r in self.reasons.items()]
        return "\n".join(lines)


def linear_crossover(features: int, d_head: int, device: str = "cpu") -> int:
    """Keys from which ``auto`` prefers ``linear`` to ``dense``.  The linear form costs ~T·F·Dv per
    pass against T^2·D for dense, so they break even near T ~ F.  Measured on CPU (docs/benchmarks.md,
    forward+backward, B=4, H=8, D=64): the linear kernel (F = D = 64) is already 3x faster than dense at
    256 keys; poly of degree 2 (F = D(D+1)/2 = 2080), since its scans run on groups of slices with
    their backward written out, is 0.48x / 0.66x dense's speed at 1024 keys (full / causal) and
    1.50x / 1.79x at 2048: break-even near 1.5k / 1.4k keys.  Hence F keys, never below 256.

    On CUDA (H100, bf16) dense's (T, T) products run at matrix-unit speed and the linear form's chunk
    loop is launch-bound: dense was faster at every measured length up to 4096 (linear kernel: 0.81x
    at 4096; poly: 0.05x), so there the crossover is put past the measured range, at 4·F keys and
    never below 8192."""
    if device == "cuda":
        return max(8192, 4 * features)
    return max(256, features)


def resolve_backend(spec) -> Backend:
    """A backend instance from a name / spec / instance (``"fused:key_bias=mask"``).  Backends hold
    only their parameters, so one instance per spec string is kept (no parsing per call)."""
    return _from_spec(spec) if isinstance(spec, str) else BACKENDS.create(spec)


@functools.lru_cache(maxsize=64)
def _from_spec(spec: str) -> Backend:
    return BACKENDS.create(spec)


def choose(p: Problem, backend=AUTO, explain: bool = True) -> Choice:
    """The backend for problem ``p``: ``backend`` is ``"auto"`` or a backend spec.  With
    ``explain=False`` (what :func:`~kernel_attention.attention` uses) the chosen backend's own
    description is skipped, and when ``fused`` runs the call no other backend is asked (``reasons``
    is then empty): the choice is the same, the reasons are :func:`~kernel_attention.explain`'s."""
    names = BACKENDS.names()
    if backend != AUTO:
        if isinstance(backend, str) and backend.split(":")[0] not in names:
            raise SpecError(f"unknown backend {backend!r}; accepted: auto, {', '.join(names)}")
        chosen = resolve_backend(backend)
        why = chosen.why_not(p)
        if why is not None:
            raise BackendError(f"backend {chosen.name!r} cannot run this call: {why}. Use backend='auto' "
                               f"(or 'dense', which runs everything).")
        reasons = {n: ("requested" if n == chosen.name else "not requested") for n in names}
        reasons[chosen.name] = "requested" + ("; " + chosen.describe(p) if explain else "")
        return Choice(chosen.name, chosen, reasons)

    if not explain and not p.need_weights:  # attention(): the first that runs, no reasons gathered
        fused = resolve_backend("fused")
        if fused.why_not(p) is None and fused.dense_preferred(p) is None:
            return Choice("fused", fused, {})
    cands = {n: resolve_backend(n) for n in names}
    why = {n: b.why_not(p) for n, b in cands.items()}
    reasons: dict = {}
    chosen = None
    if p.need_weights:
        chosen = "dense"
        reasons["dense"] = "chosen: need_weights=True and only dense forms the weights"
    elif why["fused"] is None:
        prefer = cands["fused"].dense_preferred(p)
        chosen = "fused" if prefer is None else "dense"
        if prefer is not None:
            reasons["dense"] = "chosen: " + prefer
    elif why["linear"] is None:
        from kernel_attention.backends.linear import feature_size

        f, tk = feature_size(p), p.shape[3]
        cross = linear_crossover(f, p.q.shape[-1], p.q.device.type)
        if tk >= cross:
            chosen = "linear"
        else:
            why["linear"] = (f"can run, but Tk={tk} is below its crossover with dense ({cross} keys for "
                             f"F={f}); pass backend='linear' to force it")
    if chosen is None:
        chosen = "dense"
        reasons["dense"] = "chosen as the fall-back: no faster backend runs this call (see their reasons)"
    for n in names:
        if n == chosen:
            reasons.setdefault(n, "chosen" + (": " + cands[n].describe(p) if explain else ""))
        elif n not in reasons:
            reasons[n] = ("not chosen: " + why[n]) if why[n] is not None else (
                "can run, but " + chosen + " is preferred here")
    return Choice(chosen, cands[chosen], reasons)
