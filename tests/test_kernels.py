"""Each kernel against its scalar formula, PSD of the symmetric forms, and SDPA/MHA equivalence."""

import math

import pytest
import torch

import kernel_attention as ka
from kernel_attention.reference import kernel_value, smoother_loop

KERNELS = ["exp", "rbf", "poly", "linear", "periodic", "poly:degree=3", "exp:scale=0.3",
           "periodic:period=2.0,lengthscale=0.7"]


def _qkv(B=2, H=2, Tq=4, Tk=5, D=6, Dv=3):
    return (torch.randn(B, H, Tq, D, dtype=torch.float64), torch.randn(B, H, Tk, D, dtype=torch.float64),
            torch.randn(B, H, Tk, Dv, dtype=torch.float64))


@pytest.mark.parametrize("spec", KERNELS)
def test_kernel_matrix_matches_formula(spec):
    kern = ka.make_kernel(spec)
    q, k, _ = _qkv()
    mat = kern.log_kernel(q, k).exp() if kern.positive else kern.kernel(q, k)
    name, params = ka.KERNELS.validate(spec)
    params = {a: b for a, b in params.items() if b is not None}
    for b in range(2):
        for h in range(2):
            for i in range(4):
                for j in range(5):
                    ref = kernel_value(name, q[b, h, i], k[b, h, j], **params)
                    assert torch.allclose(mat[b, h, i, j], ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("spec", KERNELS)
def test_smoother_matches_loop(spec):
    q, k, v = _qkv()
    name, params = ka.KERNELS.validate(spec)
    params = {a: b for a, b in params.items() if b is not None}
    out = ka.attention(q, k, v, kernel=spec)
    ref = smoother_loop(q, k, v, lambda a, b: kernel_value(name, a, b, **params))
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("spec", ["exp", "rbf", "poly", "poly:degree=3", "linear", "periodic"])
def test_symmetric_kernels_are_psd(spec):
    """With one shared projection (W_q = W_k) every kernel's Gram matrix is PSD (Table 2's 'sym')."""
    kern = ka.make_kernel(spec)
    assert kern.psd
    x = torch.randn(1, 1, 12, 4, dtype=torch.float64)
    gram = kern.log_kernel(x, x).exp() if kern.positive else kern.kernel(x, x)
    assert torch.allclose(gram, gram.transpose(-1, -2))
    eig = torch.linalg.eigvalsh(gram[0, 0])
    assert eig.min() > -1e-9 * eig.abs().max()


def test_asymmetric_exp_is_not_symmetric():
    """Sanity of the PSD test: W_q != W_k gives a non-symmetric kernel matrix."""
    layer = ka.KernelAttention(8, 1, kernel="exp").double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    q, k, _, _ = layer.project(x, x, *[ka.positions.encodings.as_positions(torch.arange(6), 1)] * 2)
    gram = layer.kernel.log_kernel(q, k)
    assert not torch.allclose(gram, gram.transpose(-1, -2))


def test_symmetric_module_shares_projection():
    sym = ka.KernelAttention(8, 2, symmetric=True)
    asym = ka.KernelAttention(8, 2)
    assert sym.k_proj is sym.q_proj
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(asym) - n(sym) == 8 * 8 + 8


def test_a_symmetric_layer_refuses_an_asymmetric_layers_weights():
    """Its q_proj and k_proj are one module: of two different matrices one would be loaded without a word."""
    sym = ka.KernelAttention(8, 2, symmetric=True)
    with pytest.raises(RuntimeError, match=r"symmetric=True shares W_q = W_k.*q_proj\.weight and k_proj\.weight"):
        sym.load_state_dict(ka.KernelAttention(8, 2).state_dict())
    twin = ka.KernelAttention(8, 2, symmetric=True)
    twin.load_state_dict(sym.state_dict())        # a symmetric layer's: one matrix under both names
    assert torch.equal(twin.k_proj.weight, sym.q_proj.weight)
    block = ka.TransformerBlock(8, 2, 16, attention={"symmetric": True})
    with pytest.raises(RuntimeError, match=r"self_attn\.q_proj\.weight"):  # named with its prefix in a model
        block.load_state_dict(ka.TransformerBlock(8, 2, 16).state_dict())


def test_exp_equals_sdpa_with_masks():
    q, k, v = (t.float() for t in _qkv(Tq=5, Tk=5))
    F = torch.nn.functional
    torch.testing.assert_close(ka.attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(ka.attention(q, k, v, mask="causal"), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch.testing.assert_close(ka.attention(q, k, v, is_causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    m = torch.rand(2, 1, 5, 5) > 0.3
    m[..., 0] = True  # SDPA gives NaN on empty rows; compare on rows that have keys
    torch.testing.assert_close(ka.attention(q, k, v, mask=m), F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    fm = torch.randn(2, 2, 5, 5)
    torch.testing.assert_close(ka.attention(q, k, v, mask=fm), F.scaled_dot_product_attention(q, k, v, attn_mask=fm))


@pytest.mark.parametrize("shape", [(2, 1, 1, 7), (1, 7), (5, 1), (2, 1, 5, 1), (1, 1), (7,)])
@pytest.mark.parametrize("backend", ["auto", "dense", "blockwise"])
def test_a_bool_mask_of_one_row_or_column_broadcasts_as_in_sdpa(shape, backend):
    """A key-padding mask (B, 1, 1, Tk), a per-query mask (Tq, 1): PyTorch's attention broadcasts them; a query
    with no key left gives zeros (where SDPA gives NaN)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    m = torch.rand(shape) > 0.4
    m.view(-1)[:2] = torch.tensor([True, False])[: m.numel()]
    full = m.expand(2, 2, 5, 7)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=full)
    ref = ref.nan_to_num() * full.any(-1, keepdim=True)
    torch.testing.assert_close(ka.attention(q, k, v, mask=m, backend=backend), ref)


@pytest.mark.parametrize("backend", ["auto", "dense"])
def test_scale_is_sdpas_scale_with_gradients(backend):
    q, k, v = (t.requires_grad_() for t in _qkv(Tq=5, Tk=5))
    out = ka.attention(q, k, v, mask="causal", scale=0.3, backend=backend)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v)))


def test_scale_sets_the_rbf_exponent_and_is_refused_where_it_has_no_meaning():
    q, k, v = _qkv()
    ref = smoother_loop(q, k, v, lambda a, b: kernel_value("rbf", a, b, scale=0.3))
    torch.testing.assert_close(ka.attention(q, k, v, kernel="rbf", scale=0.3), ref, rtol=1e-9, atol=1e-10)
    assert ka.explain(q, k, v, kernel="rbf", scale=0.3).name == ka.explain(q, k, v, kernel="rbf:scale=0.3").name
    with pytest.raises(ka.SpecError, match="kernel 'poly' has no scale; scale= applies to exp, rbf"):
        ka.attention(q, k, v, kernel="poly", scale=0.3)
    with pytest.raises(ka.SpecError, match="scale=0.3 and the kernel spec's scale=0.2 disagree"):
        ka.attention(q, k, v, kernel="exp:scale=0.2", scale=0.3)
    with pytest.raises(ValueError, match=r"a kernel object takes its scale when built"):
        ka.attention(q, k, v, kernel=ka.make_kernel("exp"), scale=0.3)


def test_exp_module_equals_multihead_attention():
    torch.manual_seed(1)
    d, H, T = 16, 4, 7
    mha = torch.nn.MultiheadAttention(d, H, batch_first=True)
    ours = ka.KernelAttention(d, H, kernel="exp", filter="causal")
    w = mha.in_proj_weight.detach()
    bq = mha.in_proj_bias.detach()
    with torch.no_grad():
        for i, proj in enumerate([ours.q_proj, ours.k_proj, ours.v_proj]):
            proj.weight.copy_(w[i * d:(i + 1) * d]); proj.bias.copy_(bq[i * d:(i + 1) * d])
        ours.out_proj.weight.copy_(mha.out_proj.weight); ours.out_proj.bias.copy_(mha.out_proj.bias)
    x = torch.randn(3, T, d)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)  # MHA: True = not allowed
    ref, ref_w = mha(x, x, x, attn_mask=causal, average_attn_weights=False)
    out, weights = ours(x, need_weights=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)


def test_rbf_differs_from_exp_only_by_key_norm():
    """RBF logit = exp logit·2 - ||k||²/sqrt(d) (+ a row constant): a fact the sdpa and blockwise backends use."""
    q, k, v = _qkv()
    d = q.shape[-1]
    bias = -(k ** 2).sum(-1)[:, :, None, :] / math.sqrt(d)
    ref = ka.attention(q, k, v, kernel=f"exp:scale={2 / math.sqrt(d)}", bias=bias)
    torch.testing.assert_close(ka.attention(q, k, v, kernel="rbf"), ref)


def test_periodic_small_distance_matches_rbf():
    """Default period makes periodic agree with rbf to second order near a = b."""
    a = torch.randn(1, 1, 1, 16, dtype=torch.float64)
    b = a + 1e-3 * torch.randn_like(a)
    lp = ka.make_kernel("periodic").log_kernel(a, b)
    lr = ka.make_kernel("rbf").log_kernel(a, b)
    assert torch.allclose(lp, lr, rtol=1e-4)


def test_sdpa_layout_says_what_sdpa_form_returns():
    """The backends read ``sdpa_layout`` instead of computing ``sdpa_form``: for every registered kernel
    and both key-bias modes they must agree (None / "bias" / "features")."""
    from kernel_attention.kernels import KERNELS, make_kernel
    from kernel_attention.kernels.capabilities import sdpa_form, sdpa_layout

    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8)
    for name in KERNELS.names():
        kern = make_kernel(name, n_heads=2, d_head=8)
        for key_bias in ("features", "mask"):
            form = sdpa_form(kern, q, k, key_bias=key_bias)
            expected = None if form is None else ("bias" if form.key_bias is not None else "features")
            assert sdpa_layout(kern, key_bias) == expected, (name, key_bias)
    assert {n for n in KERNELS.names() if sdpa_layout(make_kernel(n, n_heads=2, d_head=8)) is not None} == {
        "exp", "rbf", "periodic"}


def test_a_layers_repr_names_its_settings():
    text = repr(ka.KernelAttention(16, 4, kv_heads=2, filter="causal&local:window=4", symmetric=False, dropout=0.1))
    assert "d_model=16, n_heads=4, d_head=4, kv_heads=2, filter=(causal & local(window=4))" in text
    assert "dropout=0.1" in text and "symmetric" not in text and "(kernel): ExpKernel" in text
