"""LanguageModel: Transformer-XL memory plumbing checked against the concatenated context."""

import pytest
import torch

from kernel_attention.models import LanguageModel
from kernel_attention.registry import SpecError


def tiny(**kw):
    cfg = dict(d_model=32, n_heads=4, d_ff=64, n_layers=3, dropout=0.0, mem_len=6)
    cfg.update(kw)
    return LanguageModel(23, **cfg).double().eval()


@pytest.mark.parametrize("attention", [
    {"position": "xl"},                                   # TXL: relative product kernel, shared u/v
    {"position": "xl", "kernel": "rbf"},
    {"position": "product", "symmetric": True},           # Eq. 9 with window positions
    {"position": "shaw", "value_position": "relative"},
    {"position": "none"},
])
def test_segment_with_memory_equals_concatenated_context(attention):
    torch.manual_seed(0)
    model = tiny(attention=attention)
    tokens = torch.randint(0, 23, (2, 12))
    full, _ = model(tokens)                               # one pass over 12 tokens, no memory
    first, mems = model(tokens[:, :6])
    second, mems2 = model(tokens[:, 6:], mems)
    assert len(mems) == 3 and mems[0].shape == (2, 6, 32) and not mems[0].requires_grad
    torch.testing.assert_close(first, full[:, :6])
    torch.testing.assert_close(second, full[:, 6:])
    # memory holds each layer's *input*: layer 0's is the embedding output of the last 6 tokens
    torch.testing.assert_close(mems2[0], model.embed(tokens[:, 6:]))


def test_memory_keeps_the_last_mem_len_steps_of_each_layer_input():
    torch.manual_seed(1)
    model = tiny(mem_len=5)
    a, b = torch.randint(0, 23, (1, 4)), torch.randint(0, 23, (1, 4))
    _, m1 = model(a)
    _, m2 = model(b, m1)
    assert [m.shape[1] for m in m2] == [5, 5, 5]
    # layer 0's input is the embedding: its memory is the embedding of the last 5 tokens [a_3, b_0..b_3]
    torch.testing.assert_close(m2[0], model.embed(torch.cat([a, b], 1))[:, -5:])
    # deeper memories are the layer inputs of the concatenated context (full memory: same as no segmentation)
    full = tiny(mem_len=8)
    full.load_state_dict(model.state_dict())
    _, mf = full(torch.cat([a, b], 1))
    for got, want in zip(m2, mf):
        torch.testing.assert_close(got, want[:, -5:])


def test_xl_biases_shared_by_all_layers_and_clamp_len():
    model = tiny(clamp_len=3)
    us = {id(layer.self_attn.position.u) for layer in model.layers}
    assert us == {id(model.u)}
    assert all(layer.self_attn.position.clamp_len == 3 for layer in model.layers)
    n_u = sum(p.numel() for n, p in model.named_parameters() if n.endswith(".u") or n == "u")
    assert n_u == model.u.numel()


def test_same_length_at_evaluation_gives_every_query_the_same_number_of_keys():
    torch.manual_seed(2)
    model = tiny(mem_len=5, same_length=True)
    _, mems = model(torch.randint(0, 23, (1, 5)))
    weights = model.attention_maps(torch.randint(0, 23, (1, 5)), mems)
    seen = (weights[0][0, 0] > 0).sum(-1)                 # keys per query, head 0
    assert seen.tolist() == [5] * 5 or seen.unique().numel() == 1
    model.train()
    out = model(torch.randint(0, 23, (1, 5)), mems, need_weights=True)
    seen_train = (out[2][0][0, 0] > 0).sum(-1)            # training: causal + full memory
    assert seen_train.tolist() == [6, 7, 8, 9, 10]


def test_causal_no_future_leak():
    model = tiny(mem_len=0, attention={"position": "product"})
    x = torch.randint(0, 23, (1, 8))
    y = x.clone()
    y[0, 5:] = (y[0, 5:] + 1) % 23
    a, _ = model(x)
    b, _ = model(y)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_pe_at_input_baseline_and_bad_configs():
    model = tiny(attention={"position": "none"}, pe_at_input=True)
    out, _ = model(torch.randint(0, 23, (2, 5)))
    assert out.shape == (2, 5, 23)
    with pytest.raises(SpecError, match="needs position='shaw'"):
        tiny(attention={"position": "xl", "value_position": "relative"})
    with pytest.raises(SpecError, match="unknown attention option.*kernal"):
        tiny(attention={"kernal": "exp"})
    with pytest.raises(SpecError, match="unknown kernel"):
        tiny(attention={"kernel": "gaussian"})
