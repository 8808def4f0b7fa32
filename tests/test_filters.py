"""Set filtering functions: against per-entry definitions, hand-checked matrices, TXL's mask code."""

import pytest
import torch

import kernel_attention as ka
from kernel_attention.reference import filter_keep, kernel_value, smoother_loop

CASES = [("full", {}), ("causal", {}), ("memory", {}), ("memory", {"same_length": True}),
         ("memory", {"same_length": True, "mem_len": 2}), ("local", {"window": 1}),
         ("strided", {"stride": 3}), ("fixed", {"stride": 3}), ("fixed", {"stride": 4, "c": 2})]


@pytest.mark.parametrize("name,params", CASES)
@pytest.mark.parametrize("tq,tk", [(6, 6), (4, 7)])
def test_filter_matches_definition(name, params, tq, tk):
    spec = {"name": name, **params}
    if params == {"same_length": True} and tq == tk:
        pytest.skip("same_length takes its window from the memory present: none here (an error, tested below)")
    got = ka.make_filter(spec).mask(tq, tk)
    assert torch.equal(got, filter_keep(name, tq, tk, **params))


def test_strided_hand_checked():
    # Child et al.: previous `stride` positions and every stride-th one before them.
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],  # p=3: distance 3 is a multiple of the stride
        [0, 1, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(ka.make_filter("strided:stride=3").mask(6, 6), expected)


def test_fixed_hand_checked():
    # Blocks of 3; the last cell of each block (c=1) is a summary every later query sees.
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(ka.make_filter("fixed:stride=3").mask(6, 6), expected)


@pytest.mark.parametrize("qlen,mlen,mem_len", [(4, 3, 3), (3, 5, 5), (5, 0, 0), (5, 0, 3), (4, 2, 5), (6, 4, 2)])
@pytest.mark.parametrize("same_length", [False, True])
def test_memory_matches_transformer_xl_mask(qlen, mlen, mem_len, same_length):
    """kimiyoung/transformer-xl MemTransformerLM._forward's dec_attn_mask (1 = excluded): mlen keys of memory
    present, the model's mem_len (the window of same_length)."""
    klen = qlen + mlen
    all_ones = torch.ones(qlen, klen)
    if same_length:
        mask_len = klen - mem_len
        mask_shift_len = qlen - mask_len if mask_len > 0 else qlen
        excluded = (torch.triu(all_ones, 1 + mlen) + torch.tril(all_ones, -mask_shift_len)).bool()
    else:
        excluded = torch.triu(all_ones, diagonal=1 + mlen).bool()
    spec = {"name": "memory", "same_length": same_length} | ({"mem_len": mem_len} if same_length else {})
    if same_length and mem_len == 0:  # TXL excludes every key there; the filter says why instead
        assert excluded.all()
        with pytest.raises(ValueError, match="mem_len=0 must satisfy: >= 1"):
            ka.make_filter(spec)
        return
    filt = ka.make_filter(spec)
    assert torch.equal(filt.mask(qlen, klen), ~excluded)
    lo, hi = filt.row_bounds(qlen, klen)
    assert torch.equal(torch.arange(klen)[None, :].ge(lo[:, None]) & torch.arange(klen)[None, :].lt(hi[:, None]),
                       ~excluded)


def test_memory_filter_refuses_a_window_that_keeps_no_key_or_is_ignored():
    with pytest.raises(ValueError, match="drop mem_len or add same_length=true"):
        ka.make_filter("memory:mem_len=4")
    with pytest.raises(ValueError, match="no memory given"):  # its window defaults to the memory present: none
        ka.make_filter("memory:same_length=true").mask(5, 5)
    q = torch.randn(1, 1, 5, 4)
    with pytest.raises(ValueError, match="no memory given"):
        ka.attention(q, q, q, mask="memory:same_length=true")


def test_memory_is_lower_right_causal_like_pytorch():
    from torch.nn.attention.bias import causal_lower_right
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 7))
    torch.testing.assert_close(ka.attention(q, k, v, mask="memory"), ref)


def test_composition_and_or():
    causal, local = ka.make_filter("causal"), ka.make_filter("local:window=2")
    both = (causal & local).mask(6, 6)
    assert torch.equal(both, causal.mask(6, 6) & local.mask(6, 6))
    assert torch.equal(ka.make_filter("causal&local:window=2").mask(6, 6), both)
    either = ka.make_filter("strided:stride=4|local:window=1").mask(6, 6)
    assert torch.equal(either, ka.make_filter("strided:stride=4").mask(6, 6) | ka.make_filter("local:window=1").mask(6, 6))
    assert (ka.make_filter("full") & causal).kind == "causal"
    assert (causal | "full").kind == "full"
    assert (causal & local).kind is None


def test_padding_and_cross():
    key_mask = torch.tensor([[True, True, False], [True, False, False]])
    pad = ka.filters.Padding(key_mask).mask(2, 3)
    assert pad.shape == (2, 1, 2, 3) and torch.equal(pad[:, 0, 0], key_mask)
    assert torch.equal(ka.filters.Padding.from_lengths(torch.tensor([2, 1]), 3).key_mask, key_mask)
    assert ka.make_filter("cross").mask(2, 3).all()
    with pytest.raises(ValueError, match="needs a key mask"):
        ka.make_filter("padding").mask(2, 3)


@pytest.mark.parametrize("kernel", ["exp", "rbf", "poly", "linear", "periodic"])
@pytest.mark.parametrize("name,params", CASES[1:])
def test_filtered_smoother_matches_loop(kernel, name, params):
    q, k, v = torch.randn(1, 2, 4, 5, dtype=torch.float64), torch.randn(1, 2, 6, 5, dtype=torch.float64), \
        torch.randn(1, 2, 6, 3, dtype=torch.float64)
    out = ka.attention(q, k, v, kernel=kernel, mask={"name": name, **params})
    ref = smoother_loop(q, k, v, lambda a, b: kernel_value(kernel, a, b), filter_keep(name, 4, 6, **params))
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)


def test_key_mask_excludes_padding():
    q, k, v = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 5, 4), torch.randn(2, 1, 5, 2)
    key_mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    out = ka.attention(q, k, v, key_mask=key_mask)
    torch.testing.assert_close(out[1], ka.attention(q[1:], k[1:, :, :2], v[1:, :, :2])[0])


def test_a_kept_mask_is_never_another_filters():
    """Masks of spec filters are kept per (class, repr, Tq, Tk, device): two instances of a user subclass with
    other parameters and the base class's repr must each get their own mask, as must two classes of one name."""
    from kernel_attention.filters import _grid

    class Band(ka.Filter):
        name = "band"

        def __init__(self, width):
            self.width = width

        def mask(self, tq, tk, device=None, key_mask=None):
            p, j = _grid(tq, tk, device)
            return (p - j).abs() <= self.width

    class Named(Band):
        def __repr__(self):
            return f"band(width={self.width})"

    class Diagonal(ka.Filter):
        name = "band"

        def mask(self, tq, tk, device=None, key_mask=None):
            return torch.eye(tq, tk, dtype=torch.bool, device=device)

    q, k, v = (torch.randn(1, 1, 6, 4) for _ in range(3))
    assert not Band(0).by_spec and Named(0).by_spec and Diagonal().by_spec
    for filters in ([Band(0), Band(5)], [Named(0), Named(5)], [Diagonal(), Band(5)], [Band(5), Diagonal()]):
        for filt in filters:
            want = smoother_loop(q, k, v, lambda a, b: kernel_value("exp", a, b),
                                 keep=filt.mask(6, 6).expand(1, 1, 6, 6))
            torch.testing.assert_close(ka.attention(q, k, v, mask=filt), want)


@pytest.mark.parametrize("spec", ["causal&&local:window=2", "causal|", "&causal", "causal | "])
def test_an_expression_with_an_empty_operand_says_how_to_write_one(spec):
    with pytest.raises(ValueError, match="has an empty operand: write filters joined by &"):
        ka.make_filter(spec)
