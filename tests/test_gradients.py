"""Gradients match finite differences in float64 for every kernel, positional scheme and filter."""

import pytest
import torch

import kernel_attention as ka


@pytest.mark.parametrize("kernel", ["exp", "rbf", "poly", "poly:degree=3", "linear", "periodic"])
@pytest.mark.parametrize("mask", [None, "causal", "strided:stride=2", "causal&local:window=1"])
def test_functional_gradcheck(kernel, mask):
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: ka.attention(q, k, v, kernel=kernel, mask=mask), (q, k, v))


@pytest.mark.parametrize("kernel", ["rbf-only", "expsin", "linear-magnitude", "ikas", "ikans", "ikan", "ikan-direct",
                                    "mikan"])
@pytest.mark.parametrize("mask", [None, "causal&local:window=1"])
def test_similarity_magnitude_kernels_gradcheck(kernel, mask):
    """The IKA kernels in eval mode (fixed spectral noise), through q, k, v and the kernels' own parameters."""
    torch.manual_seed(0)
    params = ["R=4"] if kernel.startswith(("ik", "mik")) else []
    if mask is not None and kernel in ("ikas", "ikans", "ikan", "mikan"):
        params.append("amortized=false")  # pooled over every position, the density would see hidden keys
    kern = ka.make_kernel(kernel + (":" + ",".join(params) if params else ""), n_heads=2, d_head=4).double().eval()
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    wrapper = _Attention(kern, mask)
    names = [n for n, p in wrapper.named_parameters() if p.requires_grad]

    def f(q, k, v, *ps):
        return torch.func.functional_call(wrapper, dict(zip(names, ps)), (q, k, v))

    inputs = (q, k, v, *[wrapper.get_parameter(n).detach().clone().requires_grad_(True) for n in names])
    assert torch.autograd.gradcheck(f, inputs, atol=1e-6)


class _Attention(torch.nn.Module):
    """ka.attention with one kernel module, as a module whose parameters functional_call can replace."""

    def __init__(self, kern, mask):
        super().__init__()
        self.kern, self.mask = kern, mask

    def forward(self, q, k, v):
        return ka.attention(q, k, v, kernel=self.kern, mask=self.mask)


@pytest.mark.parametrize("position", ["none", "absolute", "absolute:encoding=learned,max_len=16", "shaw:clip=2",
                                      "xl", "product"])
@pytest.mark.parametrize("kernel", ["exp", "rbf", "poly"])
def test_module_gradcheck_all_parameters(position, kernel):
    """Gradient w.r.t. the input and every parameter (tables, W_R, u, v, W_T included)."""
    torch.manual_seed(0)
    value = "relative" if position.startswith("shaw") else "absolute"
    layer = ka.KernelAttention(8, 2, kernel=kernel, position=position, value_position=value,
                               filter="memory").double()
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    mem = torch.randn(1, 2, 8, dtype=torch.float64)
    params = [p for p in layer.parameters()]

    def f(x, *ps):
        with torch.no_grad():
            saved = [p.detach().clone() for p in params]
        for p, new in zip(params, ps):
            p.data = new.detach()
        out = torch.func.functional_call(layer, {n: t for (n, _), t in zip(layer.named_parameters(), ps)},
                                         (x,), {"memory": mem})
        for p, old in zip(params, saved):
            p.data = old
        return out

    inputs = (x, *[p.detach().clone().requires_grad_(True) for p in params])
    assert torch.autograd.gradcheck(f, inputs, atol=1e-6)


def test_every_parameter_receives_gradient():
    for position in ["absolute:encoding=learned", "shaw", "xl", "product"]:
        value = "relative" if position == "shaw" else "none"
        layer = ka.KernelAttention(8, 2, position=position, value_position=value, filter="causal")
        layer(torch.randn(2, 5, 8)).pow(2).sum().backward()
        missing = [n for n, p in layer.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
        assert not missing, (position, missing)


@pytest.mark.parametrize("kernel", ["exp", "rbf", "poly", "ikas:R=4,amortized=false"])
@pytest.mark.parametrize("mask", [None, "causal&local:window=1"])
def test_second_derivatives_on_dense(kernel, mask):
    """Gradients of gradients (a gradient penalty, Hessian-vector products) against finite differences."""
    torch.manual_seed(0)
    kern = ka.make_kernel(kernel, n_heads=2, d_head=4).double().eval()
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda q, k, v: ka.attention(q, k, v, kernel=kern, mask=mask, backend="dense"), (q, k, v))


@pytest.mark.parametrize("kernel, mask, backend", [
    ("exp", "local:window=1", "auto"), ("exp", "local:window=1", "blockwise:block=1024"),
    ("rbf", None, "sdpa:key_bias=mask"), ("poly", None, "linear"), ("linear", "causal", "linear"),
    ("ikas:R=4", None, "squared")])
def test_a_backward_written_out_refuses_a_second_derivative(kernel, mask, backend):
    """Its gradients have no graph: asked for one (create_graph=True) it names dense, which has one, instead of
    a second derivative that would be missing (a gradient penalty taken as a constant)."""
    from kernel_attention.backends import SecondDerivativeError
    q = torch.randn(1, 2, 8, 4, dtype=torch.float64, requires_grad=True)
    k, v = torch.randn(1, 2, 8, 4, dtype=torch.float64), torch.randn(1, 2, 8, 4, dtype=torch.float64)
    kern = ka.make_kernel(kernel, n_heads=2, d_head=4).double().eval()
    out = ka.attention(q, k, v, kernel=kern, mask=mask, backend=backend)
    with pytest.raises(SecondDerivativeError, match="backend='dense'"):
        torch.autograd.grad(out.square().sum(), q, create_graph=True)
    assert torch.autograd.grad(out.square().sum(), q)[0].shape == q.shape  # first derivatives as before
