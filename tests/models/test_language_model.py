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
    assert seen.tolist() == [5] * 5
    first = model.attention_maps(torch.randint(0, 23, (1, 5)))  # no memory yet: the causal set, as in TXL
    assert (first[0][0, 0] > 0).sum(-1).tolist() == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="same_length=True needs mem_len >= 1"):
        tiny(mem_len=0, same_length=True)  # no window: every query would see no key
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


def test_adaptive_softmax_gives_log_probabilities_whose_nll_is_torchs_adaptive_loss():
    """With ``adaptive``, the logits are log p(w | h) of torch's AdaptiveLogSoftmaxWithLoss: normalised, and
    their cross-entropy on the targets equals the loss torch's module computes from the same hidden states."""
    torch.manual_seed(0)
    model = tiny(adaptive={"cutoffs": [5, 12], "div_value": 2.0}, tie_output=False)
    assert model.output is None and model.adaptive is not None
    tokens = torch.randint(0, 23, (2, 12))
    target = torch.randint(0, 23, (2, 12))
    logits, _ = model(tokens)
    assert logits.shape == (2, 12, 23)
    torch.testing.assert_close(logits.logsumexp(-1), torch.zeros(2, 12, dtype=logits.dtype))
    hidden = {}
    handle = model.final_norm.register_forward_hook(lambda mod, args, out: hidden.setdefault("h", out))
    model(tokens)
    handle.remove()
    expected = model.adaptive(hidden["h"].reshape(24, -1), target.reshape(-1)).loss
    nll = torch.nn.functional.cross_entropy(logits.reshape(24, -1), target.reshape(-1))
    torch.testing.assert_close(nll, expected)
    nll.backward()
    assert model.adaptive.head.weight.grad is not None and model.embed.weight.grad is not None


#: (adaptive, tie_output): the full soft-max tied to the embedding, torch's untied adaptive soft-max, and
#: Transformer-XL's tied to an adaptive input embedding (one table, and clusters of narrower tables)
OUTPUTS = [(None, True), ({"cutoffs": [5, 12], "div_value": 2.0}, False), ({"cutoffs": [5, 12]}, True),
           ({"cutoffs": [5, 12], "div_value": 2.0}, True)]
OUTPUT_IDS = ["full", "adaptive", "adaptive-tied", "adaptive-tied-div2"]


@pytest.mark.parametrize("adaptive, tie", OUTPUTS, ids=OUTPUT_IDS)
def test_bf16_autocast_on_the_cpu_gives_float32_nll_close_to_float32s(adaptive, tie):
    """Under CPU autocast the blocks run in bfloat16; the per-word NLL comes out in float32 (the adaptive
    soft-max is computed outside autocast: torch's module cannot mix the dtypes CPU autocast gives it)."""
    torch.manual_seed(2)
    model = tiny(adaptive=adaptive, tie_output=tie).float()
    tokens, y = torch.randint(0, 23, (2, 12)), torch.randint(0, 23, (2, 12))
    ref, _ = model(tokens, targets=y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        nll, _ = model(tokens, targets=y)
    assert nll.dtype == torch.float32
    torch.testing.assert_close(nll, ref, rtol=3e-2, atol=3e-2)
    nll.sum().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("adaptive, says", [
    ({}, "cutoffs must be"), ({"cutoffs": []}, "cutoffs must be"), ({"cutoffs": [12, 5]}, "cutoffs must be"),
    ({"cutoffs": [5, 23]}, "cutoffs must be"), ({"cutoffs": [5], "div": 2}, "model.adaptive must be"),
    ({"cutoffs": [5], "div_value": 0.5}, "model.adaptive must be")])
@pytest.mark.parametrize("tie", [False, True])
def test_adaptive_softmax_settings_are_checked(adaptive, says, tie):
    with pytest.raises(ValueError, match=says) as e:
        tiny(adaptive=adaptive, tie_output=tie)
    assert str(e.value).startswith("model.adaptive")


@pytest.mark.parametrize("adaptive, tie", OUTPUTS, ids=OUTPUT_IDS)
def test_targets_give_each_words_nll_as_the_logits_do(adaptive, tie):
    """``model(tokens, mems, targets=y)`` is -log p(y | context) per token, the same as the cross-entropy of the
    logits (the adaptive soft-max computes only the target's cluster), and carries the memory on alike."""
    torch.manual_seed(1)
    model = tiny(adaptive=adaptive, tie_output=tie)
    tokens, y = torch.randint(0, 23, (2, 12)), torch.randint(0, 23, (2, 12))
    logits, mems = model(tokens[:, :6])
    nll, mems_t = model(tokens[:, :6], targets=y[:, :6])
    expected = torch.nn.functional.cross_entropy(logits.reshape(12, -1), y[:, :6].reshape(-1), reduction="none")
    torch.testing.assert_close(nll, expected.view(2, 6))
    logits2, _ = model(tokens[:, 6:], mems)
    nll2, _ = model(tokens[:, 6:], mems_t, targets=y[:, 6:])
    torch.testing.assert_close(nll2, -logits2.log_softmax(-1).gather(-1, y[:, 6:, None])[..., 0])
