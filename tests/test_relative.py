"""Relative logits of a block: the strided skew (Toeplitz index) equals the gather form, values and gradients;
the relative index kept as two position vectors (DifferenceIndex) equals its materialised tensor."""

import pytest
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


def test_difference_index_blocks_and_toeplitz_base_match_the_materialised_index():
    from kernel_attention.positions.difference_index import DifferenceIndex
    tq, tk = 5, 9
    cases = {
        "memory in front": (torch.arange(tk - tq, tk)[None] + 3, torch.arange(tk)[None], 3 + tk - tq),
        "per-sequence offsets": (torch.stack([torch.arange(tq), torch.arange(tq) + 2]), torch.arange(tk)[None], None),
        "a gap in the keys": (torch.arange(tq)[None], torch.cat([torch.arange(4), torch.arange(5, 10)])[None], None),
        "keys in reverse": (torch.arange(tq)[None], torch.arange(tk).flip(0)[None], None),
    }
    for name, (a, c, base) in cases.items():
        index = DifferenceIndex(a, c)
        dense = a[:, :, None] - c[:, None, :]
        assert index.shape == dense.shape and index.dim() == 3, name
        torch.testing.assert_close(index.materialize(), dense)
        for key in [(Ellipsis, slice(1, 4), slice(2, 7)), (Ellipsis, slice(0, 5), slice(None)), (0, 2)]:
            torch.testing.assert_close(index[key], dense[key])
        assert toeplitz_base(index) == base == toeplitz_base(dense), name
    # Shaw's clipped form: the banded path's test reads the vectors, and agrees with the tensor's
    from kernel_attention.backends.banded import shaw_clip
    t = 9
    for a, c, clip in [(torch.arange(t)[None], torch.arange(t)[None], 3),      # self-attention: banded
                       (torch.arange(t)[None] + 1, torch.arange(t)[None], 3),  # shifted queries: not banded
                       (torch.arange(t)[None], torch.arange(t)[None], 20)]:    # clip beyond the sequence
        index = DifferenceIndex(a, c, clip=clip)
        dense = (a[:, :, None] - c[:, None, :]).clamp(-clip, clip) + clip
        torch.testing.assert_close(index.materialize(), dense)
        torch.testing.assert_close(index[..., 2:6, 1:8], dense[..., 2:6, 1:8])
        assert shaw_clip(index, t, t) == shaw_clip(dense, t, t) and toeplitz_base(index) is None
    with pytest.raises(ValueError, match=r"\(B\|1, Tq\)"):  # batch sizes 2 and 3 do not broadcast
        DifferenceIndex(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long))


def test_difference_index_reads_its_vectors_once(monkeypatch):
    """The offset is read from the vectors once per index (each read is a device sync on a GPU), then kept."""
    from kernel_attention.positions.difference_index import DifferenceIndex
    reads = []
    read = DifferenceIndex._read_offset
    monkeypatch.setattr(DifferenceIndex, "_read_offset", lambda self: reads.append(1) or read(self))
    index = DifferenceIndex(torch.arange(4)[None] + 2, torch.arange(6)[None])
    assert index.offset() == index.offset() == toeplitz_base(index) == 2 and len(reads) == 1
    assert DifferenceIndex(index.a, index.c, known_offset=2).offset() == 2 and len(reads) == 1


def test_xl_terms_hold_no_tq_by_tk_tensor_and_index_the_distances():
    from kernel_attention.positions.difference_index import DifferenceIndex
    from kernel_attention.positions import default_positions, make_position, relative_distance
    torch.manual_seed(0)
    pos = make_position("xl", d_model=8, n_heads=2, d_head=4)
    tq, tk = 48, 64
    q, k = torch.randn(1, 2, tq, 4), torch.randn(1, 2, tk, 4)
    pq, pk = default_positions(tq, tk, "cpu", True)  # queries at the last tq of tk positions
    terms = pos.terms(q, k, pq, pk)
    q_side, table, index = terms.relative_factors[0]
    assert isinstance(index, DifferenceIndex) and toeplitz_base(index) is not None
    held = [terms.key_bias, q_side, table, index.a, index.c]
    assert max(x.numel() for x in held) < tq * tk  # every piece is O(T), none (Tq, Tk)
    dist = relative_distance(pq, pk)[..., 0].long()
    torch.testing.assert_close(index.materialize(), dist - dist.min())
    assert table.shape[1] == int(dist.max() - dist.min()) + 1  # one row per distance met
    # fractional positions keep the materialised (truncated) distances
    idx = pos.terms(q, k, pq + 0.5 * (torch.arange(tq) % 2)[None, :, None], pk).relative_factors[0][2]
    assert isinstance(idx, torch.Tensor) and idx.shape == (1, tq, tk)
