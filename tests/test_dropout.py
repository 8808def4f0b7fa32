"""Seeded dropout masks (kernel_attention.dropout): reproducible, with the asked-for keep rate."""

import math

import torch

from kernel_attention.dropout import block_seed, keep_mask


def test_same_seed_same_mask_other_seed_other_mask():
    a, b, c = keep_mask((3, 5, 7), 0.3, 11), keep_mask((3, 5, 7), 0.3, 11), keep_mask((3, 5, 7), 0.3, 12)
    assert a.shape == (3, 5, 7) and a.dtype == torch.bool
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_keep_rate_is_one_minus_p_in_every_word():
    # 3 x 2^17 draws: the rate within 5 standard deviations, overall and in each of the three 16-bit
    # words taken from one 64-bit draw (a word with a missing bit would keep at another rate).
    n = 3 * 2 ** 17
    for p in (0.1, 0.5, 0.9):
        keep = keep_mask((n,), p, 7).float()
        for part in (keep, keep[0::3], keep[1::3], keep[2::3]):
            tol = 5 * math.sqrt(p * (1 - p) / len(part))
            assert abs(part.mean().item() - (1 - p)) < tol, (p, part.mean().item())
    assert bool(keep_mask((1000,), 0.0, 3).all())


def test_block_seeds_are_distinct():
    seeds = {block_seed(5, r, c) for r in range(0, 4096, 64) for c in range(0, 4096, 512)}
    assert len(seeds) == 64 * 8
