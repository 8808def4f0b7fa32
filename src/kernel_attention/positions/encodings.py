r"""Positional features t: what a position *is*, before any kernel sees it.

Positions are integer coordinates of shape (T,) or (T, A) -- A axes, e.g. (row, column) for the Image
Transformer's F x H x W space -- or (B, T, A) when they differ across the batch.  An encoding maps them
to vectors of size ``dim``; with several axes each axis gets ``dim / A`` features and the per-axis
vectors are concatenated (Parmar et al. 2018).

Sinusoidal (Vaswani et al. 2017; Transformer Networks):

    t_{k, 2i} = sin(k / 10000^{2i/dim}),   t_{k, 2i+1} = cos(k / 10000^{2i/dim}).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn

__all__ = ["as_positions", "sinusoid", "SinusoidalEncoding", "LearnedEncoding", "make_encoding"]


def as_positions(pos: Tensor, axes: int, name: str = "positions") -> Tensor:
    """Normalise positions to (Bp, T, A) with Bp in {1, B}; checks the axis count."""
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name} must be a tensor of integer coordinates, got {type(pos).__name__}")
    if pos.dim() == 1:
        pos = pos[None, :, None]
    elif pos.dim() == 2:
        pos = pos[None]
    if pos.dim() != 3 or pos.shape[-1] != axes:
        raise ValueError(f"{name} must have shape (T,), (T, {axes}) or (B, T, {axes}) for {axes} axis(es), "
                         f"got {tuple(pos.shape)}")
    return pos


def sinusoid(pos: Tensor, dim: int, dtype: torch.dtype | None = None) -> Tensor:
    """Interleaved sin/cos features of (any shape) positions -> (..., dim) in ``dtype`` (default
    float32).  Angles are formed in float64 so that long positions keep their precision."""
    if dim % 2:
        raise ValueError(f"sinusoidal encoding needs an even dimension, got {dim}")
    inv_freq = torch.exp(torch.arange(0, dim, 2, device=pos.device, dtype=torch.float64)
                         * (-math.log(10000.0) / dim))
    angle = pos.to(torch.float64).unsqueeze(-1) * inv_freq  # (..., dim/2)
    out = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)
    return out.to(dtype or torch.float32)


def sinusoid_range(lo: int, hi: int, dim: int, dtype: torch.dtype, device: torch.device,
                   clamp: int | None = None) -> Tensor:
    """:func:`sinusoid` of the integers lo..hi (clamped to [-clamp, clamp] when given), (hi - lo + 1, dim),
    kept for the next call with the same arguments: Transformer-XL's table of distances is the same for every
    call of a given length, and forming it (sin and cos in float64 of 2T - 1 distances, interleaved) is a
    noticeable part of a forward pass.  The tensor is shared: read it, do not write to it.  While
    ``torch.compile`` traces, it is formed in the graph instead (the lengths may be symbolic)."""
    if torch.compiler.is_compiling():
        return _sinusoid_range(lo, hi, dim, dtype, device, clamp)
    return _kept_sinusoid_range(lo, hi, dim, dtype, device, clamp)


def _sinusoid_range(lo, hi, dim, dtype, device, clamp):
    distances = torch.arange(lo, hi + 1, device=device)
    if clamp is not None:
        distances = distances.clamp(-clamp, clamp)
    return sinusoid(distances, dim, dtype)


_kept_sinusoid_range = functools.lru_cache(maxsize=16)(_sinusoid_range)


def _split(dim: int, axes: int) -> int:
    if dim % axes:
        raise ValueError(f"encoding dimension {dim} is not divisible by the number of axes {axes}")
    return dim // axes


class SinusoidalEncoding(nn.Module):
    """Fixed sinusoidal encoding, one block of ``dim / axes`` features per axis."""

    def __init__(self, dim: int, axes: int = 1):
        super().__init__()
        self.dim, self.axes = dim, axes
        self.per_axis = _split(dim, axes)

    def forward(self, pos: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """(T,) | (T, A) | (B, T, A) -> (Bp, T, dim)."""
        pos = as_positions(pos, self.axes)
        return torch.cat([sinusoid(pos[..., a], self.per_axis, dtype) for a in range(self.axes)], dim=-1)


class LearnedEncoding(nn.Module):
    """Learned absolute embedding per axis (Gehring et al. 2017; fairseq's learned positions), for
    coordinates 0 .. max_len-1."""

    def __init__(self, dim: int, axes: int = 1, max_len: int = 1024):
        super().__init__()
        self.dim, self.axes, self.max_len = dim, axes, max_len
        per_axis = _split(dim, axes)
        self.tables = nn.ModuleList(nn.Embedding(max_len, per_axis) for _ in range(axes))
        for t in self.tables:
            nn.init.normal_(t.weight, std=0.02)

    def forward(self, pos: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        pos = as_positions(pos, self.axes)
        if pos.min() < 0 or pos.max() >= self.max_len:
            raise ValueError(f"learned encoding covers positions 0..{self.max_len - 1}, got "
                             f"{int(pos.min())}..{int(pos.max())}; raise max_len")
        out = torch.cat([t(pos[..., a].long()) for a, t in enumerate(self.tables)], dim=-1)
        return out if dtype is None else out.to(dtype)


def make_encoding(kind: str, dim: int, axes: int = 1, max_len: int = 1024) -> nn.Module:
    if kind == "sinusoidal":
        return SinusoidalEncoding(dim, axes)
    if kind == "learned":
        return LearnedEncoding(dim, axes, max_len)
    raise ValueError(f"unknown encoding {kind!r}; accepted: sinusoidal, learned")
