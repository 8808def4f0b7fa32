"""Grouped-query attention (``enable_gqa``): against PyTorch's fused attention with its own ``enable_gqa``, and
for kernels and positions SDPA cannot run, against the same call with k and v repeated by hand; gradients
included."""

import pytest
import torch
import torch.nn.functional as F

import kernel_attention as ka


def _qkv(h=8, hkv=2, tq=7, tk=9, d=8, dv=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, h, tq, d), (2, hkv, tk, d), (2, hkv, tk, dv)]
    return [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes]


def _grads(out, *xs):
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    return torch.autograd.grad((out * w).sum(), xs)


@pytest.mark.parametrize("causal", [False, True])
def test_exp_matches_pytorch_sdpa_with_enable_gqa(causal):
    q, k, v = _qkv()
    ours = ka.attention(q, k, v, is_causal=causal, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True,
                                         attn_mask=torch.ones(7, 9, dtype=torch.bool).tril(2) if causal else None)
    torch.testing.assert_close(ours, ref)
    for a, b in zip(_grads(ours, q, k, v), _grads(ref, q, k, v)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kernel,mask", [("rbf", "causal"), ("poly", None), ("periodic", "local:window=3")])
def test_any_kernel_equals_the_heads_repeated_by_hand(kernel, mask):
    q, k, v = _qkv(h=6, hkv=3)
    ours = ka.attention(q, k, v, kernel=kernel, mask=mask, enable_gqa=True)
    ref = ka.attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), kernel=kernel, mask=mask)
    assert ours.shape == (2, 6, 7, 5)
    torch.testing.assert_close(ours, ref)
    for a, b in zip(_grads(ours, q, k, v), _grads(ref, q, k, v)):
        torch.testing.assert_close(a, b)


def test_explain_takes_it_and_bad_head_counts_are_named():
    q, k, v = _qkv()
    assert ka.explain(q, k, v, enable_gqa=True).name == ka.explain(q, k.repeat_interleave(4, 1),
                                                                   v.repeat_interleave(4, 1)).name
    assert "on the grouped key/value heads" in ka.explain(q, k, v, enable_gqa=True).reasons["sdpa"]
    with pytest.raises(ValueError, match="pass enable_gqa=True for grouped-query attention"):
        ka.attention(q, k, v)
    q3, k3, v3 = _qkv(h=8, hkv=3)
    with pytest.raises(ValueError, match="enable_gqa needs k and v with the same number of heads H_kv, a divisor"):
        ka.attention(q3, k3, v3, enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa needs"):
        ka.attention(q, k, v[:, :1], enable_gqa=True)


def _repeated(state: dict, name: str, groups: int, d_head: int) -> torch.Tensor:
    """A grouped projection's weight or bias with each key/value head's rows repeated ``groups`` times."""
    w = state[name]
    return w.reshape(-1, d_head, *w.shape[1:]).repeat_interleave(groups, dim=0).reshape(-1, *w.shape[1:])


@pytest.mark.parametrize("position,filt", [("xl", "causal"), ("shaw", "full"), ("product", "local:window=3")])
def test_the_module_with_kv_heads_equals_full_heads_with_the_weights_repeated(position, filt):
    torch.manual_seed(0)
    grouped = ka.KernelAttention(16, 4, kv_heads=2, kernel="rbf", position=position, filter=filt).double()
    full = ka.KernelAttention(16, 4, kernel="rbf", position=position, filter=filt).double()
    state = grouped.state_dict()
    for name in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"):
        state[name] = _repeated(state, name, 2, 4)
    full.load_state_dict(state)
    assert sum(p.numel() for p in grouped.parameters()) == sum(p.numel() for p in full.parameters()) - 2 * 2 * 4 * 17
    x1 = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    y1, y2 = grouped(x1), full(x2)
    torch.testing.assert_close(y1, y2)
    torch.testing.assert_close(*(_grads(y, x)[0] for y, x in ((y1, x1), (y2, x2))))


def test_kv_heads_must_divide_the_heads_and_cannot_be_symmetric():
    with pytest.raises(ka.SpecError, match="kv_heads must be a divisor of n_heads=4"):
        ka.KernelAttention(16, 4, kv_heads=3)
    with pytest.raises(ka.SpecError, match="symmetric=True shares W_q and W_k"):
        ka.KernelAttention(16, 4, kv_heads=2, symmetric=True)
    block = ka.TransformerBlock(16, 4, 32, attention=dict(kernel="exp", kv_heads=1))  # one key/value head (MQA)
    assert block.self_attn.k_proj.out_features == 4 and block(torch.randn(1, 5, 16)).shape == (1, 5, 16)


@pytest.fixture
def sdpa_calls(monkeypatch):
    """The (k heads, enable_gqa) of every fused-attention call the ``sdpa`` backend makes."""
    from kernel_attention.backends import sdpa

    calls, fused = [], F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        calls.append((k.shape[1], kwargs.get("enable_gqa", False)))
        return fused(q, k, v, *args, **kwargs)

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("kernel,mask,padded", [("exp", "causal", False), ("rbf", None, True),
                                                ("periodic", None, False)])
def test_sdpa_takes_the_grouped_heads_without_repeating_them(sdpa_calls, kernel, mask, padded):
    """One fused call on H_kv key/value heads with ``enable_gqa``, equal to dense on the heads repeated."""
    q, k, v = _qkv(h=6, hkv=2, tq=9, tk=9)
    key_mask = torch.tensor([[True] * 9, [True] * 5 + [False] * 4]) if padded else None
    ours = ka.attention(q, k, v, kernel=kernel, mask=mask, key_mask=key_mask, enable_gqa=True, backend="sdpa")
    assert sdpa_calls == [(2, True)]
    ref = ka.attention(q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), kernel=kernel, mask=mask,
                       key_mask=key_mask, backend="dense")
    torch.testing.assert_close(ours, ref)
    for a, b in zip(_grads(ours, q, k, v), _grads(ref, q, k, v)):
        torch.testing.assert_close(a, b)


def test_the_module_runs_grouped_on_sdpa_and_repeats_for_per_head_positional_features(sdpa_calls):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    ka.KernelAttention(16, 4, kv_heads=2, kernel="exp", filter="causal")(x)
    assert sdpa_calls == [(2, True)]
    sdpa_calls.clear()
    # product's key-side positional features are per query head: concatenated to k, they need all H heads
    ka.KernelAttention(16, 4, kv_heads=2, kernel="exp", position="product", backend="sdpa")(x)
    assert sdpa_calls == [(4, False)]
