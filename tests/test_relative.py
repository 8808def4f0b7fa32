"""Relative logits of a block: the strided skew (Toeplitz index) equals the gather form, values and gradients."""

import torch

from kernel_attention.backends.relative import gather_rel, rel_logits, skew_rel, toeplitz_base


def test_toeplitz_base_detects_only_toeplitz_indices():
    tq, tk = 5, 9  # queries aligned to the last 5 of 9 keys: a memory of 4 in front
    idx = (torch.arange(tk - tq, tk)[:, None] - torch.arange(tk)[None, :] + 8)[None]
    assert toeplitz_base(idx) == 8 + tk - tq
    bad = idx.clone()
    bad[0, 2, 3] += 1
    assert toeplitz_base(bad) is None
    assert toeplitz_base(idx.clamp(0, 10)) is None


def test_skew_equals_gather_on_blocks_with_gradients():
    torch.manual_seed(0)
    b, h, d, tq, tk = 2, 3, 4, 7, 11
    q = torch.randn(b, h, tq, d, dtype=torch.float64, requires_grad=True)
    table = torch.randn(h, tq + tk - 1, d, dtype=torch.float64, requires_grad=True)
    index = (torch.arange(tk - tq, tk)[:, None] - torch.arange(tk)[None, :] + tq - 1)[None]  # rows of table
    base = toeplitz_base(index)
    # more rows than columns too: the skew's backward zeroes only the bands its view may miss
    for rows, cols in [(slice(0, 7), slice(0, 11)), (slice(2, 5), slice(3, 9)), (slice(6, 7), slice(10, 11)),
                       (slice(0, 7), slice(4, 6))]:
        ours = skew_rel(q[..., rows, :], table, base, rows, cols)
        ref = gather_rel(rel_logits(q[..., rows, :], table), index[..., rows, cols])
        torch.testing.assert_close(ours, ref)
        g = torch.randn_like(ref)
        torch.testing.assert_close(torch.autograd.grad(ours, [q, table], g), torch.autograd.grad(ref, [q, table], g))
