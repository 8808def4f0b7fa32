"""Bad input gets a clear error; empty filtered sets give zeros, not NaN; linear-kernel normaliser."""

import pytest
import torch

import kernel_attention as ka
from kernel_attention.smoother import DIRECT_EPS, normalise_direct


def _qkv():
    return torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 6)


def test_shape_errors_name_the_problem():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="4 dims"):
        ka.attention(q[0], k, v)
    with pytest.raises(ValueError, match="same feature size D"):
        ka.attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="same number of keys"):
        ka.attention(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match=r"share \(B, H\)"):
        ka.attention(q, k[:1], v[:1])
    with pytest.raises(TypeError, match="dtype"):
        ka.attention(q, k.double(), v)
    with pytest.raises(TypeError, match="floating"):
        ka.attention(q.long(), k, v)
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        ka.attention(q.tolist(), k, v)
    with pytest.raises(TypeError, match="v must be a torch.Tensor, got ndarray"):
        ka.attention(q, k, v.numpy())


@pytest.mark.parametrize("bad,match", [({"dropout": -0.1}, r"dropout .* \[0, 1\), got -0.1"),
                                       ({"dropout": 1.0}, r"\[0, 1\), got 1.0"),
                                       ({"axes": 0}, "axes must be an integer >= 1, got 0"),
                                       ({"n_heads": 0}, "n_heads must be an integer >= 1, got 0"),
                                       ({"d_model": 8.0}, "d_model must be an integer >= 1, got 8.0"),
                                       ({"d_head": 0}, "d_head must be an integer >= 1, got 0"),
                                       ({"d_head": -1}, "d_head must be an integer >= 1, got -1"),
                                       ({"kdim": 0}, "kdim must be an integer >= 1, got 0"),
                                       ({"symmetric": "maybe"}, "symmetric: bool: cannot read 'maybe'"),
                                       ({"bias": 2}, "bias: bool got 2"),
                                       ({"backend": "fastest"}, "unknown backend 'fastest'; accepted: .*; or 'auto'"),
                                       ({"backend": "blockwise:block=5"}, "block=5 must satisfy: >= 1024")])
def test_the_layer_refuses_bad_sizes_when_it_is_built(bad, match):
    with pytest.raises(ValueError, match=match):
        ka.KernelAttention(**{"d_model": 8, "n_heads": 2, **bad})


@pytest.mark.parametrize("build, match", [
    (lambda: ka.GraphAttention(8, 4, heads=0), "GraphAttention: heads must be an integer >= 1, got 0"),
    (lambda: ka.GraphAttention(8, 4, dropout=1.5), r"GraphAttention: dropout must be in \[0, 1\), got 1.5"),
    (lambda: ka.GraphAttention(8, 4, concat="maybe"), "concat: bool: cannot read 'maybe'"),
    (lambda: ka.TransformerBlock(8, 2, 0), "TransformerBlock: d_ff must be an integer >= 1, got 0"),
    (lambda: ka.TransformerBlock(8, 2, 16, dropout=-0.5), r"TransformerBlock: dropout must be in \[0, 1\)"),
])
def test_graph_attention_and_the_block_refuse_bad_arguments_when_built(build, match):
    with pytest.raises(ValueError, match=match):
        build()
    assert not ka.GraphAttention(8, 4, concat="false").concat


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_graph_attention_names_nan_or_inf_features_as_the_attention_layer_does(bad):
    h = torch.randn(4, 5)
    h[2, 1] = bad
    with pytest.raises(ValueError, match="h contains NaN or inf values"):
        ka.GraphAttention(5, 3, heads=2)(h, torch.tensor([[0, 1], [1, 2]]))
    with ka.validation(False):  # the same switch as attention()'s
        assert ka.GraphAttention(5, 3, heads=2)(h, torch.tensor([[0, 1], [1, 2]])).shape == (4, 6)


@pytest.mark.parametrize("options, match", [
    ({"kernal": "rbf"}, r"TransformerBlock: attention: unknown attention option\(s\) kernal; accepted: d_head, "),
    ("rbf", r"TransformerBlock: attention: the attention config must be a mapping of KernelAttention arguments \("),
])
def test_the_block_names_an_attention_option_the_layer_does_not_take(options, match):
    with pytest.raises(ValueError, match=match):
        ka.TransformerBlock(8, 2, 16, attention=options)
    with pytest.raises(ValueError, match=match.replace("attention", "cross_attention", 1)):
        ka.TransformerBlock(8, 2, 16, cross_attention=options)


def test_a_mask_filter_of_integers_and_a_validation_of_1_are_refused_saying_what_is_taken():
    with pytest.raises(TypeError, match=r"needs a bool mask \(True = the key takes part\), got torch.int64; a float "
                                        r"mask \(added to log k\) goes to attention\(\.\.\., mask=\)"):
        ka.KernelAttention(8, 2, filter=torch.ones(4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="validation takes True, False or 'auto', got 1"):
        with ka.validation(1):
            pass


def test_the_layer_reads_booleans_as_the_configs_write_them():
    assert not ka.KernelAttention(8, 2, symmetric="false").symmetric
    layer = ka.KernelAttention(8, 2, symmetric="true", bias="no")
    assert layer.k_proj is layer.q_proj and layer.q_proj.bias is None


def test_the_layer_names_the_widths_it_takes():
    layer = ka.KernelAttention(8, 2, kdim=6)
    with pytest.raises(ValueError, match=r"query \(B, Tq, 7\).*d_model=8"):
        layer(torch.randn(1, 5, 7), torch.randn(1, 4, 6))
    with pytest.raises(ValueError, match=r"key \(B, Tk, 8\).*kdim=6"):
        layer(torch.randn(1, 5, 8), torch.randn(1, 4, 8))
    assert layer(torch.randn(1, 5, 8), torch.randn(1, 4, 6)).shape == (1, 5, 8)
    with pytest.raises(TypeError, match="floating-point features, got torch.int64"):
        layer(torch.ones(1, 5, 8, dtype=torch.long), torch.randn(1, 4, 6))
    with pytest.raises(ValueError, match=r"memory must be \(B=1, M, 6\).*got \(2, 3, 6\)"):
        layer(torch.randn(1, 5, 8), torch.randn(1, 4, 6), memory=torch.randn(2, 3, 6))


def test_masks_that_do_not_fit():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="does not broadcast"):
        ka.attention(q, k, v, mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        ka.attention(q, k, v, mask=torch.ones(3, 2, 3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        ka.attention(q, k, v, mask=torch.ones(2, 2, 7, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"does not broadcast to \(\.\.\., Tq=3, Tk=5\)"):
        ka.attention(q, k, v, mask=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_mask"):
        ka.attention(q, k, v, key_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        ka.attention(q, k, v, mask=torch.ones(3, 5, dtype=torch.long))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_inf_inputs_are_refused(bad):
    q, k, v = _qkv()
    q[0, 0, 0, 0] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        ka.attention(q, k, v)
    with ka.validation(False):  # the check can be turned off for speed
        ka.attention(q, k, v)


def test_unknown_names_list_what_is_accepted():
    q, k, v = _qkv()
    with pytest.raises(ka.SpecError, match="unknown kernel .gaussian.; accepted: exp, .*linear, .*periodic, poly, rbf"):
        ka.attention(q, k, v, kernel="gaussian")
    with pytest.raises(ka.SpecError, match="unknown filter 'causl'"):
        ka.attention(q, k, v, mask="causl")
    with pytest.raises(ka.SpecError, match="unknown position"):
        ka.KernelAttention(8, 2, position="rotary")
    with pytest.raises(ka.SpecError, match="has no parameter window"):
        ka.make_filter("strided:window=3")
    with pytest.raises(ka.SpecError, match="needs parameter stride"):
        ka.make_filter("strided")
    with pytest.raises(ka.SpecError, match="value_position"):
        ka.KernelAttention(8, 2, value_position="maybe")
    with pytest.raises(ka.SpecError, match="use position='shaw'"):
        ka.KernelAttention(8, 2, position="product", value_position="relative")
    with pytest.raises(ValueError, match="not divisible"):
        ka.KernelAttention(10, 3)


@pytest.mark.parametrize("kernel", ["exp", "rbf", "poly", "linear", "periodic"])
@pytest.mark.parametrize("position", ["none", "shaw", "xl", "product"])
def test_empty_filtered_set_gives_zeros_and_finite_gradients(kernel, position):
    layer = ka.KernelAttention(8, 2, kernel=kernel, position=position, bias=False)
    x = torch.randn(2, 4, 8, requires_grad=True)
    keep = torch.ones(4, 4, dtype=torch.bool)
    keep[1] = False  # query 1 sees nothing
    y, w = layer(x, mask=keep, need_weights=True)
    assert torch.isfinite(y).all() and torch.isfinite(w).all()
    assert (w[:, :, 1] == 0).all()
    assert torch.allclose(y[:, 1], torch.zeros_like(y[:, 1]))  # no bias: zero output
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


def test_empty_row_functional_zero_gradient():
    q = torch.randn(1, 1, 2, 4, requires_grad=True)
    k, v = torch.randn(1, 1, 3, 4, requires_grad=True), torch.randn(1, 1, 3, 2, requires_grad=True)
    keep = torch.tensor([[True, True, False], [False, False, False]])
    out = ka.attention(q, k, v, mask=keep)
    assert (out[0, 0, 1] == 0).all()
    out.sum().backward()
    assert (q.grad[0, 0, 1] == 0).all()
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


def test_padding_only_keys_give_zeros():
    q, k, v = _qkv()
    key_mask = torch.zeros(2, 5, dtype=torch.bool)
    key_mask[0] = True
    out = ka.attention(q, k, v, key_mask=key_mask)
    assert (out[1] == 0).all() and torch.isfinite(out).all()


def test_linear_kernel_negative_normaliser_flips_signs():
    """Documented behaviour: k / sum k with no positivity guard; a negative sum makes the weights
    change sign (they still sum to 1) -- the kernel-smoother assumption the linear kernel breaks."""
    k = torch.tensor([[[[1.0, -3.0, 1.0]]]])
    w = normalise_direct(k, None)
    torch.testing.assert_close(w, torch.tensor([[[[-1.0, 3.0, -1.0]]]]))
    assert torch.isclose(w.sum(), torch.tensor(1.0))


def test_linear_kernel_zero_normaliser_is_guarded_not_nan():
    """|sum k| < eps is replaced by eps (sign kept): huge but finite weights, never NaN or inf."""
    k = torch.tensor([[[[1.0, -1.0], [0.0, 0.0]]]])
    w = normalise_direct(k, None)
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w[0, 0, 0], torch.tensor([1 / DIRECT_EPS, -1 / DIRECT_EPS]))
    assert (w[0, 0, 1] == 0).all()
    q = torch.tensor([[[[1.0, 0.0]]]])
    keys = torch.tensor([[[[1.0, 0.0], [-1.0, 0.0]]]])
    out = ka.attention(q, keys, torch.randn(1, 1, 2, 3), kernel="linear")
    assert torch.isfinite(out).all()


def test_linear_kernel_weights_can_be_negative_but_poly_even_cannot():
    q, k, v = torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 2)
    _, w_lin = ka.attention(q, k, v, kernel="linear", need_weights=True)
    _, w_poly = ka.attention(q, k, v, kernel="poly", need_weights=True)
    assert (w_lin < 0).any()
    assert (w_poly >= 0).all()
    torch.testing.assert_close(w_poly.sum(-1), torch.ones(1, 1, 6))


def test_amortised_implicit_kernel_refuses_a_filter_it_would_leak_through():
    """ikan's q(z|h) pools q, k over all positions: under a causal filter that leaks future tokens."""
    for kernel in ("ikan", "ikan:amortized=keys"):  # pooling the keys alone leaks them as well
        with pytest.raises(ka.SpecError, match="amortized=false"):
            ka.KernelAttention(8, 2, kernel=kernel, filter="causal")
    ka.KernelAttention(8, 2, kernel="ikan:amortized=false", filter="causal")
    with pytest.raises(ka.SpecError, match=r"would see keys the filter hides; use 'ikan:amortized=false'"):
        ka.KernelAttention(8, 2, kernel="ikan", filter="local:window=1")   # hidden keys, not future ones
    for wide in ("local:window=7", "local:window=300", "strided:stride=100"):  # hiding none of 8 positions
        with pytest.raises(ka.SpecError, match="would see keys the filter hides"):
            ka.KernelAttention(8, 2, kernel="ikan", filter=wide)
    ka.KernelAttention(8, 2, kernel="ikan", filter="local:window=2|full")
    with pytest.raises(ka.SpecError, match=r"amortized=.*one of \[True, False, 'keys'\]"):
        ka.KernelAttention(8, 2, kernel="ikan:amortized=queries")
    ka.KernelAttention(8, 2, kernel="ikan", filter="padding")
    ka.KernelAttention(8, 2, kernel="ikan-direct", filter="causal")  # no amortisation, nothing leaks


def test_broadcast_check_agrees_with_torch():
    from kernel_attention.inputs import _broadcasts

    target = (2, 3, 5, 7)
    for shape in [(), (7,), (5, 7), (1, 7), (5, 1), (3, 1, 1), (2, 1, 5, 7), (2, 3, 5, 7), (6, 7), (5, 6),
                  (3, 5, 6), (4, 3, 5, 7), (2, 2, 5, 7), (1, 1, 1, 1)]:
        try:
            torch.broadcast_shapes(shape, target)
            expected = True
        except RuntimeError:
            expected = False
        assert _broadcasts(shape, target) == expected, shape
    assert not _broadcasts((1, 1, 1, 1, 1), target)  # more dims than (B, H, Tq, Tk)


def test_specs_and_filter_masks_are_kept_between_calls():
    """Kernels without parameters, filters and the masks of spec filters are built once per spec
    (and per Tq, Tk, device for masks); a call-time key mask or a mask tensor is never kept."""
    from kernel_attention import functional as fn

    q, k, v = _qkv()
    a = fn.build_problem(q, k, v, "rbf", "causal&local:window=2")
    b = fn.build_problem(q, k, v, "rbf", "causal&local:window=2")
    assert a.kernel is b.kernel and a.filter is b.filter and a.keep is b.keep
    torch.testing.assert_close(a.keep, ka.make_filter("causal&local:window=2").mask(3, 5))
    assert fn.build_problem(q[:, :, :2], k, v, "rbf", "causal&local:window=2").keep.shape == (2, 5)
    for w in (1, 3):  # the key holds the filter's parameters
        torch.testing.assert_close(fn.build_problem(q, k, v, "rbf", f"causal&local:window={w}").keep,
                                   ka.make_filter(f"causal&local:window={w}").mask(3, 5))
    km = torch.ones(2, 5, dtype=torch.bool)
    km[1, 3:] = False
    c = fn.build_problem(q, k, v, "exp", "padding", key_mask=km)
    d = fn.build_problem(q, k, v, "exp", "padding", key_mask=~km)
    assert not torch.equal(c.keep, d.keep)
    kern = ka.make_kernel("exp")
    assert fn.build_problem(q, k, v, kern).kernel is kern
    out = ka.attention(q, k, v, "rbf", "causal&local:window=2", backend="dense")
    ref = ka.attention(q, k, v, ka.make_kernel("rbf"), ka.make_filter("causal&local:window=2"), backend="dense")
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


def test_the_mask_cache_evicts_its_oldest_and_builds_an_evicted_mask_again(monkeypatch):
    """With room for two masks, a third evicts the oldest; asking for the evicted one builds it again, and every
    call gets its own filter's mask throughout."""
    from kernel_attention import functional as fn

    monkeypatch.setattr(fn, "_MASK_ENTRIES", 2)
    monkeypatch.setattr(fn, "_MASKS", {})
    specs = ["causal", "local:window=1", "strided:stride=2", "causal"]
    for tq in (3, 4):
        for spec in specs + specs[::-1]:
            got = fn._filter_mask(ka.make_filter(spec), tq, 5, torch.device("cpu"), None)
            assert torch.equal(got, ka.make_filter(spec).mask(tq, 5)), (spec, tq)
            assert len(fn._MASKS) <= 2


# ---- the input audit: each case failed before (a raw torch error, NaN, or None for a zero gradient) ----------

@pytest.mark.parametrize("backend", ["auto", "dense", "blockwise"])
@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic", "poly"])
def test_a_float_mask_of_any_broadcastable_rank_runs_on_every_backend(kernel, backend):
    if backend == "blockwise" and kernel == "poly":
        pytest.skip("blockwise runs positive kernels only")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 4) for _ in range(3))
    mask = torch.randn(8, 8)  # (Tq, Tk), as scaled_dot_product_attention takes it
    ref = ka.attention(q, k, v, kernel=kernel, mask=mask[None, None].expand(2, 2, 8, 8), backend="dense")
    torch.testing.assert_close(ka.attention(q, k, v, kernel=kernel, mask=mask, backend=backend), ref)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_plus_inf_in_a_float_mask_are_refused_while_minus_inf_drops_a_key(bad):
    q, k, v = (torch.randn(1, 2, 4, 4) for _ in range(3))
    mask = torch.zeros(4, 4)
    mask[1, 2] = bad
    with pytest.raises(ValueError, match=r"float mask contains NaN or \+inf"):
        ka.attention(q, k, v, mask=mask)
    with pytest.raises(ValueError, match=r"bias contains NaN or \+inf"):
        ka.attention(q, k, v, bias=mask)
    mask[1, 2] = float("-inf")
    bool_mask = torch.ones(4, 4, dtype=torch.bool)
    bool_mask[1, 2] = False
    torch.testing.assert_close(ka.attention(q, k, v, mask=mask), ka.attention(q, k, v, mask=bool_mask))


@pytest.mark.parametrize("kernel", ["exp", "rbf", "poly", "ikas"])
@pytest.mark.parametrize("backend", ["auto", "dense"])
def test_a_float_mask_of_minus_inf_everywhere_gives_zeros_and_zero_gradients(kernel, backend):
    q, k, v = (torch.randn(1, 2, 6, 4, requires_grad=True) for _ in range(3))
    kern = ka.make_kernel(kernel, n_heads=2, d_head=4)
    out = ka.attention(q, k, v, kernel=kern, mask=torch.full((6, 6), float("-inf")), backend=backend)
    assert torch.equal(out, torch.zeros_like(out))
    grads = torch.autograd.grad(out.sum(), [q, k, v], allow_unused=True)
    assert all(g is not None and torch.equal(g, torch.zeros_like(g)) for g in grads)


def test_bad_sizes_and_parameters_are_refused_naming_what_is_accepted():
    q, k, v = (torch.randn(1, 1, 4, 3) for _ in range(3))
    with pytest.raises(ValueError, match="D and Dv must be at least 1"):
        ka.attention(q[..., :0], k[..., :0], v)
    with pytest.raises(ka.SpecError, match="scale=inf must be a finite number"):
        ka.attention(q, k, v, kernel="rbf:scale=inf")
    with pytest.raises(ka.SpecError, match="degree=1000000000 must satisfy: 1..32"):
        ka.attention(q, k, v, kernel="poly:degree=1000000000")
    for p in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
            ka.attention(q, k, v, dropout_p=p)
    layer = ka.KernelAttention(8, 2, filter="causal")
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5\) does not broadcast"):
        layer(torch.randn(2, 6, 8), mask=torch.randn(3, 5))


@pytest.mark.parametrize("kernel", ["rbf-only", "expsin"])
def test_a_gradient_that_should_be_zero_is_zero_not_none(kernel):
    q, k, v = (torch.randn(1, 2, 1, 4, requires_grad=True) for _ in range(3))
    kern = ka.make_kernel(kernel, n_heads=2, d_head=4)
    out = ka.attention(q, k, v, kernel=kern, mask=torch.zeros(1, 1, 1, 1, dtype=torch.bool))
    grads = torch.autograd.grad(out.sum(), [q, k, v], allow_unused=True)
    assert all(g is not None and not g.any() for g in grads)


def test_xl_on_an_all_padding_batch_gives_every_parameter_a_zero_gradient():
    layer = ka.KernelAttention(8, 2, position="xl")
    layer(torch.randn(2, 300, 8), key_mask=torch.zeros(2, 300, dtype=torch.bool)).sum().backward()
    grads = {n: p.grad for n, p in layer.named_parameters() if n.startswith("position.")}
    assert set(grads) == {"position.u", "position.v", "position.r_net.0.weight"}
    assert all(g is not None and not g.any() for g in grads.values())


@pytest.mark.parametrize("name", ["ikas", "ikan-direct", "mikan"])
def test_an_implicit_kernel_of_another_dtype_than_q_is_named_with_the_fix(name):
    from kernel_attention.kernels import make_kernel

    kern = make_kernel(name, n_heads=2, d_head=4)
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match=rf"kernel .* holds torch.float32 weights and q is torch.float64: move the "
                                        rf"kernel with \.to\(torch.float64\)"):
        ka.attention(q, q, q, kernel=kern)
    assert ka.attention(q, q, q, kernel=kern.to(torch.float64)).dtype == torch.float64
