"""Counts and amounts on the command line (steps, workers, threads, repeats, lengths, a temperature): an argparse
type per option that refuses what is below its least value, so that argparse exits 2 naming the option before any
work."""

from __future__ import annotations

import argparse
import math

__all__ = ["at_least"]


def at_least(low: int | float, what: str, kind: type = int):
    """An argparse type: an integer (``kind=float``: a finite number) >= ``low``, ``what`` naming it in the error."""
    def read(text: str):
        try:
            n = kind(text)
        except ValueError:
            n = None
        if n is None or not math.isfinite(n) or n < low:
            raise argparse.ArgumentTypeError(
                f"must be {'an integer' if kind is int else 'a number'} >= {low} ({what}), got {text!r}")
        return n
    return read
