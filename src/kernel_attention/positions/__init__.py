"""Positions: what a position is (:mod:`~kernel_attention.positions.encodings`), how it enters the kernel
(:mod:`~kernel_attention.positions.schemes`: none, absolute, shaw, xl, product) and the compact index of
relative distances the relative schemes read (:mod:`~kernel_attention.positions.difference_index`).
"""

from kernel_attention.positions.difference_index import DifferenceIndex
from kernel_attention.positions.schemes import (POSITIONS, AbsolutePosition, NoPosition, PositionScheme,
                                                ProductPosition, ShawPosition, XLPosition, default_positions,
                                                make_position, relative_distance)

__all__ = ["PositionScheme", "POSITIONS", "make_position", "default_positions", "NoPosition", "AbsolutePosition",
           "ShawPosition", "XLPosition", "ProductPosition", "relative_distance", "DifferenceIndex"]
