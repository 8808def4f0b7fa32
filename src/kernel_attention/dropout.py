r"""Dropout masks that a blocked pass can draw again: seeded by the call and the block, so that the
backward pass, which recomputes a block instead of storing its (rows, Tk) tensors, multiplies by the
same mask as the forward pass did.

``keep_mask(shape, p, seed)`` keeps an entry with probability 1 - p.  Its draws are 16-bit integers,
three from each 64-bit draw of the generator (the top 16 bits of PyTorch's non-negative 64-bit draw
have one bit fewer and are left out): on the CPU about twice as fast as ``torch.rand`` and a compare
(22 ms against 40 ms for 8.4M entries), which matters at T = 5875 (IKA Table 4's Parkinsons, 8 heads:
276M draws per mask and pass).
``p`` is rounded to a multiple of 2^-16.
"""

from __future__ import annotations

import math
import sys

import torch
from torch import Tensor

__all__ = ["keep_mask", "block_seed"]


def block_seed(seed: int, r0: int, c0: int) -> int:
    """The generator seed of the block whose first query row is ``r0`` and first key ``c0`` in a call
    seeded by ``seed`` (< 2^62): distinct per block while ``c0`` < 2^31 and ``r0`` < 2^31."""
    return seed + (r0 << 31) + c0


def keep_mask(shape, p: float, seed: int, device=None) -> Tensor:
    """A bool tensor of ``shape``, True with probability 1 - p (p in [0, 1), rounded to 2^-16), drawn
    from a generator seeded by ``seed``: the same seed gives the same mask."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    n = math.prod(shape)
    m = -(-n // 3)
    draws = torch.empty(m, dtype=torch.int64, device=device).random_(generator=gen)
    words = draws.view(torch.int16).view(m, 4)[:, _LOW]  # the three uniform 16-bit words
    return (words >= -32768 + round(p * 65536)).view(-1)[:n].view(shape)


#: The 16-bit words of an int64 below its top one, in memory order.
_LOW = slice(0, 3) if sys.byteorder == "little" else slice(1, 4)
