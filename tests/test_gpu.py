"""The backends on CUDA (sdpa, FlexAttention's score_mod and block masks, blockwise, linear) against ``dense`` in float64 on the CPU: values and gradients, float32 and bfloat16.

Marked ``gpu``: skipped where no CUDA device is present (CI), run on a lent GPU with
``python -m pytest -q -m gpu tests/test_gpu.py``."""

import pytest
import torch

import kernel_attention as ka
from kernel_attention.functional import attention, explain
from kernel_attention.positions import default_positions, make_position

pytestmark = pytest.mark.gpu

B, H, D = 2, 4, 16
CUDA = torch.device("cuda")
#: ||out - ref|| / ||ref|| allowed per dtype (float32 leaves rounding only; bf16 keeps 8 bits).
TOL = {torch.float32: 1e-4, torch.bfloat16: 4e-2}


def _case(backend, kernel, position="none", filt=None, t=40, device=CUDA, dtype=torch.float32,
          key_mask=None, value_position="none", exact=False):
    """Output and gradients (q, k, v, positional and kernel parameters) as float64 on the CPU.  Inputs
    and parameters are drawn in float64 and rounded to ``dtype``, so every run sees the same values;
    ``exact``: computed from them in float64 on the CPU (the reference) instead of in ``dtype``."""
    if exact:
        device, compute = torch.device("cpu"), torch.float64
    else:
        compute = dtype
    torch.manual_seed(1)
    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D, value_position=value_position).double()
    kern = ka.make_kernel(kernel, n_heads=H, d_head=D).double().eval()
    for p in list(pos.parameters()) + list(kern.parameters()):  # rounded once, so every dtype sees the same
        p.data = p.data.to(dtype).double()
    pos, kern = pos.to(device, compute), kern.to(device, compute)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, t, D, generator=g, dtype=torch.float64).to(dtype).to(device, compute)
               .requires_grad_() for _ in range(3))
    pq, pk = default_positions(t, t, device, True)
    km = None if key_mask is None else key_mask.to(device)
    out = attention(q, k, v, kern, filt, terms=pos.terms(q, k, pq, pk), key_mask=km, backend=backend)
    params = [q, k, v] + list(pos.parameters()) + [p for p in kern.parameters() if p.requires_grad]
    gout = torch.cos(torch.arange(out.numel(), device=device, dtype=torch.float64)).reshape(out.shape).to(compute)
    grads = torch.autograd.grad(out, params, gout, allow_unused=True)
    cpu = lambda x: None if x is None else x.detach().double().cpu()
    return cpu(out), [cpu(x) for x in grads]


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _agree(got, ref, tol, base=None):
    """``got`` within ``tol`` of the float64 ``ref`` (relative norm), or, where ``base`` (dense in the
    same dtype and device) is given, within 3x base's own error if that is larger: in bf16 the reference
    implementation's own rounding sets what "agrees" can mean (a wrong formula is off by O(1)).  The
    gradients of parameters (after q, k, v) are sums over every (b, h, i, j): in bf16 they get 4x ``tol``."""
    names = ["output"] + [f"gradient {i}" for i in range(len(got[1]))]
    gots, refs = [got[0], *got[1]], [ref[0], *ref[1]]
    bases = [None] * len(gots) if base is None else [base[0], *base[1]]
    for i, (name, x, y, z) in enumerate(zip(names, gots, refs, bases)):
        if x is None or y is None:
            assert (x is None or not x.any()) and (y is None or not y.any()), name
            continue
        assert torch.isfinite(x).all(), f"{name}: not finite"
        bound = tol if z is None else max(tol * (1 if i < 4 else 4), 3 * _rel(z, y))
        assert _rel(x, y) < bound, f"{name}: relative error {_rel(x, y):.2e} >= {bound:.2e}"


def _key_mask(t):
    km = torch.ones(B, t, dtype=torch.bool)
    km[1, t // 2:] = False
    return km


def _capable(kernel, position, filt, key_mask=None, value_position="none", t=40):
    """The backends of ORDER other than dense that support the combination on CUDA."""
    from kernel_attention.backends import ORDER
    from kernel_attention.backends.dispatch import resolve_backend
    from kernel_attention.functional import build_problem

    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D, value_position=value_position).to(CUDA)
    kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(CUDA).eval()
    q, k, v = (torch.randn(B, H, t, D, device=CUDA) for _ in range(3))
    km = None if key_mask is None else key_mask.to(CUDA)
    p = build_problem(q, k, v, kern, filt, key_mask=km,
                      terms=pos.terms(q, k, *default_positions(t, t, CUDA, True)))
    return [n for n in ORDER if n != "dense" and resolve_backend(n).supports(p) is None]


def _backends_agree(kernel, position, filt, dtype):
    """Every backend that runs the combination on CUDA (flex where it applies, sdpa, blockwise, ...) agrees
    with float64 dense."""
    km = _key_mask(40) if filt == "padding" else None
    ref = _case("dense", kernel, position, filt, key_mask=km, dtype=dtype, exact=True)
    base = _case("dense", kernel, position, filt, key_mask=km, dtype=dtype) if dtype != torch.float32 else None
    backends = _capable(kernel, position, filt, km)
    assert "blockwise" in backends, backends
    for backend in backends:
        _agree(_case(backend, kernel, position, filt, key_mask=km, dtype=dtype), ref, TOL[dtype], base)


@pytest.mark.parametrize("filt", [None, "causal", "local:window=6", "padding"])
@pytest.mark.parametrize("position", ["none", "shaw", "xl", "product"])
@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic", "ikas"])
def test_backends_on_cuda_match_dense(kernel, position, filt):
    """float32: every kernel x position x filter, on FlexAttention where it applies and on the others that
    run it (sdpa, blockwise)."""
    _backends_agree(kernel, position, filt, torch.float32)


@pytest.mark.parametrize("filt", ["causal", "local:window=6"])
@pytest.mark.parametrize("position", ["none", "shaw", "xl", "product"])
@pytest.mark.parametrize("kernel", ["exp", "rbf", "ikas"])
def test_backends_on_cuda_match_dense_in_bf16(kernel, position, filt):
    """bfloat16 (each FlexAttention form compiles once per dtype: a subset of the float32 grid)."""
    _backends_agree(kernel, position, filt, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("filt", [None, "causal", "padding"])
@pytest.mark.parametrize("kernel", ["linear", "poly"])
def test_linear_on_cuda_matches_dense(kernel, filt, dtype):
    km = _key_mask(40) if filt == "padding" else None
    ref = _case("dense", kernel, "none", filt, key_mask=km, dtype=dtype, exact=True)
    base = _case("dense", kernel, "none", filt, key_mask=km, dtype=dtype) if dtype != torch.float32 else None
    for backend in ("linear", "linear:chunk=7"):
        # the direct kernels normalise k / sum k, whose sums of signed terms cancel: 10x float32's bound
        _agree(_case(backend, kernel, "none", filt, key_mask=km, dtype=dtype), ref,
               TOL[dtype] * (10 if dtype == torch.float32 else 1), base)


def test_shaw_relative_values_and_memory_on_cuda():
    for filt in (None, "causal", "local:window=5"):
        ref = _case("dense", "exp", "shaw", filt, value_position="relative", exact=True)
        capable = _capable("exp", "shaw", filt, value_position="relative")
        assert "blockwise" in capable and "flex" not in capable, capable  # flex: no value term
        for backend in sorted(set(capable) & {"blockwise", "triton"}):
            _agree(_case(backend, "exp", "shaw", filt, value_position="relative"), ref, TOL[torch.float32])


def test_cuda_dispatch_names_its_backend():
    q, k, v = (torch.randn(B, H, 64, D, device=CUDA) for _ in range(3))
    c = explain(q, k, v, "exp", "local:window=8")
    assert c.name == "flex" and "FlexAttention" in c.reasons["flex"], c
    c = explain(q, k, v, "rbf", "causal")
    assert c.name == "sdpa" and "one scaled_dot_product_attention call" in c.reasons["sdpa"], c
    pos = make_position("shaw", d_model=H * D, n_heads=H, d_head=D).to(CUDA)
    terms = pos.terms(q, k, *default_positions(64, 64, CUDA, True))
    c = explain(q, k, v, "exp", "causal", terms=terms)
    assert "CPU" in c.reasons["banded"] and "shaw clipped" not in str(c)  # banded: CPU only
    try:
        import triton  # noqa: F401
    except ImportError:  # Shaw's terms go to triton where it is installed, to FlexAttention where not
        assert c.name == "flex" and "FlexAttention" in c.reasons["flex"], c
    else:
        assert c.name == "triton" and "Triton flash kernels" in c.reasons["triton"], c
        c = explain(q, k, v, "ikas", "causal")  # within dense's element budget: dense was faster
        assert c.name != "triton" and "dense was faster" in c.reasons["triton"], c


@pytest.mark.parametrize("backend", ["sdpa", "flex", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel,causal", [("exp", True), ("rbf", False)])
def test_grouped_heads_on_cuda_match_the_heads_repeated(kernel, causal, dtype, backend):
    """sdpa, flex and triton take 2 key/value heads for 8 query heads as held (their grouped-query attention);
    against dense on the heads repeated, values and gradients."""
    if backend == "triton":
        pytest.importorskip("triton")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 64, 16, generator=g).to(CUDA, dtype).requires_grad_() for n in (8, 2, 2))
    out = attention(q, k, v, kernel=kernel, is_causal=causal, enable_gqa=True, backend=backend)
    ref = attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), kernel=kernel, is_causal=causal,
                    backend="dense")
    w = torch.randn(out.shape, generator=g).to(CUDA, dtype)
    for a, b in zip((out, *torch.autograd.grad((out * w).sum(), (q, k, v))),
                    (ref, *torch.autograd.grad((ref * w).sum(), (q, k, v)))):
        assert float((a - b).float().norm() / b.float().norm()) < TOL[dtype]


def test_empty_rows_are_zero_on_cuda():
    km = torch.ones(B, 40, dtype=torch.bool)
    km[0] = False
    for backend in ("flex", "blockwise"):
        out, grads = _case(backend, "rbf", "shaw", "causal", key_mask=km)
        assert torch.equal(out[0], torch.zeros_like(out[0])), backend
        assert all(torch.isfinite(g).all() for g in grads if g is not None), backend


@pytest.mark.parametrize("kernel,position,backend", [
    ("rbf", "none", "auto"), ("rbf", "shaw", "auto"), ("rbf", "xl", "auto"),
    ("ikan-direct", "none", "auto"), ("mikan:amortized=false", "none", "auto"),
    ("ikas:amortized=false", "none", "auto"),
    ("ikan-direct", "none", "blockwise"), ("mikan:amortized=false", "none", "blockwise")])
def test_layer_trains_under_bf16_autocast_on_cuda(kernel, position, backend):
    """One KernelAttention layer, forward+backward under bf16 autocast on CUDA: finite, and close to the
    float32 layer with the same weights (the implicit kernels' log k comes in float32 there; blockwise's
    hand-written backward meets it beside bf16 values)."""
    torch.manual_seed(0)
    layer = ka.KernelAttention(64, 4, kernel=kernel, position=position, filter="causal", backend=backend)
    layer = layer.to(CUDA).eval()
    x = torch.randn(2, 50, 64, device=CUDA)
    ref = layer(x)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
    y.float().pow(2).mean().backward()
    assert torch.isfinite(y).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)
    assert _rel(y.float(), ref) < 5e-2


@pytest.mark.parametrize("kernel,position,filt", [
    ("exp", "none", "causal"), ("rbf", "none", "causal"), ("exp", "shaw", "causal"), ("rbf", "xl", "causal"),
    ("exp", "product", "full"), ("ikan-direct", "none", "causal"), ("exp", "none", "local:window=8"),
    ("exp", "shaw", "strided:stride=4")])
def test_layer_compiles_fullgraph_on_cuda(kernel, position, filt):
    """A KernelAttention layer on ``auto`` compiles with fullgraph=True on CUDA (the backends ``auto`` takes while
    a graph is traced, triton among them) and agrees with the eager layer, input gradients included."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = ka.KernelAttention(64, 4, kernel=kernel, position=position, filter=filt).to(CUDA).eval()
    x = torch.randn(2, 40, 64, device=CUDA)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1 = torch.compile(layer, fullgraph=True)(x1)
    y2 = layer(x2)
    w = torch.randn(y2.shape, device=CUDA)
    (y1 * w).sum().backward()
    (y2 * w).sum().backward()
    assert _rel(y1, y2) < TOL[torch.float32] and _rel(x1.grad, x2.grad) < TOL[torch.float32]
