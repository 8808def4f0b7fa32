"""Every named backend agrees with ``dense`` in values and gradients on every kernel x position x filter it
supports -- ``sdpa`` (one fused call), ``banded`` (Shaw's table), ``squared`` (the implicit kernels) and
``blockwise`` (blocks of query rows, with its slice loops) -- with memories, cross-attention, Shaw's value
table, dropout and empty filtered sets."""

import pytest
import torch
from _common import (D, DT, FILTERS, H, POSITIONS, POSITIVE, capable, chosen, close, first_capable, inputs,
                     padding_mask, problem, run, small_blocks)

import kernel_attention as ka
from kernel_attention.backends.dispatch import resolve_backend
from kernel_attention.functional import attention, build_problem, explain
from kernel_attention.positions import default_positions, make_position


def _agree_with_dense(kernel, position="none", filt=None, **kw):
    """Every backend that supports the combination (in blocks of 1024 elements where it has blocks, and rbf's
    key bias also as sdpa's mask) against dense; returns the names that ran."""
    p = problem(kernel, position, filt, **kw)
    names = capable(p)
    assert names, (kernel, position, filt)
    specs = [small_blocks(n) for n in names]
    if kernel == "rbf" and resolve_backend("sdpa:key_bias=mask").supports(p) is None:
        specs.append("sdpa:key_bias=mask")
    ref = run("dense", kernel, position, filt, **kw)
    for spec in specs:
        try:
            close(run(spec, kernel, position, filt, **kw), ref)
        except AssertionError as e:
            raise AssertionError(f"{spec} on {kernel} / {position} / {filt}: {e}") from None
    return names


@pytest.mark.parametrize("kernel", POSITIVE)
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("filt", FILTERS)
def test_backends_match_dense(kernel, position, filt):
    """Each combination on the first backend of ORDER that supports it (the fast path that runs it) and on
    every other that does, blockwise (which runs every positive kernel) always among them."""
    km = padding_mask(23) if filt == "padding" else None
    names = _agree_with_dense(kernel, position, filt, key_mask=km)
    assert "blockwise" in names and first_capable(problem(kernel, position, filt, key_mask=km)) == names[0]


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
def test_other_filters_and_pairwise_kernels(kernel):
    for filt in ("strided:stride=3", "fixed:stride=4", "causal&local:window=3"):
        assert _agree_with_dense(kernel, "shaw", filt) == ["blockwise"]
    assert _agree_with_dense("rbf-only", "xl", "causal") == ["blockwise"]


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
def test_sdpa_matches_dense(kernel):
    # One SDPA call for full, causal and padding filters, the key bias as a feature or as the fused kernel's
    # mask (rbf; the others have none), and it is what auto takes.
    for filt, km in ((None, None), ("causal", None), (None, padding_mask(23))):
        ref = run("dense", kernel, "none", filt, key_mask=km)
        for backend in ("sdpa", "sdpa:key_bias=mask"):
            close(run(backend, kernel, "none", filt, key_mask=km), ref)
        assert chosen(problem(kernel, "none", filt, key_mask=km)) == "sdpa"


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
def test_product_positions_concatenated_or_shared_by_the_batch(kernel):
    """product's positional features are the same for every sequence of a batch: for B > 1 on the CPU
    auto runs them on blockwise as a (rows, Tk) term per head and block (its slice loops), for B = 1 on sdpa
    concatenated to the features (one call).  Both equal dense, W_T's gradient (summed over the batch)
    included, and explain names the form.  sdpa asked by name concatenates them for B > 1 too (how the
    benchmark compares the two)."""
    cases = [(2, None, None), (2, "causal", None), (2, None, padding_mask(23)), (1, None, None), (1, "causal", None)]
    for b, filt, km in cases:
        ref = run("dense", kernel, "product", filt, key_mask=km, b=b)
        backends = ["sdpa", "sdpa:key_bias=mask", "blockwise"] if kernel == "rbf" else ["sdpa", "blockwise"]
        for backend in backends:
            close(run(backend, kernel, "product", filt, key_mask=km, b=b), ref)
        q, k, v = inputs(23, 23, b=b)
        pos = make_position("product", d_model=H * D, n_heads=H, d_head=D).to(DT)
        terms = pos.terms(q, k, *default_positions(23, 23, "cpu", True))
        c = explain(q, k, v, kernel, filt, key_mask=km, terms=terms)
        assert c.name == ("blockwise" if b > 1 else "sdpa"), c
        why = c.reasons[c.name]
        assert ("shared by the batch" in why) == (b > 1), why
        assert ("concatenated positional features" in why) == (b == 1), why
        if b > 1:
            assert "shared by the batch" in c.reasons["sdpa"], c
    q, k, v = inputs(23, 23)
    terms = make_position("product", d_model=H * D, n_heads=H, d_head=D).to(DT).terms(
        q, k, *default_positions(23, 23, "cpu", True))
    why = explain(q, k, v, kernel, None, terms=terms, backend="sdpa").reasons["sdpa"]
    assert "concatenated positional features" in why


def test_shaw_relative_values():
    for filt in (None, "causal", "local:window=3"):
        assert _agree_with_dense("exp", "shaw", filt, value_position="relative") == ["blockwise"]


@pytest.mark.parametrize("position", ["none", "xl", "shaw"])
def test_memory_and_cross_attention(position):
    # Tq < Tk: a Transformer-XL memory in front of the segment (lower-right aligned), then encoder-decoder.
    for filt in ("memory", "memory:same_length=true", "causal"):
        _agree_with_dense("exp", position, filt, tq=11, tk=29)
    _agree_with_dense("rbf", position, None, tq=11, tk=29, self_attention=False)


@pytest.mark.parametrize("backend", ["sdpa", "sdpa:key_bias=mask", "blockwise", "blockwise:block=1024",
                                     "linear:chunk=5"])
def test_empty_rows_are_zero_with_finite_gradients(backend):
    kernel = "poly" if backend.startswith("linear") else "rbf"
    km = padding_mask(23, empty=True)
    out, grads = run(backend, kernel, "none", None, key_mask=km)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
    assert not grads[0][0].any()  # no gradient reaches the queries of the empty rows
    close((out, grads), run("dense", kernel, "none", None, key_mask=km))


@pytest.mark.parametrize("kernel, position, filt", [("exp", "none", "local:window=4"), ("exp", "none", None),
                                                    ("rbf", "none", None), ("exp", "shaw", "causal"),
                                                    ("exp", "xl", "causal"), ("ikas", "none", None)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_inputs_with_a_strided_feature_dimension(kernel, position, filt, dtype):
    """q, k, v held transposed (stride(-1) != 1) give what the same values held contiguously give on dense,
    on every backend that runs them (PyTorch's fused CPU kernels, called directly, read that dimension as
    contiguous)."""
    p = problem(kernel, position, filt, dtype=dtype)
    specs = [small_blocks(n) for n in capable(p)] + ["auto"]
    if kernel == "rbf":
        specs.append("sdpa:key_bias=mask")
    atol = 1e-10 if dtype == torch.float64 else 1e-4
    ref = run("dense", kernel, position, filt, dtype=dtype)
    for spec in specs:
        try:
            close(run(spec, kernel, position, filt, dtype=dtype, transposed=True), ref, atol=atol)
        except AssertionError as e:
            raise AssertionError(f"{spec} on {kernel} / {position} / {filt}: {e}") from None


@pytest.mark.parametrize("shape", [(23, 1), (1, 23), (1, 1), (2, 1, 23, 1)])
@pytest.mark.parametrize("filt", ["local:window=2", "causal", None])
def test_an_additive_term_broadcast_over_keys_or_queries(shape, filt):
    """A float term of one column (a per-query term) or one row, on blockwise's blocks that start past the
    first key, against dense, with gradients for the term."""
    q, k, v = inputs(23, 23)
    bias = torch.randn(shape, dtype=DT, requires_grad=True)

    def one(backend):
        out = attention(q, k, v, "exp", filt, bias=bias, backend=backend)
        return out, torch.autograd.grad(out, (q, k, v, bias), torch.ones_like(out) + out.detach())
    close(one("blockwise:block=1024"), one("dense"))


def test_float32_agrees():
    ref = run("dense", "exp", "xl", "causal", tq=64, tk=64, dtype=torch.float32)
    for backend in ("blockwise", "blockwise:block=1024"):
        close(run(backend, "exp", "xl", "causal", tq=64, tk=64, dtype=torch.float32), ref, atol=2e-4)
    ref = run("dense", "periodic", "product", None, tq=64, tk=64, dtype=torch.float32)
    for backend in ("sdpa", "blockwise"):
        close(run(backend, "periodic", "product", None, tq=64, tk=64, dtype=torch.float32), ref, atol=2e-4)


def test_dropout_on_blockwise_has_consistent_gradients():
    # The dropout mask is redrawn identically in the backward pass: gradcheck with a fixed seed.
    q, k, v = (x.detach()[:1, :1, :9, :4].clone().requires_grad_() for x in inputs(9, 9))
    table = torch.randn(7, 4, dtype=DT)
    idx = (torch.arange(9)[:, None] - torch.arange(9)[None, :]).clamp(-3, 3) + 3
    terms = ka.PositionalTerms(relative=[((q @ torch.randn(4, 7, dtype=DT)), idx[None])], value=[(table, idx[None])])

    def f(q, k, v):
        torch.manual_seed(0)
        t = ka.PositionalTerms(relative=[(q @ terms.relative[0][0].detach()[0, 0, :, :0].new_ones(4, 7), idx[None])],
                               value=terms.value)
        return attention(q, k, v, "exp", "causal", terms=t, dropout_p=0.3, backend="blockwise:block=1024")

    assert torch.autograd.gradcheck(f, (q, k, v))


# ---- dispatch ------------------------------------------------------------------------------------


@pytest.mark.parametrize("position", ["shaw", "xl", "product"])
def test_kernel_attention_backends_agree(position):
    torch.manual_seed(0)
    x = torch.randn(2, 19, 16, dtype=DT)
    outs = []
    for backend in ("dense", "auto", "blockwise") + (("sdpa",) if position == "product" else ()):
        torch.manual_seed(0)
        layer = ka.KernelAttention(16, 2, kernel="rbf", position=position, filter="causal", backend=backend).to(DT)
        y = layer(x)
        y.sum().backward()
        outs.append((y, [p.grad for p in layer.parameters()]))
    for o in outs[1:]:
        close(o, outs[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_backends_agree():
    dev = torch.device("cuda")
    q, k, v = (x.detach().to(dev).float().requires_grad_() for x in inputs(64, 64))
    for kernel, mask, backend in (("exp", "causal", "sdpa"), ("rbf", None, "sdpa"),
                                  ("periodic", "local:window=8", "flex")):  # local: a block mask
        assert explain(q, k, v, kernel, mask).name == backend
        ref = attention(q, k, v, kernel, mask, backend="dense")
        out = attention(q, k, v, kernel, mask, backend=backend)
        torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
        g_ref = torch.autograd.grad(ref.sum(), (q, k, v))
        g = torch.autograd.grad(out.sum(), (q, k, v))
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)
    assert "FlexAttention" in explain(q, k, v, "exp", "local:window=8").reasons["flex"]
    # kernels blockwise alone runs go to dense on CUDA while dense is small (the CUDA policy's
    # dense_preferred_elements), and attention() runs the backend that explain names
    c = explain(q, k, v, "rbf-only", "causal")
    assert c.name == "dense" and "launch-bound" in c.reasons["blockwise"], c
    torch.testing.assert_close(attention(q, k, v, "rbf-only", "causal"),
                               attention(q, k, v, "rbf-only", "causal", backend="dense"), atol=0, rtol=0)


@pytest.mark.parametrize("kernel", ["ikan-direct", "mikan"])
def test_implicit_kernels_share_their_spectral_state(kernel):
    assert _agree_with_dense(kernel, "none", "causal")[0] == "squared"


@pytest.mark.parametrize("kernel", ["exp", "poly", "rbf"])
@pytest.mark.parametrize("which", ["mask", "bias"])
def test_a_float_mask_of_another_dtype_is_taken_in_qs_dtype_on_every_backend(kernel, which):
    """A float32 mask or bias beside float64 (or bfloat16) inputs is added in q's dtype, as PyTorch's attention
    asks of its attn_mask, on every backend that runs the call, weights included."""
    q, k, v = inputs(5, 6)
    extra = torch.randn(5, 6, dtype=torch.float32, generator=torch.Generator().manual_seed(3))
    extra[0, 2] = float("-inf")
    kw = {"mask": extra} if which == "mask" else {"bias": extra}
    p = build_problem(q, k, v, kernel, **kw)
    assert p.terms.bias.dtype == q.dtype

    def with_grads(backend, **given):
        out = attention(q, k, v, kernel, backend=backend, **given)
        return out, torch.autograd.grad(out, (q, k, v), torch.ones_like(out) + out.detach())

    ref = with_grads("dense", **{key: x.double() for key, x in kw.items()})
    for name in ["dense", *capable(p)]:
        close(with_grads(name, **kw), ref)
    out, weights = attention(q, k, v, kernel, need_weights=True, **kw)
    torch.testing.assert_close(out, ref[0], atol=1e-10, rtol=1e-10)
    assert weights.dtype == q.dtype and weights[..., 0, 2].eq(0).all()
    low = [x.detach().to(torch.bfloat16) for x in (q, k, v)]
    assert attention(*low, kernel, need_weights=True, **kw)[0].dtype == torch.bfloat16
