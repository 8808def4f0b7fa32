"""Helpers shared by the task families: losses, seeded generators, option checking, model building."""

from __future__ import annotations

import zlib
from typing import Any, Iterable, Mapping

import torch
import torch.nn.functional as F

from kernel_attention.registry import SpecError

__all__ = ["label_smoothed_nll", "generator", "check_options", "model_spec"]


def label_smoothed_nll(logits: torch.Tensor, target: torch.Tensor, epsilon: float = 0.0,
                       ignore_index: int | None = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    r"""fairseq's ``label_smoothed_cross_entropy``, averaged over non-ignored tokens.

    With lprobs = log_softmax(logits), V classes and eps_i = epsilon / (V - 1):

        loss = (1 - epsilon - eps_i) * nll + eps_i * sum_v -lprobs_v

    Returns ``(mean smoothed loss, mean nll, n_tokens)``; logits (..., V), target (...) long.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1).reshape(-1, logits.shape[-1])
    target = target.reshape(-1)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target.ne(ignore_index)
    lprobs, target = lprobs[keep], target[keep]
    n = int(target.numel())
    nll = -lprobs.gather(1, target[:, None]).squeeze(1)
    if epsilon > 0:
        eps_i = epsilon / (lprobs.shape[-1] - 1)
        loss = (1.0 - epsilon - eps_i) * nll - eps_i * lprobs.sum(-1)
    else:
        loss = nll
    denom = max(n, 1)
    return loss.sum() / denom, nll.sum() / denom, n


def generator(seed: int, *salt: Any) -> torch.Generator:
    """A CPU generator seeded by ``seed`` and a salt (epoch, split name, ...); never the global RNG."""
    text = "/".join(str(s) for s in (seed, *salt))
    return torch.Generator().manual_seed(zlib.crc32(text.encode()))


def check_options(given: Mapping[str, Any] | None, accepted: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``accepted`` (name -> default) overridden by ``given``; unknown keys fail naming the accepted ones."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        ok = ", ".join(accepted) if accepted else "none (this task has no such options)"
        raise SpecError(f"unknown {where} option(s) {', '.join(unknown)}; accepted: {ok}")
    return {**accepted, **given}


def model_spec(spec: Any, default: str, allowed: Iterable[str]) -> dict[str, Any]:
    """The ``model:`` section as a mapping with a name (default ``default``), restricted to ``allowed``."""
    from kernel_attention.models import MODELS
    from kernel_attention.registry import parse_spec

    if spec is None:
        spec = {}
    if isinstance(spec, Mapping) and "name" not in spec:
        spec = {"name": default, **spec}
    name, params = parse_spec(spec)
    allowed = list(allowed)
    if name not in allowed:
        MODELS.entry(name)  # unknown model names fail listing every model
        raise SpecError(f"model {name!r} does not fit this task; accepted: {', '.join(allowed)}")
    MODELS.validate({"name": name, **params})
    return {"name": name, **params}
