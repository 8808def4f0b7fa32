r"""Dropout masks drawn four 16-bit words at a time, and the dropout layer of the library's models.

``keep_mask(shape, p, seed)`` keeps an entry with probability 1 - p, from a generator seeded by ``seed``: a
blocked pass, which recomputes a block in its backward pass instead of storing its (rows, Tk) tensors, draws the
same mask again from the block's seed (``block_seed``).  :class:`Dropout` is ``nn.Dropout`` whose mask on the CPU
is drawn the same way from torch's default generator (``torch.manual_seed`` and a checkpoint's RNG state
reproduce it); elsewhere, and inside ``torch.compile``, it is torch's own dropout, fused there.

The draws are 16-bit integers, four from each full-range 64-bit draw of the generator: on the CPU a mask takes
about a third of ``bernoulli_``'s time, which draws one value per entry (figures in docs/benchmarks.md).  ``p``
is rounded to a multiple of 2^-16, and :class:`Dropout` scales the kept entries by 1 / (1 - rounded p), so that
the output's expectation is its input.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["keep_mask", "block_seed", "Dropout"]


def block_seed(seed: int, r0: int, c0: int) -> int:
    """The generator seed of the block whose first query row is ``r0`` and first key ``c0`` in a call
    seeded by ``seed`` (< 2^62): distinct per block while ``c0`` < 2^31 and ``r0`` < 2^31."""
    return seed + (r0 << 31) + c0


def keep_mask(shape, p: float, seed: int, device=None) -> Tensor:
    """A bool tensor of ``shape``, True with probability 1 - p (p in [0, 1), rounded to 2^-16), drawn
    from a generator seeded by ``seed``: the same seed gives the same mask."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return _draw_keep(shape, p, gen, device)


def _draw_keep(shape, p: float, generator: torch.Generator | None, device) -> Tensor:
    """``keep_mask``'s draw from ``generator`` (None: torch's default generator of ``device``)."""
    n = math.prod(shape)
    draws = torch.empty(-(-n // 4), dtype=torch.int64, device=device)
    draws.random_(-2 ** 63, None, generator=generator)  # every bit uniform: four 16-bit words
    return (draws.view(torch.int16)[:n] >= -32768 + round(p * 65536)).view(shape)


class Dropout(nn.Dropout):
    """``nn.Dropout(p)``: in training, y = x · keep / (1 - p'), keep ~ Bernoulli(1 - p'), p' = p rounded to 2^-16;
    the identity in evaluation.  On the CPU the mask is drawn as :func:`keep_mask`'s, from torch's default
    generator; on other devices and under ``torch.compile`` it is ``nn.Dropout``'s.  No state: checkpoints of
    ``nn.Dropout`` models load unchanged."""

    def forward(self, x: Tensor) -> Tensor:
        if (not self.training or self.p == 0 or self.inplace or x.device.type != "cpu"
                or torch.compiler.is_compiling()):
            return super().forward(x)
        q = round(self.p * 65536)
        if q == 65536:
            return x * 0
        keep = _draw_keep(x.shape, self.p, None, x.device)
        return x * keep.to(x.dtype).mul_(65536 / (65536 - q))
