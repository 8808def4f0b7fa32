r"""A (B|1, Tq, Tk) index of relative distances, index[b, i, j] = a[b, i] - c[b, j] (clipped to [-clip, clip] and
shifted by clip when ``clip`` is set), kept as its two vectors.

Both relative look-ups of :mod:`kernel_attention.positions` read their table at a function of t_q - t_k:
Transformer-XL's row t_q - t_k - lo of its table of distances, Shaw's row clip(t_q - t_k, -c, c) + c.
Materialised, such an index is a (Tq, Tk) int64 tensor -- 134 MB at T = 4096, 2 GB at T = 16384, more than the
attention's own buffers -- and telling whether it has the structure the fast paths need (Toeplitz,
base + i - j; Shaw's clipped band) read all of it.  :class:`DifferenceIndex` keeps the (B|1, Tq) and (B|1, Tk)
vectors instead (O(Tq + Tk) memory), forms a block when one is asked for (``index[..., rows, cols]``), and
tells its structure from the vectors.  It stands wherever :class:`~kernel_attention.smoother.PositionalTerms`
takes an index tensor; a user's own (B|1, Tq, Tk) tensor is accepted there as before.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

__all__ = ["DifferenceIndex"]


@dataclasses.dataclass(frozen=True)
class DifferenceIndex:
    """index[b, i, j] = a[b, i] - c[b, j], or clamp(a[b, i] - c[b, j], -clip, clip) + clip; ``a`` (B|1, Tq) and
    ``c`` (B|1, Tk) long, on one device."""

    a: Tensor
    c: Tensor
    clip: int | None = None
    #: o when a[b, i] - c[b, j] = o + i - j is known without reading the vectors (default positions)
    known_offset: int | None = None

    def __post_init__(self):
        if self.a.dim() != 2 or self.c.dim() != 2 or (
                self.a.shape[0] != self.c.shape[0] and 1 not in (self.a.shape[0], self.c.shape[0])):
            raise ValueError(f"DifferenceIndex takes a (B|1, Tq) and a (B|1, Tk) vector, got shapes "
                             f"{tuple(self.a.shape)} and {tuple(self.c.shape)}")

    @property
    def shape(self) -> torch.Size:
        return torch.Size((max(self.a.shape[0], self.c.shape[0]), self.a.shape[1], self.c.shape[1]))

    @property
    def device(self) -> torch.device:
        return self.a.device

    def dim(self) -> int:
        return 3

    def _block(self, rows, cols) -> Tensor:
        d = self.a[:, rows, None] - self.c[:, None, cols]
        return d if self.clip is None else d.clamp_(-self.clip, self.clip).add_(self.clip)

    def materialize(self) -> Tensor:
        """The (B|1, Tq, Tk) index tensor."""
        return self._block(slice(None), slice(None))

    def __getitem__(self, key) -> Tensor:
        """A block of the index as a tensor: ``index[..., rows, cols]`` and ``index[..., rows, :]`` form only
        that block; any other key indexes the materialised tensor."""
        if isinstance(key, tuple) and len(key) in (2, 3) and key[0] is Ellipsis \
                and all(isinstance(s, slice) for s in key[1:]):
            return self._block(key[1], key[2] if len(key) == 3 else slice(None))
        return self.materialize()[key]

    def offset(self) -> int | None:
        """o when a[b, i] - c[b, j] = o + i - j for every pair (one sequence of unit-step positions for the
        queries and one for the keys, the same in every batch row), else None: O(Tq + Tk), or free when the
        index was built with ``known_offset``."""
        if self.known_offset is not None:
            return self.known_offset
        if "_offset" not in self.__dict__:  # read from the vectors once: each read is a device sync on a GPU
            object.__setattr__(self, "_offset", self._read_offset())
        return self.__dict__["_offset"]

    def _read_offset(self) -> int | None:
        if self.a.numel() == 0 or self.c.numel() == 0:
            return None

        def unit_steps(x: Tensor) -> bool:
            steps = x[0] - x[0, 0] == torch.arange(x.shape[1], device=x.device)
            return bool((x == x[:1]).all()) and bool(steps.all())

        return int(self.a[0, 0] - self.c[0, 0]) if unit_steps(self.a) and unit_steps(self.c) else None

    def toeplitz_base(self) -> int | None:
        """base when the index is base + i - j for every pair (unclipped, :meth:`offset`), else None."""
        return self.offset() if self.clip is None else None
