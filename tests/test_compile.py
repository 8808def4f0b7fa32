"""``torch.compile(fullgraph=True)`` of the layers: no graph break, no guard on tensor values, compiled ==
eager for outputs and input gradients, and one graph for every sequence length under ``dynamic=True``.

The default suite compiles a representative set of kernel x position x filter with the CPU inductor; the
whole grid runs under ``-m slow``."""

import itertools

import pytest
import torch

import kernel_attention as ka

D_MODEL, HEADS = 32, 4

MUST_COMPILE = [
    ("exp", "none", "causal"), ("rbf", "none", "causal"), ("exp", "shaw", "causal"), ("exp", "xl", "causal"),
    ("exp", "product", "full"), ("poly", "none", "causal"), ("ikan-direct", "none", "causal"),
    ("exp", "none", "local:window=8"),
]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compare(module, x, atol=1e-4):
    """Output, input gradient and every parameter's gradient of ``module`` compiled with fullgraph against eager."""
    compiled = torch.compile(module, fullgraph=True)
    grads = []
    for run in (compiled, module):
        module.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        y = run(xi)
        (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
        grads.append((y, xi.grad, {n: p.grad for n, p in module.named_parameters()}))
    (y1, gx1, gp1), (y2, gx2, gp2) = grads
    torch.testing.assert_close(y1, y2, atol=atol, rtol=atol)
    torch.testing.assert_close(gx1, gx2, atol=atol, rtol=atol)
    for name in gp2:
        if gp1[name] is None or gp2[name] is None:
            assert gp1[name] is None and gp2[name] is None, name
        else:
            torch.testing.assert_close(gp1[name], gp2[name], atol=atol, rtol=atol, msg=name)


@pytest.mark.parametrize("kernel,position,filt", MUST_COMPILE, ids=["/".join(c) for c in MUST_COMPILE])
def test_kernel_attention_compiles_fullgraph_and_matches_eager(kernel, position, filt):
    torch.manual_seed(0)
    layer = ka.KernelAttention(D_MODEL, HEADS, kernel=kernel, position=position, filter=filt)
    _compare(layer, torch.randn(2, 16, D_MODEL))


@pytest.mark.parametrize("kernel,position,filt", [("exp", "xl", "causal"), ("exp", "shaw", "causal"),
                                                ("poly", "none", "causal")])
def test_dynamic_shapes_compile_once_for_every_length(kernel, position, filt):
    torch.manual_seed(0)
    layer = ka.KernelAttention(D_MODEL, HEADS, kernel=kernel, position=position, filter=filt)
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    compiled(torch.randn(2, 12, D_MODEL, requires_grad=True)).sum().backward()
    with torch.compiler.set_stance("fail_on_recompile"):  # a second graph would raise here
        for t in (16, 21):
            x = torch.randn(2, t, D_MODEL, requires_grad=True)
            y = compiled(x)
            y.sum().backward()
            torch.testing.assert_close(y, layer(x), atol=1e-4, rtol=1e-4)


def test_the_functional_scale_compiles_fullgraph():
    q, k, v = torch.randn(3, 2, 2, 6, 8).unbind(0)
    f = torch.compile(lambda q, k, v: ka.attention(q, k, v, kernel="rbf", scale=0.3), fullgraph=True)
    torch.testing.assert_close(f(q, k, v), ka.attention(q, k, v, kernel="rbf:scale=0.3"))


def test_grouped_query_attention_compiles_fullgraph():
    """Two key/value heads for four query heads: one fused call on the grouped heads (``enable_gqa``)."""
    torch.manual_seed(0)
    layer = ka.KernelAttention(D_MODEL, HEADS, kv_heads=2, kernel="exp", filter="causal")
    _compare(layer, torch.randn(2, 16, D_MODEL))


@pytest.mark.slow
def test_a_layer_under_bf16_autocast_compiles_fullgraph():
    """Training under CPU autocast: the fused call's float32 rule (``sdpa_float32_max_keys``) traces too."""
    torch.manual_seed(0)
    layer = ka.KernelAttention(D_MODEL, HEADS, kernel="exp", filter="causal")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _compare(layer, torch.randn(2, 16, D_MODEL), atol=2e-2)


def test_transformer_block_compiles_fullgraph():
    torch.manual_seed(0)
    block = ka.TransformerBlock(D_MODEL, HEADS, 64, attention=dict(kernel="rbf", position="xl", filter="causal"))
    _compare(block, torch.randn(2, 10, D_MODEL))


def test_compiled_calls_choose_traceable_backends_and_explain_says_so():
    """While a graph is traced ``auto`` passes over the backends that read values back to the host."""
    from kernel_attention.backends import BACKENDS, ORDER

    expected = {"sdpa": True, "flex": True, "banded": False, "squared": False, "blockwise": False, "linear": False,
                "dense": True}
    assert {n: BACKENDS.create(n).traceable for n in ORDER if n in expected} == expected
    seen = []

    def spy(q, k, v):
        choice = ka.explain(q, k, v, kernel="exp", mask="local:window=4")
        seen.append(choice.name)
        return ka.attention(q, k, v, kernel="exp", mask="local:window=4")

    q = torch.randn(1, 2, 12, 8)
    torch.compile(spy, fullgraph=True)(q, q, q)
    assert seen == ["dense"]  # blockwise in eager, which cannot be traced
    assert ka.explain(q, q, q, kernel="exp", mask="local:window=4").name == "blockwise"


@pytest.mark.parametrize("kernel, mask", [("linear", "causal"), ("poly", "bool")])
def test_direct_kernels_compile_past_the_linear_backends_crossover(kernel, mask):
    """At 300 keys eager runs poly and linear on the linear backend, whose mask checks and written-out backward
    cannot be traced; compiled, auto takes dense, and the two agree, gradients included."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    m = torch.rand(1, 1, 300, 300) > 0.3 if mask == "bool" else mask
    assert ka.explain(q, k, v, kernel=kernel, mask=m).name == ("linear" if mask == "causal" else "dense")

    def f(q, k, v):
        return ka.attention(q, k, v, kernel=kernel, mask=m)
    got, ref = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v), f(q, k, v)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), q), torch.autograd.grad(ref.sum(), q))


def test_a_backend_forced_by_name_that_cannot_be_traced_says_so():
    q = torch.randn(1, 2, 12, 8)
    f = torch.compile(lambda q: ka.attention(q, q, q, mask="local:window=4", backend="blockwise"), fullgraph=True,
                      backend="aot_eager")
    with pytest.raises(Exception, match="backend 'blockwise' is not traceable by torch.compile.*backend='auto'"):
        f(q)


def test_the_finiteness_check_costs_no_trace_and_can_be_asked_for():
    """``validation("auto")`` (the default) skips the check while tracing; ``validation(True)`` checks
    inside the graph without a host read."""
    bad = torch.randn(1, 1, 4, 8)
    bad[0, 0, 0, 0] = float("nan")
    f = torch.compile(lambda q: ka.attention(q, q, q), fullgraph=True)
    assert torch.isnan(f(bad)).any()  # no check: NaN passes through, no graph break
    torch._dynamo.reset()
    with ka.validation(True):
        g = torch.compile(lambda q: ka.attention(q, q, q), fullgraph=True)
        with pytest.raises(RuntimeError, match="attention inputs contain NaN or inf values"):
            g(bad)
    with pytest.raises(ValueError, match="q contains NaN or inf"):  # eager on the CPU: checked, input named
        ka.attention(bad, bad, bad)
    with pytest.raises(ValueError, match="True, False or 'auto'"):
        with ka.validation("sometimes"):
            pass


GRID = list(itertools.product(["exp", "rbf", "periodic", "poly", "linear", "ikas", "rbf-only"],
                              ["none", "absolute", "shaw", "xl", "product"],
                              ["full", "causal", "local:window=4", "strided:stride=4"]))


@pytest.mark.slow
@pytest.mark.parametrize("kernel,position,filt", GRID, ids=["/".join(c) for c in GRID])
def test_every_combination_compiles_fullgraph(kernel, position, filt):
    """In eval mode: the implicit kernels draw their spectral samples in training, which compiled and eager
    code draw in another order.  The linear kernel in float64: its normaliser sum k can come near zero, where
    float32's rounding differences between the compiled and the eager graph grow without bound (the
    instability Transformer Dissection reports), not a difference of the graphs."""
    torch.manual_seed(0)
    if kernel == "ikas" and filt != "full":
        kernel = "ikas:amortized=false"  # the amortized density pools over keys a causal filter hides
    dtype = torch.float64 if kernel == "linear" else torch.float32
    layer = ka.KernelAttention(D_MODEL, HEADS, kernel=kernel, position=position, filter=filt).eval().to(dtype)
    _compare(layer, torch.randn(2, 12, D_MODEL, dtype=dtype), atol=2e-4)
