"""Direct kernels (poly, linear, linear-magnitude) under half precision: their normaliser is a plain sum, so
the attention computes them in float32 and returns q's dtype; exp-family kernels run in the low precision."""

import pytest
import torch

from kernel_attention import KernelAttention, attention

DIRECT = ["linear", "poly", "poly:degree=3", "linear-magnitude"]


def _qkv(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 7, 8, generator=g).to(dtype).requires_grad_(True) for _ in range(3)]


@pytest.mark.parametrize("kernel", DIRECT)
def test_a_direct_kernel_on_bf16_inputs_is_the_float32_result_rounded(kernel):
    q, k, v = _qkv(torch.bfloat16)
    out, w = attention(q, k, v, kernel=kernel, mask="causal", need_weights=True)
    assert out.dtype == w.dtype == torch.bfloat16
    q32, k32, v32 = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    ref, ref_w = attention(q32, k32, v32, kernel=kernel, mask="causal", need_weights=True)
    assert torch.equal(out, ref.to(torch.bfloat16)) and torch.equal(w, ref_w.to(torch.bfloat16))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    out.backward(g)
    ref.backward(g.float())  # the same float32 graph: the gradients are its gradients rounded
    for a, b in ((q, q32), (k, k32), (v, v32)):
        assert torch.equal(a.grad, b.grad.to(torch.bfloat16))


@pytest.mark.parametrize("kernel", DIRECT)
def test_autocast_leaves_a_direct_kernel_in_float32(kernel):
    q, k, v = _qkv()
    ref = attention(q, k, v, kernel=kernel)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(q, k, v, kernel=kernel)
    assert out.dtype == torch.float32 and torch.equal(out, ref)


@pytest.mark.parametrize("kernel", ["exp", "rbf", "poly"])
def test_mixed_dtypes_under_autocast_are_cast_as_pytorch_casts_them(kernel):
    """Under autocast PyTorch's attention takes q in bfloat16 beside float32 k, v (it casts them); so does ours,
    with what the inputs cast by hand give."""
    q, k, v = (x.detach() for x in _qkv())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(q.bfloat16(), k, v, kernel=kernel)
        ref = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), kernel=kernel)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q.bfloat16(), k, v)
    assert torch.equal(out, ref) and out.dtype == ref.dtype
    if kernel == "exp":
        assert out.dtype == sdpa.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="must share a dtype"):  # outside autocast, as PyTorch's attention
        attention(q.bfloat16(), k, v, kernel=kernel)


def test_exp_kernels_run_in_the_low_precision():
    q, k, v = _qkv()
    ref = attention(q, k, v, kernel="exp")
    low = attention(*(x.detach().to(torch.bfloat16) for x in (q, k, v)), kernel="exp")
    assert low.dtype == torch.bfloat16 and not torch.equal(low, ref.to(torch.bfloat16))
    torch.testing.assert_close(low.float(), ref.detach(), atol=3e-2, rtol=3e-2)  # bfloat16's 8 bits, not garbage


def test_the_module_keeps_a_linear_kernels_projections_in_float32_under_autocast():
    """The linear kernel's normaliser cancels: with q and k from bfloat16 projections its output is off by
    about its own size on this input, with float32 projections by the bfloat16 rounding of the output layer."""
    torch.manual_seed(0)
    x = torch.randn(4, 24, 64)
    for kernel, bound in (("linear", 2e-2), ("exp", 2e-2)):
        m = KernelAttention(64, 4, kernel=kernel, filter="causal")
        with torch.no_grad():
            ref = m(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = m(x)
        assert out.dtype == torch.bfloat16
        assert float((out.float() - ref).norm() / ref.norm()) < bound, kernel
