"""Propositions of Transformer Dissection as tests (Section 3.3)."""

import pytest
import torch

import kernel_attention as ka


@pytest.mark.parametrize("kernel", ["exp", "rbf", "poly", "linear", "periodic"])
def test_prop2_full_filter_is_permutation_equivariant(kernel):
    """Prop. 2: with M = S and no positions, permuting the inputs permutes the outputs."""
    layer = ka.KernelAttention(8, 2, kernel=kernel, position="none", filter="full").double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    perm = torch.randperm(6)
    torch.testing.assert_close(layer(x[:, perm]), layer(x)[:, perm])
    # Attention(x_q; S^pi) = Attention(x_q; S): permuting only the keys changes nothing.
    q = torch.randn(2, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(q, x[:, perm]), layer(q, x))


@pytest.mark.parametrize("kernel", ["exp", "rbf", "poly", "periodic"])
@pytest.mark.parametrize("filt", ["causal", "strided:stride=2", "local:window=1"])
def test_prop1_prop3_filtered_attention_is_not_permutation_equivariant(kernel, filt):
    """Props. 1 and 3: when M(x_q, S) leaves some key out, a permutation that brings it in changes
    the output -- decoder self-attention (causal) is order-aware even without positions."""
    layer = ka.KernelAttention(8, 2, kernel=kernel, position="none", filter=filt).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    perm = torch.tensor([2, 0, 5, 1, 4, 3])  # not a symmetry of any of these filters (reversal is one of local's)
    assert not torch.allclose(layer(x[:, perm]), layer(x)[:, perm], atol=1e-6)


def test_positions_break_equivariance_of_full_filter():
    """With positions the full filter is no longer permutation equivariant (the reason PE exists)."""
    for position in ["absolute", "shaw", "xl", "product"]:
        layer = ka.KernelAttention(8, 2, position=position).double()
        x = torch.randn(1, 6, 8, dtype=torch.float64)
        perm = torch.flip(torch.arange(6), [0])
        assert not torch.allclose(layer(x[:, perm]), layer(x)[:, perm], atol=1e-6), position


def test_decoder_output_depends_only_on_prefix():
    """Causal filter: output i is a function of inputs 0..i only."""
    layer = ka.KernelAttention(8, 2, kernel="rbf", position="xl", filter="causal")
    x = torch.randn(1, 6, 8)
    y = x.clone()
    y[:, 4:] = torch.randn(1, 2, 8)
    torch.testing.assert_close(layer(x)[:, :4], layer(y)[:, :4])
