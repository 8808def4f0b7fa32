"""Checks of the layers' constructor arguments, so that a bad size, rate or flag fails where the layer is built,
naming the argument and what it accepts, not in a tensor operation at the first call."""

from __future__ import annotations

from typing import Any

from kernel_attention.registry import Param, SpecError

__all__ = ["check_sizes", "check_rate", "flag"]


def check_sizes(where: str, **sizes: Any) -> None:
    """Each of ``sizes`` (name=value) an integer >= 1."""
    for name, value in sizes.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise SpecError(f"{where}: {name} must be an integer >= 1, got {value!r}")


def check_rate(where: str, name: str, value: Any) -> None:
    """A dropout rate: a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise SpecError(f"{where}: {name} must be in [0, 1), got {value!r}")


def flag(where: str, name: str, value: Any) -> bool:
    """A boolean, also as the configs write one ("true", "no", ...); anything else fails."""
    return Param(name, bool).coerce(value, where)
