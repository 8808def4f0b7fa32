r"""Choosing a backend, and saying why.

``auto`` walks :data:`ORDER` and takes the first backend that supports the call and does not decline it:

1. ``sdpa``: one fused attention call on kernel features (exp, rbf, periodic; product positions);
2. ``triton``: flash kernels on a GPU for the exp family with Shaw's tables (keys and values), Transformer-XL's
   relative term, key biases and float masks, and the implicit kernels' squared form (magnitude dropout
   included), under causal / local / strided / fixed / memory / padding filters and their intersections
   (taken by ``auto`` once timed on the device);
3. ``flex``: FlexAttention on CUDA, additive terms as a score_mod, sparse filters as a block mask;
4. ``banded``: Shaw's clipped table on the CPU, far keys on the fused kernel and the band explicit;
5. ``squared``: the implicit kernels on the CPU as k / sum k per block;
6. ``blockwise``: any positive kernel, positional term and filter, per block of query rows;
7. ``linear``: kernels with a finite feature map (linear, poly), past their crossover with dense;
8. ``dense``: the reference, which runs everything and alone forms the weights.

A backend declines a call it supports where a measured policy says a later one is faster
(:mod:`~kernel_attention.backends.policy`).  While ``torch.compile`` traces, backends that cannot be traced
are passed over.  A backend asked for by name that cannot run the call raises :class:`BackendError` with
its reason; its policy is not consulted.

A backend chosen by ``auto`` whose kernels then fail to compile for the call (``triton`` under a Triton release
that cannot compile them: :class:`KernelCompileError`, raised before the forward runs) is passed over for that
call and every later one of its specialisation: :func:`~kernel_attention.attention` runs them on the next
backend and warns once, naming Triton's error.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from kernel_attention.backends.base import BACKENDS, Backend, Problem
from kernel_attention.registry import SpecError

__all__ = ["BackendError", "KernelCompileError", "Choice", "choose", "resolve_backend", "ORDER", "AUTO"]

AUTO = "auto"

#: The order in which ``auto`` tries the backends: the fastest special cases first, dense last.
ORDER = ("sdpa", "triton", "flex", "banded", "squared", "blockwise", "linear", "dense")


class BackendError(ValueError):
    """A backend was asked for by name but cannot run this combination."""


class KernelCompileError(RuntimeError):
    """A backend's kernels failed to compile for a call (Triton's compiler, for ``triton``).  Under ``auto``,
    :func:`~kernel_attention.attention` then runs the call on the next backend with a warning; a backend asked
    for by name raises it."""


@dataclasses.dataclass
class Choice:
    """The backend that runs a call (``name``, ``backend``) and, for every backend, why it was or was
    not chosen (``reasons``, in :data:`ORDER`)."""

    name: str
    backend: Backend
    reasons: dict

    def __str__(self) -> str:
        lines = [f"backend: {self.name}"]
        lines += [f"  {n}: {r}" for n, r in self.reasons.items()]
        return "\n".join(lines)


def resolve_backend(spec) -> Backend:
    """A backend instance from a name / spec / instance (``"blockwise:block=4096"``).  Backends hold
    only their parameters, so one instance per spec string is kept (no parsing per call; while
    ``torch.compile`` traces, the instance is made in the trace instead)."""
    if isinstance(spec, str) and not torch.compiler.is_compiling():
        return _from_spec(spec)
    return BACKENDS.create(spec)


@functools.lru_cache(maxsize=64)
def _from_spec(spec: str) -> Backend:
    return BACKENDS.create(spec)


def _pass_over(b: Backend, p: Problem, compiling: bool) -> str | None:
    """Why ``auto`` does not take ``b`` for ``p``, or None."""
    if compiling and not b.traceable:
        return "not traceable by torch.compile"
    why = b.supports(p)
    if why is not None:
        return why
    why = b.declines(p)
    return None if why is None else "declined: " + why


def choose(p: Problem, backend=AUTO, explain: bool = True, skip: dict | None = None) -> Choice:
    """The backend for problem ``p``: ``backend`` is ``"auto"`` or a backend spec.  With
    ``explain=False`` (what :func:`~kernel_attention.attention` uses) the walk stops at the chosen backend
    and no description is formed: the choice is the same, the reasons are
    :func:`~kernel_attention.explain`'s.  ``skip`` maps backends that ``auto`` passes over to why (a backend whose
    kernels failed to compile for ``p``)."""
    if backend != AUTO:
        if isinstance(backend, str) and backend.split(":")[0] not in ORDER:
            raise SpecError(f"unknown backend {backend!r}; accepted: auto, {', '.join(ORDER)}")
        chosen = resolve_backend(backend)
        if torch.compiler.is_compiling() and not chosen.traceable:
            raise BackendError(f"backend {chosen.name!r} is not traceable by torch.compile (it reads values back "
                               f"to the host); under torch.compile use backend='auto', which passes over it, or a "
                               f"traceable one: {', '.join(n for n in ORDER if resolve_backend(n).traceable)}")
        why = chosen.supports(p)
        if why is not None:
            raise BackendError(f"backend {chosen.name!r} cannot run this call: {why}. Use backend='auto' "
                               f"(or 'dense', which runs everything).")
        reasons = {n: "not requested" for n in ORDER}
        reasons[chosen.name] = "requested" + ("; " + chosen.describe(p) if explain else "")
        return Choice(chosen.name, chosen, reasons)

    compiling = torch.compiler.is_compiling()
    reasons: dict = {}
    chosen = None
    for name in ORDER:
        b = resolve_backend(name)
        if chosen is not None:
            if not explain:
                break
            why = _pass_over(b, p, compiling)
            reasons[name] = (f"after {chosen.name}, which runs the call; this one could too" if why is None
                             else f"after {chosen.name}, which runs the call; this one: {why}")
            continue
        why = skip[name] if skip and name in skip else _pass_over(b, p, compiling)
        if why is None:
            chosen = b
            reasons[name] = "chosen" + (": " + b.describe(p) if explain else "")
        else:
            reasons[name] = why
    return Choice(chosen.name, chosen, reasons)
