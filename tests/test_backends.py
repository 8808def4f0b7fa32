"""Every backend agrees with ``dense`` (values and gradients) on every combination it accepts; the
dispatcher picks the expected backend and says why; unsupported requests fail clearly."""

import pytest
import torch

import kernel_attention as ka
from kernel_attention.backends import BACKENDS, BackendError, choose
from kernel_attention.functional import attention, explain
from kernel_attention.positions import default_positions, make_position
from kernel_attention.registry import SpecError

B, H, D = 2, 2, 8
DT = torch.float64


def _inputs(tq, tk, d=D, seed=0, dtype=DT, b=B):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, H, tq, d, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(b, H, tk, d, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(b, H, tk, d, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def _run(backend, kernel, position="none", filt=None, tq=23, tk=23, key_mask=None, value_position="none",
         self_attention=True, dropout_p=0.0, dtype=DT, b=B):
    """Output and gradients (q, k, v, positional and kernel parameters) for one combination."""
    torch.manual_seed(1)
    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D, value_position=value_position).to(dtype)
    kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(dtype).eval()
    q, k, v = _inputs(tq, tk, dtype=dtype, b=b)
    pq, pk = default_positions(tq, tk, "cpu", self_attention)
    terms = pos.terms(q, k, pq, pk)
    torch.manual_seed(2)
    out = attention(q, k, v, kern, filt, terms=terms, key_mask=key_mask, backend=backend, dropout_p=dropout_p)
    params = [q, k, v] + [p for p in pos.parameters()] + [p for p in kern.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, params, torch.ones_like(out) + out.detach(), allow_unused=True)
    return out, grads


def _close(a, b, atol=1e-10):
    out_a, ga = a
    out_b, gb = b
    torch.testing.assert_close(out_a, out_b, atol=atol, rtol=atol)
    for x, y in zip(ga, gb):
        if x is None or y is None:
            assert (x is None or not x.any()) and (y is None or not y.any())
        else:
            torch.testing.assert_close(x, y, atol=atol, rtol=atol)


def _key_mask(tk, empty=False):
    km = torch.ones(B, tk, dtype=torch.bool)
    km[1, tk // 2:] = False
    if empty:
        km[0] = False  # every key of sequence 0 is padding: all its queries have an empty set
    return km


# small blocks so that the blocked path runs several blocks (and skips keys) even on tiny inputs
FUSED = ["fused:block=1024", "fused:key_bias=mask,block=1024", "fused"]
POSITIVE = ["exp", "rbf", "periodic", "ikas"]
POSITIONS = ["none", "shaw", "xl", "product"]
FILTERS = [None, "causal", "local:window=4", "padding"]


@pytest.mark.parametrize("kernel", POSITIVE)
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("filt", FILTERS)
def test_fused_matches_dense(kernel, position, filt):
    km = _key_mask(23) if filt == "padding" else None
    ref = _run("dense", kernel, position, filt, key_mask=km)
    for backend in FUSED[:2] if kernel == "rbf" else FUSED[:1]:
        _close(_run(backend, kernel, position, filt, key_mask=km), ref)


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
def test_fused_other_filters_and_pairwise_kernels(kernel):
    for filt in ("strided:stride=3", "fixed:stride=4", "causal&local:window=3"):
        _close(_run("fused:block=1024", kernel, "shaw", filt), _run("dense", kernel, "shaw", filt))
    _close(_run("fused:block=1024", "rbf-only", "xl", "causal"), _run("dense", "rbf-only", "xl", "causal"))


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
def test_fused_direct_path_matches_dense(kernel):
    # Default block budget: one SDPA call for full, causal and padding filters.
    for filt, km in ((None, None), ("causal", None), (None, _key_mask(23))):
        _close(_run("fused:key_bias=mask", kernel, "none", filt, key_mask=km),
               _run("dense", kernel, "none", filt, key_mask=km))


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
def test_product_positions_concatenated_or_shared_by_the_batch(kernel):
    """product's positional features are the same for every sequence of a batch: for B > 1 on the CPU
    they enter as a (1, H, rows, Tk) bias per block (blocked path), for B = 1 they are concatenated to
    the features (one SDPA call).  Both equal dense, W_T's gradient (summed over the batch) included,
    and explain names the form."""
    cases = [(2, None, None), (2, "causal", None), (2, None, _key_mask(23)), (1, None, None), (1, "causal", None)]
    for b, filt, km in cases:
        for backend in ("fused", "fused:key_bias=mask"):
            _close(_run(backend, kernel, "product", filt, key_mask=km, b=b),
                   _run("dense", kernel, "product", filt, key_mask=km, b=b))
        q, k, v = _inputs(23, 23, b=b)
        pos = make_position("product", d_model=H * D, n_heads=H, d_head=D).to(DT)
        terms = pos.terms(q, k, *default_positions(23, 23, "cpu", True))
        why = explain(q, k, v, kernel, filt, key_mask=km, terms=terms, backend="fused").reasons["fused"]
        assert ("shared by the batch" in why) == (b > 1)
        assert ("concatenated positional features" in why) == (b == 1)
    # the concatenated form on request, for B > 1 too (how the benchmark compares the two)
    _close(_run("fused:shared_positions=false", kernel, "product", "causal"), _run("dense", kernel, "product", "causal"))
    q, k, v = _inputs(23, 23)
    terms = make_position("product", d_model=H * D, n_heads=H, d_head=D).to(DT).terms(
        q, k, *default_positions(23, 23, "cpu", True))
    why = explain(q, k, v, kernel, None, terms=terms, backend="fused:shared_positions=false").reasons["fused"]
    assert "concatenated positional features" in why


def test_fused_shaw_relative_values():
    for filt in (None, "causal", "local:window=3"):
        ref = _run("dense", "exp", "shaw", filt, value_position="relative")
        _close(_run("fused:block=1024", "exp", "shaw", filt, value_position="relative"), ref)


@pytest.mark.parametrize("position", ["none", "xl", "shaw"])
def test_fused_memory_and_cross_attention(position):
    # Tq < Tk: a Transformer-XL memory in front of the segment (lower-right aligned), then encoder-decoder.
    for filt in ("memory", "memory:same_length=true", "causal"):
        ref = _run("dense", "exp", position, filt, tq=11, tk=29)
        _close(_run("fused:block=1024", "exp", position, filt, tq=11, tk=29), ref)
    ref = _run("dense", "rbf", position, None, tq=11, tk=29, self_attention=False)
    _close(_run("fused", "rbf", position, None, tq=11, tk=29, self_attention=False), ref)


@pytest.mark.parametrize("backend", ["fused", "fused:block=1024", "fused:key_bias=mask", "linear:chunk=5"])
def test_empty_rows_are_zero_with_finite_gradients(backend):
    kernel = "poly" if backend.startswith("linear") else "rbf"
    km = _key_mask(23, empty=True)
    out, grads = _run(backend, kernel, "none", None, key_mask=km)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
    assert not grads[0][0].any()  # no gradient reaches the queries of the empty rows
    _close((out, grads), _run("dense", kernel, "none", None, key_mask=km))


@pytest.mark.parametrize("kernel", ["linear", "poly", "poly:degree=3", "poly:degree=1"])
@pytest.mark.parametrize("filt", [None, "causal", "padding", "causal&padding"])
def test_linear_matches_dense(kernel, filt):
    km = _key_mask(23) if "padding" in str(filt) else None
    ref = _run("dense", kernel, "none", filt, key_mask=km)
    for backend in ("linear", "linear:chunk=5"):
        _close(_run(backend, kernel, "none", filt, key_mask=km), ref, atol=1e-8)


@pytest.mark.parametrize("elements", [1, 2 * 5 * 36])
@pytest.mark.parametrize("filt", ["padding", "causal&padding"])
def test_linear_scans_in_groups_of_slices_match_dense(monkeypatch, elements, filt):
    # poly (F = 36 at D = 8) in blocks of 5 rows: a budget of one slice splits the heads, of two
    # slices (= H) the batch; each group is its own scan and must give what the whole one gives.
    import kernel_attention.backends.linear as linear

    km = _key_mask(23)
    ref = _run("dense", "poly", "none", filt, key_mask=km)
    monkeypatch.setattr(linear, "SCAN_ELEMENTS", elements)
    calls = []
    for name in ("causal_scan", "full_scan"):
        scan = getattr(linear, name)
        monkeypatch.setattr(linear, name, lambda *a, _scan=scan: calls.append(a[0].shape) or _scan(*a))
    _close(_run("linear:chunk=5", "poly", "none", filt, key_mask=km), ref, atol=1e-8)
    assert calls == ([(1, 1, 23, D)] * 4 if elements == 1 else [(1, H, 23, D)] * 2)
    why = explain(*_inputs(23, 23), "poly", filt, backend="linear:chunk=5", key_mask=km).reasons["linear"]
    assert ("in 4 groups of 1 (batch, head) slices" if elements == 1 else "in 2 groups of 2") in why


def test_linear_slices_parameter_sets_the_groups():
    """``linear:slices=N`` groups N (batch, head) slices per scan whatever the element budget (how the
    benchmark compares group sizes): 1 -> four groups, 2 -> two (the batch split), 4 -> one."""
    km = _key_mask(23)
    ref = _run("dense", "poly", "none", "causal&padding", key_mask=km)
    for slices, text in ((1, "in 4 groups of 1 (batch, head) slices"), (2, "in 2 groups of 2"), (4, None)):
        backend = f"linear:chunk=5,slices={slices}"
        _close(_run(backend, "poly", "none", "causal&padding", key_mask=km), ref, atol=1e-8)
        why = explain(*_inputs(23, 23), "poly", "causal", backend=backend).reasons["linear"]
        assert (text in why) if text else ("groups" not in why), why


class _WeightedLinear(ka.Kernel):
    """<a, b>_w = sum_d w_d^2 a_d b_d with a trainable (H, 1, D) w: a per-head parameter whose
    gradient must come back through the scans."""

    name = "weighted_linear"
    positive = False

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, H * D, dtype=DT).view(H, 1, D))

    def kernel(self, q, k):
        return torch.matmul(q * self.w, (k * self.w).transpose(-1, -2))

    def feature_map(self, x):
        return x * self.w


@pytest.mark.parametrize("filt, tq", [("causal", 23), (None, 23), (None, 11)])
def test_linear_scans_pass_gradients_to_kernel_parameters(monkeypatch, filt, tq):
    # causal, full, and full with Tq != Tk (cross-attention)
    import kernel_attention.backends.linear as linear

    monkeypatch.setattr(linear, "SCAN_ELEMENTS", 1)  # per-head parameters: groups keep whole heads
    q, k, v = _inputs(tq, 23)
    got = {}
    for backend in ("dense", "linear:chunk=5"):
        kern = _WeightedLinear()
        out = attention(q, k, v, kern, filt, backend=backend)
        got[backend] = (out, torch.autograd.grad(out, [q, k, v, kern.w], torch.ones_like(out) + out.detach()))
    assert got["dense"][1][3].abs().sum() > 0
    _close(got["linear:chunk=5"], got["dense"], atol=1e-8)


def test_poly_features_are_the_kernel():
    x, y = torch.randn(5, D, dtype=DT), torch.randn(7, D, dtype=DT)
    for degree in (1, 2, 3):
        kern = ka.make_kernel(f"poly:degree={degree}")
        phi = kern.feature_map(x) @ kern.feature_map(y).T
        torch.testing.assert_close(phi, (x @ y.T) ** degree)
    assert ka.make_kernel("poly:degree=2").feature_map(x).shape[-1] == D * (D + 1) // 2
    assert ka.make_kernel("exp").feature_map(x) is None


def test_float32_agrees():
    ref = _run("dense", "exp", "xl", "causal", tq=64, tk=64, dtype=torch.float32)
    _close(_run("fused:block=1024", "exp", "xl", "causal", tq=64, tk=64, dtype=torch.float32), ref, atol=2e-4)
    ref = _run("dense", "periodic", "product", None, tq=64, tk=64, dtype=torch.float32)
    _close(_run("fused", "periodic", "product", None, tq=64, tk=64, dtype=torch.float32), ref, atol=2e-4)


def test_dropout_on_blocked_path_has_consistent_gradients():
    # The dropout mask is redrawn identically in the backward pass: gradcheck with a fixed seed.
    q, k, v = (x.detach()[:1, :1, :9, :4].clone().requires_grad_() for x in _inputs(9, 9))
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

def _choice(kernel, mask=None, t=23, d=D, **kw):
    q, k, v = _inputs(t, t, d=d)
    return explain(q, k, v, kernel, mask, **kw)


def test_auto_picks_the_expected_backend():
    assert _choice("exp").name == "fused"
    assert _choice("rbf", "causal").name == "fused"
    assert _choice("periodic", "local:window=2").name == "fused"
    assert _choice("exp", need_weights=True).name == "dense"
    assert _choice("poly", "causal").name == "dense"  # below the crossover
    assert _choice("linear", "causal", t=300, d=4).name == "linear"
    assert _choice("poly", "causal", t=299, d=24).name == "dense"  # F = 300: crossover at 300 keys
    assert _choice("poly", "causal", t=300, d=24).name == "linear"
    c = _choice("poly", "local:window=2", t=300, d=4)
    assert c.name == "dense"
    assert "neither full, causal nor padding" in c.reasons["linear"]
    assert "direct" in c.reasons["fused"]
    assert "fall-back" in c.reasons["dense"]
    assert "local" in _choice("exp", "local:window=2").reasons["fused"]
    name, reasons = ka.choose_backend(*_inputs(23, 23), "exp")
    assert name == "fused" and set(reasons) == set(BACKENDS.names())


def _problem(kernel, position="none", mask=None, t=23):
    """The backend Problem of one self-attention call (for dispatch rules that take a Problem)."""
    from kernel_attention.functional import build_problem

    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D).to(DT)
    kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(DT).eval()
    q, k, v = _inputs(t, t)
    pq, pk = default_positions(t, t, "cpu", True)
    return build_problem(q, k, v, kern, mask, terms=pos.terms(q, k, pq, pk))


def test_auto_prefers_dense_over_the_blocked_path_on_cuda_where_measured():
    """The CUDA rule (FusedBackend.dense_preferred), checked on CPU problems with the device overridden:
    blocked-only problems that were measured (no SDPA features, xl factors; full / causal / padding)
    within the element budget go to dense; one-call forms, Shaw, product, sparse filters and larger
    problems do not.  On the CPU itself nothing changes (fused keeps them)."""
    from kernel_attention.backends.fused import DENSE_PREFERRED_ELEMENTS, FusedBackend

    fused = FusedBackend()
    for kernel, position, mask in (("ikas", "none", None), ("ikan-direct", "none", "causal"),
                                   ("rbf-only", "none", "causal"), ("exp", "xl", "causal"), ("rbf", "xl", None)):
        p = _problem(kernel, position, mask)
        why = fused.dense_preferred(p, device="cuda")
        assert why is not None and "blocked path" in why, (kernel, position, mask)
        assert fused.dense_preferred(p) is None  # this is a CPU problem
        assert choose(p).name == choose(p, explain=False).name == "fused"
    for kernel, position, mask in (("exp", "none", None), ("rbf", "none", "causal"), ("exp", "shaw", None),
                                   ("exp", "product", None), ("ikas", "none", "local:window=4"),
                                   ("exp", "xl", "local:window=4")):
        assert fused.dense_preferred(_problem(kernel, position, mask), device="cuda") is None, (kernel, position, mask)
    # the element budget: B·H·T² above it keeps the blocked path's memory
    t_max = int((DENSE_PREFERRED_ELEMENTS // (B * H)) ** 0.5)
    assert fused.dense_preferred(_problem("ikas", t=t_max), device="cuda") is not None
    assert fused.dense_preferred(_problem("ikas", t=t_max + 1), device="cuda") is None


def test_unsupported_backend_requests_fail_clearly():
    q, k, v = _inputs(23, 23)
    with pytest.raises(BackendError, match="direct"):
        attention(q, k, v, "poly", backend="fused")
    with pytest.raises(BackendError, match="finite feature map"):
        attention(q, k, v, "exp", backend="linear")
    with pytest.raises(BackendError, match="need_weights"):
        attention(q, k, v, "exp", backend="fused", need_weights=True)
    with pytest.raises(SpecError, match="accepted: auto, dense"):
        attention(q, k, v, "exp", backend="flash")
    out, w = attention(q, k, v, "exp", need_weights=True)  # auto falls back to dense for the weights
    assert w.shape == (B, H, 23, 23)


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
        _close(o, outs[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_backends_agree():
    dev = torch.device("cuda")
    q, k, v = (x.detach().to(dev).float().requires_grad_() for x in _inputs(64, 64))
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
    _close(_run("fused:block=1024", kernel, "none", "causal"), _run("dense", kernel, "none", "causal"))


IMPLICIT = ["ikas", "ikans", "ikan", "mikan", "ikan-direct"]


@pytest.mark.parametrize("kernel", IMPLICIT)
def test_fused_squared_path_matches_dense(kernel):
    """The implicit kernels run as k / sum k per block (backends/squared.py): values and gradients
    (the spectral density's or ikan-direct's points included) equal dense's under a full, causal,
    sparse, padding (one sequence keeping no key) and causal & padding filter, and for Tq != Tk."""
    cases = ((None, None, 23), ("causal", None, 23), ("local:window=4", None, 23),
             (None, _key_mask(23, empty=True), 23), ("causal", _key_mask(23), 23), (None, None, 11))
    for filt, km, tq in cases:
        q, k, v = _inputs(tq, 23)
        kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(DT).eval()
        why = explain(q, k, v, kern, filt, key_mask=km, backend="fused:block=1024").reasons["fused"]
        assert "k / sum k" in why and "blocked SDPA" not in why, (filt, why)
        _close(_run("fused:block=1024", kernel, "none", filt, key_mask=km, tq=tq),
               _run("dense", kernel, "none", filt, key_mask=km, tq=tq))


def test_fused_squared_path_in_training_draws_the_spectral_points_once():
    """In training the R spectral points are sampled per call (in eval mode they are all the posterior
    mean): the squared path draws them once, as dense does -- same output, gradients (the density's
    parameters included) and KL for the same seed."""
    q, k, v = _inputs(23, 23)
    kern = ka.make_kernel("mikan", n_heads=H, d_head=D).to(DT).train()
    params = [q, k, v] + [w for w in kern.parameters() if w.requires_grad]
    res = []
    for backend in ("dense", "fused"):
        torch.manual_seed(5)
        out = attention(q, k, v, kern, "causal", backend=backend)
        grads = torch.autograd.grad(out, params, torch.ones_like(out) + out.detach(), allow_unused=True)
        res.append(((out, grads), kern.regularization()))
    _close(res[1][0], res[0][0])
    torch.testing.assert_close(res[0][1], res[1][1], atol=0, rtol=0)


def test_fused_squared_path_range_and_fallbacks():
    """The per-key factor exp(m_j) is taken relative to the largest m of the keys some query keeps:
    a huge key that every query drops does not underflow the others (float32 checked against float64
    dense); a kept key 40+ log-units above the rest sends the call to the soft-max path, which explain
    says; ``squared=false`` and bfloat16 as documented."""
    q, k, v = _inputs(23, 23)
    km = _key_mask(23)
    k_big = k.detach().clone()
    k_big[1, :, -1] *= 10.0   # sequence 1's last key is padding: ||k||^2 / (2 sqrt(d)) about 140 above the rest
    kern = ka.make_kernel("ikas", n_heads=H, d_head=D).eval()
    ref = attention(q, k_big, v, kern.to(DT), None, key_mask=km, backend="dense")
    kern = kern.float()
    args = (q.detach().float(), k_big.float(), v.detach().float())
    assert "k / sum k" in explain(*args, kern, None, key_mask=km, backend="fused").reasons["fused"]
    out = attention(*args, kern, None, key_mask=km, backend="fused")
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
    # the same key kept: the soft-max path, still equal to dense
    why = explain(*args, kern, None, backend="fused").reasons["fused"]
    assert "blocked SDPA" in why and "squared form is not used: the per-key log factor spans" in why
    torch.testing.assert_close(attention(*args, kern, None, backend="fused").double(),
                               attention(q, k_big, v, kern.to(DT), None, backend="dense"), atol=1e-5, rtol=1e-4)
    kern = kern.float()
    why = explain(*args, kern, "causal", backend="fused:squared=false").reasons["fused"]
    assert "squared form is not used: squared=false" in why
    # bfloat16 inputs: the same path, within bfloat16's precision of float64 dense
    qb, kb, vb = (x.detach().to(torch.bfloat16) for x in (q, k, v))
    assert "k / sum k" in explain(qb, kb, vb, kern.to(torch.bfloat16), "causal", backend="fused").reasons["fused"]
    out = attention(qb, kb, vb, kern.to(torch.bfloat16), "causal", backend="fused")
    ref = attention(qb.double(), kb.double(), vb.double(), kern.to(DT), "causal", backend="dense")
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


def test_flex_score_mod_forward_matches_dense_on_cpu():
    # FlexAttention has no backward on CPU, so the backend never picks it there; its score_mod and
    # block mask are still checked here, forward only, in eager mode, on the features the backend
    # passes it (positional features concatenated): Shaw's clipped index computed in the kernel
    # (self-attention), gathered from the index (a memory in front of the segment), product, key bias.
    from kernel_attention.backends.flex import flex_smoother, flex_why_not
    from kernel_attention.backends.fused import sdpa_features
    from kernel_attention.functional import build_problem
    from kernel_attention.smoother import dense_smoother

    for kernel, position, filt, tq, tk in (("rbf", "shaw", "causal", 32, 32), ("exp", "shaw:clip=3", None, 32, 32),
                                           ("exp", "shaw", "memory", 16, 32),
                                           ("periodic", "product", "local:window=5", 32, 32)):
        q, k, v = (x.detach().float() for x in _inputs(tq, tk))
        pos = make_position(position, d_model=H * D, n_heads=H, d_head=D)
        pq, pk = default_positions(tq, tk, "cpu", True)
        with torch.no_grad():
            p = build_problem(q, k, v, kernel, filt, terms=pos.terms(q, k, pq, pk))
            assert flex_why_not(p) is not None and flex_why_not(p, allow_cpu=True) is None
            out = flex_smoother(p, *sdpa_features(p, key_bias="mask"))
            ref, _ = dense_smoother(q, k, v, p.kernel, p.keep, p.terms)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
@pytest.mark.parametrize("filt", [None, "causal"])
@pytest.mark.parametrize("clip", [1, 3])
def test_shaw_banded_path_matches_dense(kernel, filt, clip):
    """Shaw's clipped table as shifted causal SDPA calls plus a band (backends/banded.py): values and
    gradients (q, k, v, the table) equal dense and the blocked path; explain names the path."""
    position = f"shaw:clip={clip}"
    ref = _run("dense", kernel, position, filt, tq=29, tk=29)
    _close(_run("fused", kernel, position, filt, tq=29, tk=29), ref)
    _close(_run("fused:banded=false,block=1024", kernel, position, filt, tq=29, tk=29), ref)
    q, k, v = _inputs(29, 29)
    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D).to(DT)
    terms = pos.terms(q, k, *default_positions(29, 29, "cpu", True))
    assert f"shaw clipped at {clip}" in str(explain(q, k, v, kernel=kernel, mask=filt, terms=terms, backend="fused"))
    assert "shaw clipped" not in str(explain(q, k, v, kernel=kernel, mask=filt, terms=terms,
                                             backend="fused:banded=false"))


def test_shaw_banded_path_not_taken_where_it_does_not_apply():
    """Padding, a short sequence (T <= 4 clip), a memory in front of the segment or a relative value table
    leave the banded path (and the blocked path still agrees with dense)."""
    q, k, v = _inputs(29, 29)
    pos = make_position("shaw:clip=3", d_model=H * D, n_heads=H, d_head=D).to(DT)
    terms = pos.terms(q, k, *default_positions(29, 29, "cpu", True))
    km = _key_mask(29)
    assert "shaw clipped" not in str(explain(q, k, v, kernel="exp", key_mask=km, terms=terms, backend="fused"))
    short = pos.terms(q[..., :12, :], k[..., :12, :], *default_positions(12, 12, "cpu", True))
    assert "shaw clipped" not in str(explain(q[..., :12, :], k[..., :12, :], v[..., :12, :], kernel="exp",
                                             terms=short, backend="fused"))
    mem = pos.terms(q[..., 9:, :], k, *default_positions(20, 29, "cpu", True))
    assert "shaw clipped" not in str(explain(q[..., 9:, :], k, v, kernel="exp", terms=mem, backend="fused"))
    _close(_run("fused", "exp", "shaw:clip=3", "padding", tq=29, tk=29, key_mask=km),
           _run("dense", "exp", "shaw:clip=3", "padding", tq=29, tk=29, key_mask=km))
    _close(_run("fused", "exp", "shaw:clip=3", "causal", tq=29, tk=29, value_position="relative"),
           _run("dense", "exp", "shaw:clip=3", "causal", tq=29, tk=29, value_position="relative"))


def test_flex_block_masks_are_kept_for_spec_filters_only():
    """A BlockMask is built once per (filter spec, Tq, Tk, device); masks that depend on the batch's
    padding or on a user's tensor are built per call."""
    from kernel_attention.backends.flex import _BLOCK_MASKS, _block_mask
    from kernel_attention.filters import MaskFilter, Padding, make_filter
    from kernel_attention.functional import build_problem
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v = (x.detach().float() for x in _inputs(32, 32))
    _BLOCK_MASKS.clear()
    first = _block_mask(build_problem(q, k, v, "exp", "local:window=5"), create_block_mask)
    assert _block_mask(build_problem(q, k, v, "exp", "local:window=5"), create_block_mask) is first
    assert _block_mask(build_problem(q, k, v, "exp", "local:window=6"), create_block_mask) is not first
    assert len(_BLOCK_MASKS) == 2
    _block_mask(build_problem(q, k, v, "exp", "causal", key_mask=_key_mask(32)), create_block_mask)
    _block_mask(build_problem(q, k, v, "exp", torch.ones(32, 32, dtype=torch.bool).tril()), create_block_mask)
    assert len(_BLOCK_MASKS) == 2
    assert make_filter("causal&local:window=3").by_spec and make_filter("cross").by_spec
    assert not make_filter("padding").by_spec and not make_filter("causal&padding").by_spec
    assert not Padding(_key_mask(32)).by_spec and not MaskFilter(torch.ones(32, 32, dtype=torch.bool)).by_spec
    assert not (make_filter("causal") | MaskFilter(torch.ones(32, 32, dtype=torch.bool))).by_spec


def test_fused_describes_the_path_it_runs(monkeypatch):
    """describe and run share one decision (FusedBackend._route): a key bias has a one-call form only
    without dropout (KeyBiasSDPA takes none), so with dropout both name and take the blocked path."""
    import kernel_attention.backends.fused as fused

    blocked = []
    real = fused.chunked_smoother
    monkeypatch.setattr(fused, "chunked_smoother", lambda *a, **kw: blocked.append(1) or real(*a, **kw))
    q, k, v = _inputs(23, 23)
    for dropout, path in ((0.0, "one SDPA call on rbf key bias"),
                          (0.1, "blocked SDPA, 1 blocks of 23 query rows; the key bias has a one-call form only")):
        blocked.clear()
        why = explain(q, k, v, "rbf", None, backend="fused:key_bias=mask", dropout_p=dropout).reasons["fused"]
        attention(q, k, v, "rbf", None, backend="fused:key_bias=mask", dropout_p=dropout)
        assert path in why and bool(blocked) == (dropout > 0), (dropout, why)


def test_attention_takes_the_backend_explain_names():
    """attention() skips gathering reasons (explain=False); it must still pick what explain reports."""
    from kernel_attention.backends import choose
    from kernel_attention.functional import build_problem

    for kernel, mask, t, d in (("exp", None, 23, D), ("poly", "causal", 23, D), ("poly", "causal", 460, 24),
                               ("linear", "local:window=2", 23, D), ("rbf", "causal", 23, D)):
        q, k, v = _inputs(t, t, d=d)
        p = build_problem(q, k, v, kernel, mask)
        assert choose(p, explain=False).name == choose(p).name == explain(q, k, v, kernel, mask).name
    p = build_problem(*_inputs(23, 23), "exp", need_weights=True)
    assert choose(p, explain=False).name == "dense"
