"""Counts on the command line (steps, workers, threads, repeats, lengths): an argparse type per count that
refuses what is below its least value, so that argparse exits 2 naming the option before any work."""

from __future__ import annotations

import argparse

__all__ = ["at_least"]


def at_least(low: int, what: str):
    """An argparse type: an integer >= ``low``, ``what`` naming it in the error."""
    def read(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = low - 1
        if n < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low} ({what}), got {text!r}")
        return n
    return read
