"""The Transformer block against Transformer Networks Eqs. 1-6 written out by hand."""

import math

import pytest
import torch
import torch.nn.functional as F

import kernel_attention as ka


def _mha_by_hand(attn, x, ctx=None, causal=False):
    """Eqs. 1-3: per-head softmax(<Q, K>/sqrt(k)) V, then the output projection, summed over heads."""
    ctx = x if ctx is None else ctx
    H, d = attn.n_heads, attn.d_head
    out = torch.zeros(x.shape[0], x.shape[1], H * d, dtype=x.dtype)
    for h in range(H):
        sl = slice(h * d, (h + 1) * d)
        Q = x @ attn.q_proj.weight[sl].t() + attn.q_proj.bias[sl]
        K = ctx @ attn.k_proj.weight[sl].t() + attn.k_proj.bias[sl]
        V = ctx @ attn.v_proj.weight[sl].t() + attn.v_proj.bias[sl]
        s = Q @ K.transpose(-1, -2) / math.sqrt(d)
        if causal:
            s = s.masked_fill(torch.triu(torch.ones_like(s, dtype=torch.bool), 1), float("-inf"))
        out[..., sl] = torch.softmax(s, -1) @ V
    return out @ attn.out_proj.weight.t() + attn.out_proj.bias


def _ffn(block, u):
    lin1, lin2 = block.ffn[0], block.ffn[3]
    return F.relu(u @ lin1.weight.t() + lin1.bias) @ lin2.weight.t() + lin2.bias  # Eq. 5


def test_post_ln_block_is_equations_1_to_6():
    block = ka.TransformerBlock(16, 4, 32, attention={"filter": "causal"}).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    u = F.layer_norm(x + _mha_by_hand(block.self_attn, x, causal=True), (16,), block.ln1.weight, block.ln1.bias)
    z = F.layer_norm(u + _ffn(block, u), (16,), block.ln2.weight, block.ln2.bias)
    torch.testing.assert_close(block(x), z)


def test_pre_ln_block():
    block = ka.TransformerBlock(16, 4, 32, norm="pre").double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    u = x + _mha_by_hand(block.self_attn, F.layer_norm(x, (16,), block.ln1.weight, block.ln1.bias))
    z = u + _ffn(block, F.layer_norm(u, (16,), block.ln2.weight, block.ln2.bias))
    torch.testing.assert_close(block(x), z)


def test_decoder_block_with_cross_attention():
    block = ka.TransformerBlock(16, 4, 32, attention={"filter": "causal"}, cross_attention={}).double()
    x, enc = torch.randn(2, 4, 16, dtype=torch.float64), torch.randn(2, 6, 16, dtype=torch.float64)
    ln = lambda t, m: F.layer_norm(t, (16,), m.weight, m.bias)  # noqa: E731
    u = ln(x + _mha_by_hand(block.self_attn, x, causal=True), block.ln1)
    u = ln(u + _mha_by_hand(block.cross_attn, u, enc), block.ln_cross)
    z = ln(u + _ffn(block, u), block.ln2)
    torch.testing.assert_close(block(x, context=enc), z)
    with pytest.raises(ValueError, match="context"):
        block(x)


def test_block_returns_weights_and_threads_positions_and_memory():
    block = ka.TransformerBlock(16, 4, 32, attention={"position": "xl", "filter": "memory"},
                               cross_attention={"position": "product"})
    x, mem, enc = torch.randn(2, 3, 16), torch.randn(2, 5, 16), torch.randn(2, 6, 16)
    y, w = block(x, memory=mem, context=enc, need_weights=True)
    assert y.shape == (2, 3, 16) and w["self"].shape == (2, 4, 3, 8) and w["cross"].shape == (2, 4, 3, 6)
    # Explicit positions equal the defaults (memory first, then the segment).
    y2 = block(x, pos=torch.arange(5, 8), memory=mem, memory_pos=torch.arange(5), context=enc,
               context_pos=torch.arange(6))
    block.eval()
    torch.testing.assert_close(block(x, memory=mem, context=enc),
                               block(x, pos=torch.arange(5, 8), memory=mem, memory_pos=torch.arange(5),
                                     context=enc, context_pos=torch.arange(6)))
    assert y2.shape == y.shape


def test_bad_block_options():
    with pytest.raises(ValueError, match="norm"):
        ka.TransformerBlock(8, 2, 16, norm="middle")
    with pytest.raises(ValueError, match="activation"):
        ka.TransformerBlock(8, 2, 16, activation="swish")
