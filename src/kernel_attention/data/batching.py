"""Token-based batching (fairseq's ``--max-tokens``) and padding.

A batch of ``n`` examples padded to length ``L`` costs ``n * L`` token slots, padding included (what
fairseq's ``batch_by_size`` counts).  :func:`batch_by_tokens` sorts examples by length so padding is small,
then fills each batch greedily while ``n * max_len <= max_tokens``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = ["batch_by_tokens", "pad_sequences"]


def batch_by_tokens(
    lengths: Sequence[int],
    max_tokens: int,
    max_sentences: int | None = None,
    seed: int | None = None,
) -> list[list[int]]:
    """Group example indices into batches whose padded size ``len(batch) * max(lengths[batch])`` is at
    most ``max_tokens`` (and at most ``max_sentences`` examples).

    ``lengths[i]``: the padded length example ``i`` needs (for translation ``max(src_len, tgt_len)``).
    Without ``seed`` the order is deterministic (sorted by length, ties by index) and batches come out
    shortest first; with ``seed`` ties are broken at random and the batch order is shuffled, both from
    ``numpy.random.default_rng(seed)`` (a new permutation per epoch: pass ``seed + epoch``).
    An example longer than ``max_tokens`` on its own is an error (filter by length first).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    lengths = np.asarray(lengths, dtype=np.int64)
    too_long = np.nonzero(lengths > max_tokens)[0]
    if too_long.size:
        i = int(too_long[0])
        raise ValueError(
            f"example {i} has length {int(lengths[i])} > max_tokens={max_tokens} "
            f"({too_long.size} such examples); filter by length or raise max_tokens"
        )
    rng = np.random.default_rng(seed) if seed is not None else None
    order = rng.permutation(len(lengths)) if rng is not None else np.arange(len(lengths))
    order = order[np.argsort(lengths[order], kind="stable")]

    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order.tolist():
        n_len = max(longest, int(lengths[i]))
        full = (len(batch) + 1) * n_len > max_tokens or (max_sentences is not None and len(batch) >= max_sentences)
        if batch and full:
            batches.append(batch)
            batch, n_len = [], int(lengths[i])
        batch.append(i)
        longest = n_len
    if batch:
        batches.append(batch)
    if rng is not None:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


def pad_sequences(seqs: Sequence[torch.Tensor], pad_id: int = 0, length: int | None = None) -> torch.Tensor:
    """Right-pad 1-D long tensors to ``(B, L)`` with ``L = length or max(len)``."""
    if not seqs:
        raise ValueError("pad_sequences needs at least one sequence")
    L = max(int(s.numel()) for s in seqs) if length is None else length
    out = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    for b, s in enumerate(seqs):
        if s.numel() > L:
            raise ValueError(f"sequence {b} has length {s.numel()} > {L}")
        out[b, : s.numel()] = s
    return out
