"""Helpers shared by the task families: losses, seeded generators, option checking, model building."""

from __future__ import annotations

import math
import zlib
from typing import Any, Iterable, Mapping

import torch

from kernel_attention.registry import SpecError
from kernel_attention.tasks.cross_entropy import label_smoothed_nll

__all__ = ["label_smoothed_nll", "generator", "check_options", "model_spec"]


def generator(seed: int, *salt: Any) -> torch.Generator:
    """A CPU generator seeded by ``seed`` and a salt (epoch, split name, ...); never the global RNG."""
    text = "/".join(str(s) for s in (seed, *salt))
    return torch.Generator().manual_seed(zlib.crc32(text.encode()))


#: what each ``eval`` option accepts: (int or float, lowest value, None allowed, the rule in words).  A
#: value outside it fails when the task is built (``--check``), not as a crash or a silent 0 in the
#: evaluation at the end of a run.
EVAL_RULES: dict[str, tuple[type, float | None, bool, str]] = {
    "beam": (int, 1, False, "an integer >= 1 (1 = greedy)"),
    "len_penalty": (float, None, False, "a finite number"),
    "max_extra": (int, 0, False, "an integer >= 0"),
    "max_len_a": (float, 0, False, "a finite number >= 0"),
    "max_len_b": (float, 0, False, "a finite number >= 0"),
    "max_sentences": (int, 1, True, "an integer >= 1, or null for all"),
    "batch_size": (int, 1, False, "an integer >= 1"),
    "tgt_len": (int, 1, True, "an integer >= 1, or null for the training value"),
    "mem_len": (int, 0, True, "an integer >= 0, or null for the training value"),
    "clamp_len": (int, 1, True, "an integer >= 1, or null for the training value"),
}


def _check_value(where: str, key: str, value: Any) -> None:
    kind, low, nullable, rule = EVAL_RULES[key]
    if value is None and nullable:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if (not number or (kind is int and value != int(value)) or (low is not None and value < low)):
        raise SpecError(f"{where}.{key} must be {rule}, got {value!r}")


def check_options(given: Mapping[str, Any] | None, accepted: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``accepted`` (name -> default) overridden by ``given``; unknown keys fail naming the accepted ones,
    and a value of a key in :data:`EVAL_RULES` outside its rule fails naming the key and the rule."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        ok = ", ".join(accepted) if accepted else "none (this task has no such options)"
        raise SpecError(f"unknown {where} option(s) {', '.join(unknown)}; accepted: {ok}")
    for key, value in given.items():
        if key in EVAL_RULES:
            _check_value(where, key, value)
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
