"""The fused backend (direct, banded and blocked paths) agrees with ``dense`` in values and gradients on
every kernel x position x filter it accepts, with memories, cross-attention, Shaw's value table,
dropout and empty filtered sets."""

import pytest
import torch
from _common import D, DT, FILTERS, FUSED, H, POSITIONS, POSITIVE, close, inputs, padding_mask, run

import kernel_attention as ka
from kernel_attention.functional import attention, explain
from kernel_attention.positions import default_positions, make_position

@pytest.mark.parametrize("kernel", POSITIVE)
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("filt", FILTERS)
def test_fused_matches_dense(kernel, position, filt):
    km = padding_mask(23) if filt == "padding" else None
    ref = run("dense", kernel, position, filt, key_mask=km)
    for backend in FUSED[:2] if kernel == "rbf" else FUSED[:1]:
        close(run(backend, kernel, position, filt, key_mask=km), ref)


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
def test_fused_other_filters_and_pairwise_kernels(kernel):
    for filt in ("strided:stride=3", "fixed:stride=4", "causal&local:window=3"):
        close(run("fused:block=1024", kernel, "shaw", filt), run("dense", kernel, "shaw", filt))
    close(run("fused:block=1024", "rbf-only", "xl", "causal"), run("dense", "rbf-only", "xl", "causal"))


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
def test_fused_direct_path_matches_dense(kernel):
    # Default block budget: one SDPA call for full, causal and padding filters.
    for filt, km in ((None, None), ("causal", None), (None, padding_mask(23))):
        close(run("fused:key_bias=mask", kernel, "none", filt, key_mask=km),
               run("dense", kernel, "none", filt, key_mask=km))


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
def test_product_positions_concatenated_or_shared_by_the_batch(kernel):
    """product's positional features are the same for every sequence of a batch: for B > 1 on the CPU
    they enter as a (rows, Tk) term per head and block (sliced path), for B = 1 they are concatenated to
    the features (one SDPA call).  Both equal dense, W_T's gradient (summed over the batch) included,
    and explain names the form."""
    cases = [(2, None, None), (2, "causal", None), (2, None, padding_mask(23)), (1, None, None), (1, "causal", None)]
    for b, filt, km in cases:
        for backend in ("fused", "fused:key_bias=mask"):
            close(run(backend, kernel, "product", filt, key_mask=km, b=b),
                   run("dense", kernel, "product", filt, key_mask=km, b=b))
        q, k, v = inputs(23, 23, b=b)
        pos = make_position("product", d_model=H * D, n_heads=H, d_head=D).to(DT)
        terms = pos.terms(q, k, *default_positions(23, 23, "cpu", True))
        why = explain(q, k, v, kernel, filt, key_mask=km, terms=terms, backend="fused").reasons["fused"]
        assert ("shared by the batch" in why) == (b > 1)
        assert ("concatenated positional features" in why) == (b == 1)
    # the concatenated form on request, for B > 1 too (how the benchmark compares the two)
    close(run("fused:shared_positions=false", kernel, "product", "causal"), run("dense", kernel, "product", "causal"))
    q, k, v = inputs(23, 23)
    terms = make_position("product", d_model=H * D, n_heads=H, d_head=D).to(DT).terms(
        q, k, *default_positions(23, 23, "cpu", True))
    why = explain(q, k, v, kernel, None, terms=terms, backend="fused:shared_positions=false").reasons["fused"]
    assert "concatenated positional features" in why


def test_fused_shaw_relative_values():
    for filt in (None, "causal", "local:window=3"):
        ref = run("dense", "exp", "shaw", filt, value_position="relative")
        close(run("fused:block=1024", "exp", "shaw", filt, value_position="relative"), ref)


@pytest.mark.parametrize("position", ["none", "xl", "shaw"])
def test_fused_memory_and_cross_attention(position):
    # Tq < Tk: a Transformer-XL memory in front of the segment (lower-right aligned), then encoder-decoder.
    for filt in ("memory", "memory:same_length=true", "causal"):
        ref = run("dense", "exp", position, filt, tq=11, tk=29)
        close(run("fused:block=1024", "exp", position, filt, tq=11, tk=29), ref)
    ref = run("dense", "rbf", position, None, tq=11, tk=29, self_attention=False)
    close(run("fused", "rbf", position, None, tq=11, tk=29, self_attention=False), ref)


@pytest.mark.parametrize("backend", ["fused", "fused:block=1024", "fused:key_bias=mask", "linear:chunk=5"])
def test_empty_rows_are_zero_with_finite_gradients(backend):
    kernel = "poly" if backend.startswith("linear") else "rbf"
    km = padding_mask(23, empty=True)
    out, grads = run(backend, kernel, "none", None, key_mask=km)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
    assert not grads[0][0].any()  # no gradient reaches the queries of the empty rows
    close((out, grads), run("dense", kernel, "none", None, key_mask=km))



def test_float32_agrees():
    ref = run("dense", "exp", "xl", "causal", tq=64, tk=64, dtype=torch.float32)
    close(run("fused:block=1024", "exp", "xl", "causal", tq=64, tk=64, dtype=torch.float32), ref, atol=2e-4)
    ref = run("dense", "periodic", "product", None, tq=64, tk=64, dtype=torch.float32)
    close(run("fused", "periodic", "product", None, tq=64, tk=64, dtype=torch.float32), ref, atol=2e-4)


def test_dropout_on_blocked_path_has_consistent_gradients():
    # The dropout mask is redrawn identically in the backward pass: gradcheck with a fixed seed.
    q, k, v = (x.detach()[:1, :1, :9, :4].clone().requires_grad_() for x in inputs(9, 9))
    table = torch.randn(7, 4, dtype=DT)
    idx = (torch.arange(9)[:, None] - torch.arange(9)[None, :]).clamp(-3, 3) + 3
    terms = ka.PositionalTerms(relative=[((q @ torch.randn(4, 7, dtype=DT)), idx[None])], value=[(table, idx[None])])

    def f(q, k, v):
        torch.manual_seed(0)
        t = ka.PositionalTerms(relative=[(q @ terms.relative[0][0].detach()[0, 0, :, :0].new_ones(4, 7), idx[None])],
                               value=terms.value)
        return attention(q, k, v, "exp", "causal", terms=t, dropout_p=0.3, backend="fused:block=1024")

    assert torch.autograd.gradcheck(f, (q, k, v))


# ---- dispatch ------------------------------------------------------------------------------------


@pytest.mark.parametrize("position", ["shaw", "xl", "product"])
def test_kernel_attention_backends_agree(position):
    torch.manual_seed(0)
    x = torch.randn(2, 19, 16, dtype=DT)
    outs = []
    for backend in ("dense", "auto", "fused"):
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
    for kernel, mask in (("exp", "causal"), ("rbf", None), ("periodic", "local:window=8")):
        ref = attention(q, k, v, kernel, mask, backend="dense")
        out = attention(q, k, v, kernel, mask, backend="fused")  # local: FlexAttention with a block mask
        torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
        g_ref = torch.autograd.grad(ref.sum(), (q, k, v))
        g = torch.autograd.grad(out.sum(), (q, k, v))
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)
    assert "FlexAttention" in explain(q, k, v, "exp", "local:window=8").reasons["fused"]
    # blocked-only kernels go to dense on CUDA while dense is small (FusedBackend.dense_preferred),
    # and attention() runs the backend that explain names
    c = explain(q, k, v, "rbf-only", "causal")
    assert c.name == "dense" and "launch-bound" in c.reasons["dense"]
    torch.testing.assert_close(attention(q, k, v, "rbf-only", "causal"),
                               attention(q, k, v, "rbf-only", "causal", backend="dense"), atol=0, rtol=0)


@pytest.mark.parametrize("kernel", ["ikan-direct", "mikan"])
def test_fused_implicit_kernels_share_their_spectral_state(kernel):
    close(run("fused:block=1024", kernel, "none", "causal"), run("dense", kernel, "none", "causal"))
