"""The dispatcher picks the expected backend, says why, and runs what ``explain`` names; unsupported
requests fail clearly."""

import dataclasses
import re

import pytest
import torch
from _common import B, D, DT, H, inputs

import kernel_attention as ka
from kernel_attention.backends import BACKENDS, ORDER, POLICIES, BackendError, choose, linear_crossover
from kernel_attention.backends.blockwise import BlockwiseBackend
from kernel_attention.backends.squared import SquaredBackend
from kernel_attention.functional import attention, explain
from kernel_attention.positions import default_positions, make_position
from kernel_attention.registry import SpecError

def _choice(kernel, mask=None, t=23, d=D, **kw):
    q, k, v = inputs(t, t, d=d)
    return explain(q, k, v, kernel, mask, **kw)


def test_auto_picks_the_expected_backend():
    assert _choice("exp").name == "sdpa"
    assert _choice("rbf", "causal").name == "sdpa"
    assert _choice("periodic", "local:window=2").name == "blockwise"
    assert _choice(ka.make_kernel("ikas", n_heads=H, d_head=D), "causal").name == "squared"
    assert _choice("exp", need_weights=True).name == "dense"
    assert _choice("poly", "causal").name == "dense"  # below the crossover
    assert _choice("linear", "causal", t=300, d=4).name == "linear"
    assert _choice("poly", "causal", t=299, d=24).name == "dense"  # F = 300: crossover at 300 keys
    assert _choice("poly", "causal", t=300, d=24).name == "linear"
    assert "below its crossover with dense (300 keys for F=300)" in _choice("poly", "causal", t=299, d=24).reasons["linear"]
    assert linear_crossover(300, "cpu") == 300 and linear_crossover(64, "cpu") == 256
    assert linear_crossover(64, "cuda") == 4096 and linear_crossover(4096, "cuda") == 4 * 4096
    c = _choice("poly", "local:window=2", t=300, d=4)
    assert c.name == "dense"
    assert "neither full, causal nor padding" in c.reasons["linear"]
    assert "direct" in c.reasons["blockwise"]
    assert c.reasons["dense"].startswith("chosen")
    assert "local" in _choice("exp", "local:window=2").reasons["blockwise"]
    assert "neither full, causal (Tq = Tk), padding nor causal with padding" in _choice("exp", "local:window=2").reasons["sdpa"]
    name, reasons = ka.choose_backend(*inputs(23, 23), "exp")
    assert name == "sdpa" and list(reasons) == list(ORDER)


def test_a_full_filter_with_a_key_mask_runs_as_padding():
    """``KernelAttention``'s default filter is ``full``: with a batch's padding it is the key mask's (B, 1, 1, Tk),
    one fused call (SDPA, or the linear backend on a direct kernel), not a (B, 1, Tq, Tk) mask for blockwise."""
    q, k, v = inputs(23, 23)
    key_mask = torch.ones(B, 23, dtype=torch.bool)
    key_mask[0, 17:] = False
    for mask in (None, "full", ka.make_filter("full")):
        c = explain(q, k, v, "exp", mask, key_mask=key_mask)
        assert c.name == "sdpa" and c.reasons["sdpa"].endswith("padding mask"), (mask, c.reasons["sdpa"])
        torch.testing.assert_close(attention(q, k, v, "exp", mask, key_mask=key_mask),
                                   attention(q, k, v, "exp", mask, key_mask=key_mask, backend="dense"))
    assert explain(q, k, v, "linear", "full", key_mask=key_mask, backend="linear").name == "linear"


@pytest.mark.parametrize("kernel,backend", [("exp", "auto"), ("rbf", "auto"), ("rbf", "sdpa:key_bias=mask")])
def test_causal_with_padding_runs_on_sdpa_up_to_the_policys_keys(kernel, backend):
    """A decoder's batch: the causal filter and a key mask, as one SDPA call on the formed (B, 1, Tq, Tk) mask up
    to the policy's ``sdpa_mask_max_keys`` (CPU: 512), with the values and gradients of dense; a row with no key
    (left padding, an empty sequence) gives zeros and zero gradient."""
    t = 9
    q, k, v = (x.requires_grad_() for x in inputs(t, t))
    key_mask = torch.ones(B, t, dtype=torch.bool)
    key_mask[0, 6:] = False
    key_mask[1, :2] = False
    assert explain(q, k, v, kernel, "causal", key_mask=key_mask, backend=backend).name == "sdpa"
    grads = []
    for be in (backend, "dense"):
        out = attention(q, k, v, kernel, "causal", key_mask=key_mask, backend=be)
        grads.append((out,) + torch.autograd.grad((out * out.detach().cos()).sum(), (q, k, v)))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    assert grads[0][0][1, :, :2].abs().max() == 0 and grads[0][1][1, :, :2].abs().max() == 0
    assert POLICIES["cpu"].sdpa_mask_max_keys == 512 and POLICIES["cuda"].sdpa_mask_max_keys is None
    q, k, v = inputs(513, 513)
    c = explain(q, k, v, kernel, "causal", key_mask=torch.ones(B, 513, dtype=torch.bool))
    assert c.name != "sdpa" and "above 512 keys (here 513)" in c.reasons["sdpa"]


class _SdpaInputs(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the query dtype of each fused attention forward that runs (after autocast's casts)."""

    def __init__(self):
        super().__init__()
        self.dtypes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if "scaled_dot_product" in name and "backward" not in name:
            self.dtypes.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("how", ["bf16 inputs", "autocast"])
@pytest.mark.parametrize("kernel, backend", [("exp", "auto"), ("rbf", "sdpa:key_bias=mask")])
def test_reduced_precision_with_gradients_runs_sdpa_in_float32_up_to_the_policys_keys(how, kernel, backend):
    """bfloat16 (the inputs, or CPU autocast over float32 ones) with gradients: one float32 SDPA call up to the
    policy's ``sdpa_float32_max_keys`` (CPU: 256), its output cast back to bfloat16, values and gradients those
    of dense in float32 to bfloat16's precision; without gradients, or above the limit, the bfloat16 call.
    So too for rbf's key bias as the fused kernel's mask (its own backward)."""
    assert POLICIES["cpu"].sdpa_float32_max_keys == 256 and POLICIES["cuda"].sdpa_float32_max_keys is None
    bf16 = how == "bf16 inputs"
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=not bf16)

    def padding(t):
        key_mask = torch.ones(B, t, dtype=torch.bool)
        key_mask[0, t // 2:] = False
        return key_mask

    def run(t, grad=True):
        x = [y.detach().to(torch.bfloat16 if bf16 else torch.float32).requires_grad_(grad) for y in inputs(t, t)]
        seen = _SdpaInputs()
        with amp, seen:
            out = attention(*x, kernel, "causal", key_mask=padding(t), backend=backend)
            c = explain(*x, kernel, "causal", key_mask=padding(t), backend=backend)
        return x, out, seen.dtypes, c

    (q, k, v), out, seen, c = run(12)
    assert seen == [torch.float32] and out.dtype == torch.bfloat16, seen
    assert c.name == "sdpa" and c.reasons["sdpa"].endswith(", in float32 (not bfloat16)")
    grads = torch.autograd.grad(out.float().pow(2).sum(), (q, k, v))
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = attention(*ref_in, kernel, "causal", key_mask=padding(12), backend="dense")
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1.6e-2)
    for g, r in zip(grads, torch.autograd.grad(ref.pow(2).sum(), ref_in)):
        assert g.dtype == q.dtype
        torch.testing.assert_close(g.float(), r, atol=3e-2, rtol=3e-2)
    for kw in ({"t": 12, "grad": False}, {"t": 257}):
        _, out, seen, c = run(**kw)
        assert seen == [torch.bfloat16] and out.dtype == torch.bfloat16, (kw, seen)
        assert c.name == "sdpa" and "float32" not in c.reasons["sdpa"]


def test_explain_names_every_backend_in_order_with_a_reason():
    """explain lists the backends of ORDER in order: the ones before the chosen say why they do not run the
    call, the chosen says how it runs it, the ones after say whether they could."""
    named = ("sdpa", "flex", "banded", "squared", "blockwise", "linear", "dense")
    assert ORDER[0] == "sdpa" and ORDER[-1] == "dense" and [n for n in ORDER if n in named] == list(named)
    assert set(ORDER) == set(BACKENDS.names())
    c = _choice("exp", "local:window=4")
    assert c.name == "blockwise" and list(c.reasons) == list(ORDER)
    assert all(isinstance(r, str) and r for r in c.reasons.values())
    assert "CUDA only" in c.reasons["flex"] and "shaw" in c.reasons["banded"]
    assert "no squared form" in c.reasons["squared"]
    assert c.reasons["blockwise"].startswith("chosen: ") and "1 block of 23 query rows" in c.reasons["blockwise"]
    assert c.reasons["linear"].startswith("after blockwise, which runs the call; this one: ")
    assert c.reasons["dense"] == "after blockwise, which runs the call; this one could too"
    text = str(c)
    assert text.splitlines()[0] == "backend: blockwise"
    assert [line.split(":")[0].strip() for line in text.splitlines()[1:]] == list(ORDER)
    # by name: the others are "not requested", the requested one says how it runs the call
    c = _choice("exp", backend="blockwise:block=1024")
    assert c.name == "blockwise" and c.reasons["blockwise"].startswith("requested; ")
    assert all(c.reasons[n] == "not requested" for n in ORDER if n != "blockwise")
    # while torch.compile traces, the backends that cannot be traced are passed over
    untraceable = [n for n in ORDER if not BACKENDS.create(n).traceable]
    assert {"banded", "squared", "blockwise", "linear"} <= set(untraceable)
    assert not {"sdpa", "flex", "dense"} & set(untraceable)


def _problem(kernel, position="none", mask=None, t=23):
    """The backend Problem of one self-attention call (for dispatch rules that take a Problem)."""
    from kernel_attention.functional import build_problem

    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D).to(DT)
    kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(DT).eval()
    q, k, v = inputs(t, t)
    pq, pk = default_positions(t, t, "cpu", True)
    return build_problem(q, k, v, kern, mask, terms=pos.terms(q, k, pq, pk))


def test_auto_prefers_dense_over_blockwise_on_cuda_where_measured(monkeypatch):
    """The CUDA policy's rule (BlockwiseBackend.declines), checked on CPU problems under CUDA's policy:
    problems blockwise alone runs that were measured (no SDPA features, xl factors; full / causal / padding)
    within the element budget go to dense (those of squared's kernels to squared, which supports the CPU
    device); one-call forms, Shaw, product, sparse filters and larger problems do not.  Under the CPU's
    policy nothing is declined."""
    blockwise = BlockwiseBackend()
    cases = (("ikas", "none", None), ("ikan-direct", "none", "causal"), ("rbf-only", "none", "causal"),
             ("exp", "xl", "causal"), ("rbf", "xl", None))
    for kernel, position, mask in cases:
        p = _problem(kernel, position, mask)
        assert blockwise.declines(p) is None  # the CPU policy
        assert choose(p).name == choose(p, explain=False).name in ("squared", "blockwise")
    monkeypatch.setitem(POLICIES, "cpu", POLICIES["cuda"])
    for kernel, position, mask in cases:
        p = _problem(kernel, position, mask)
        why = blockwise.declines(p)
        assert why is not None and "launch-bound" in why, (kernel, position, mask)
        expected = "squared" if kernel in ("ikas", "ikan-direct") else "dense"
        c = choose(p)
        assert c.name == choose(p, explain=False).name == expected, c
        assert "declined: its blocks are launch-bound" in c.reasons["blockwise"], c
    for kernel, position, mask in (("exp", "none", None), ("rbf", "none", "causal"), ("exp", "shaw", None),
                                   ("exp", "product", None), ("ikas", "none", "local:window=4"),
                                   ("exp", "xl", "local:window=4")):
        assert blockwise.declines(_problem(kernel, position, mask)) is None, (kernel, position, mask)
    # the element budget: B·H·T² above it keeps blockwise's memory
    t_max = int((POLICIES["cuda"].dense_preferred_elements // (B * H)) ** 0.5)
    assert blockwise.declines(_problem("ikas", t=t_max)) is not None
    assert blockwise.declines(_problem("ikas", t=t_max + 1)) is None


def test_triton_rules_under_cudas_policy():
    """``auto_declines`` (TritonBackend.declines on CUDA), checked on CPU problems under CUDA's policy, which lets
    ``auto`` take triton: dense keeps what the policy measured it faster at (kernels without SDPA features, full /
    causal / padding, within the element budget), FlexAttention the sparse filters without positional terms;
    Shaw's terms, Transformer-XL's (within dense's budget too), sparse filters with terms and the implicit kernels
    past the budget go to triton.  Without ``triton_auto`` every call is passed over, with the reason."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from kernel_attention.backends.triton_flash import auto_declines

    on = POLICIES["cuda"]
    assert on.triton_auto and not POLICIES["cpu"].triton_auto
    off = dataclasses.replace(on, triton_auto=False)
    assert "not passed their tests" in auto_declines(_problem("exp", "shaw", "causal"), off)
    for kernel, position, mask in (("ikas", "none", None), ("rbf-only", "none", "causal")):
        assert "dense was faster" in auto_declines(_problem(kernel, position, mask), on), (kernel, position, mask)
    for mask in ("local:window=4", "strided:stride=4"):
        assert "FlexAttention" in auto_declines(_problem("exp", "none", mask), on), mask
    t_max = int((on.dense_preferred_elements // (B * H)) ** 0.5)
    for kernel, position, mask, t in (("exp", "shaw", "causal", 23), ("exp", "shaw", "local:window=4", 23),
                                      ("exp", "xl", "causal", 23), ("exp", "xl", None, 23),
                                      ("exp", "xl", "local:window=4", 23), ("ikas", "none", "local:window=4", 23),
                                      ("ikas", "none", None, t_max + 1), ("exp", "xl", "causal", t_max + 1)):
        assert auto_declines(_problem(kernel, position, mask, t=t), on) is None, (kernel, position, mask, t)


def test_magnitude_dropout_rules_by_policy(monkeypatch):
    """A kernel that draws magnitude dropout (training) stays on dense up to the policy's element counts:
    squared_dropout_dense_elements for squared, dropout_blocked_elements for blockwise; the CUDA policy keeps
    neither."""
    kern = ka.make_kernel("ikan-direct:official=true", n_heads=H, d_head=D).to(DT).train()
    q, k, v = inputs(23, 23)
    from kernel_attention.functional import build_problem

    p = build_problem(q, k, v, kern, "causal")
    assert "draws magnitude dropout" in SquaredBackend().declines(p)
    assert "draws magnitude dropout" in BlockwiseBackend().declines(p)
    assert choose(p).name == "dense"
    monkeypatch.setitem(POLICIES, "cpu", dataclasses.replace(POLICIES["cpu"], squared_dropout_dense_elements=0))
    assert SquaredBackend().declines(p) is None and choose(p).name == "squared"
    monkeypatch.setitem(POLICIES, "cpu", POLICIES["cuda"])
    assert SquaredBackend().declines(p) is None
    assert "magnitude dropout" not in BlockwiseBackend().declines(p)  # only CUDA's launch-bound rule


def test_unsupported_backend_requests_fail_clearly():
    q, k, v = inputs(23, 23)
    with pytest.raises(BackendError, match="direct"):
        attention(q, k, v, "poly", backend="blockwise")
    with pytest.raises(BackendError, match="no SDPA features"):
        attention(q, k, v, "poly", backend="sdpa")
    with pytest.raises(BackendError, match="finite feature map"):
        attention(q, k, v, "exp", backend="linear")
    with pytest.raises(BackendError, match="CUDA only"):
        attention(q, k, v, "exp", backend="flex")
    with pytest.raises(BackendError, match="no squared form"):
        attention(q, k, v, "exp", backend="squared")
    with pytest.raises(BackendError, match="shaw"):
        attention(q, k, v, "exp", backend="banded")
    for backend in ("sdpa", "blockwise", "squared", "banded", "linear"):
        with pytest.raises(BackendError, match="need_weights"):
            kernel = ka.make_kernel("ikas", n_heads=H, d_head=D).to(q.dtype) if backend == "squared" else "exp"
            attention(q, k, v, kernel, backend=backend, need_weights=True)
    accepted = re.escape("accepted: auto, " + ", ".join(ORDER))
    for name in ("flash", "fused", "fused:key_bias=mask"):  # fused: the old single backend, gone
        with pytest.raises(SpecError, match=accepted):
            attention(q, k, v, "exp", backend=name)
    out, w = attention(q, k, v, "exp", need_weights=True)  # auto falls back to dense for the weights
    assert w.shape == (B, H, 23, 23)



def test_backends_describe_what_they_run(monkeypatch):
    """What explain names is what attention runs: rbf's key bias as sdpa's mask is one call without dropout
    and refused with it (KeyBiasSDPA takes none); with dropout auto keeps sdpa with the key bias as a feature;
    blockwise asked by name runs its blocks (its chunked_smoother)."""
    import kernel_attention.backends.blockwise as blockwise

    blocked = []
    real = blockwise.chunked_smoother
    monkeypatch.setattr(blockwise, "chunked_smoother", lambda *a, **kw: blocked.append(1) or real(*a, **kw))
    q, k, v = inputs(23, 23)
    for backend, dropout, name, says in (("sdpa:key_bias=mask", 0.0, "sdpa", "one scaled_dot_product_attention call on rbf key bias"),
                                         ("auto", 0.1, "sdpa", "one scaled_dot_product_attention call on rbf features"),
                                         ("auto", 0.0, "sdpa", "one scaled_dot_product_attention call on rbf features"),
                                         ("blockwise", 0.1, "blockwise", "1 block of 23 query rows, SDPA features per block"),
                                         ("blockwise", 0.0, "blockwise", "1 block of 23 query rows, SDPA features per block")):
        blocked.clear()
        c = explain(q, k, v, "rbf", None, backend=backend, dropout_p=dropout)
        attention(q, k, v, "rbf", None, backend=backend, dropout_p=dropout)
        assert c.name == name and says in c.reasons[name], (backend, dropout, c)
        assert bool(blocked) == (name == "blockwise"), (backend, dropout)
    with pytest.raises(BackendError, match="without dropout only"):
        attention(q, k, v, "rbf", None, backend="sdpa:key_bias=mask", dropout_p=0.1)


def test_large_calls_with_dropout_leave_sdpa_on_cpu(monkeypatch):
    """SDPA's CPU flash kernel takes no dropout, so above the policy's dropout_blocked_elements (B, H, Tq, Tk)
    elements sdpa declines a call with dropout and auto runs it on blockwise (and says so); smaller calls and
    calls without dropout keep one SDPA call.  The threshold is lowered so that the test runs on small tensors;
    the rule counts the batch."""
    import torch

    import kernel_attention.backends.blockwise as blockwise

    blocked = []
    real = blockwise.chunked_smoother
    monkeypatch.setattr(blockwise, "chunked_smoother", lambda *a, **kw: blocked.append(1) or real(*a, **kw))
    monkeypatch.setitem(POLICIES, "cpu", dataclasses.replace(POLICIES["cpu"], dropout_blocked_elements=48 * 48))
    for b, t, dropout, declined in ((1, 48, 0.1, None), (1, 49, 0.0, None),
                                    (1, 49, 0.1, "above 2304 (B, H, Tq, Tk) elements (here 2401) blockwise is faster"),
                                    (2, 34, 0.1, "above 2304 (B, H, Tq, Tk) elements (here 2312) blockwise is faster")):
        q, k, v = (torch.randn(b, 1, t, 4) for _ in range(3))
        blocked.clear()
        c = explain(q, k, v, "exp", "causal", dropout_p=dropout)
        out = attention(q, k, v, "exp", "causal", dropout_p=dropout)
        if declined is None:
            assert c.name == "sdpa" and "one scaled_dot_product_attention call" in c.reasons["sdpa"], c
        else:
            assert c.name == "blockwise" and c.reasons["sdpa"].startswith("declined: with dropout"), c
            assert declined in c.reasons["sdpa"], c
        assert bool(blocked) == (declined is not None), (b, t, dropout, c)
        assert torch.isfinite(out).all()
        # asked by name, sdpa runs it: the policy is auto's
        assert explain(q, k, v, "exp", "causal", dropout_p=dropout, backend="sdpa").name == "sdpa"


def test_attention_takes_the_backend_explain_names(monkeypatch):
    """attention() skips gathering reasons (explain=False); it must still run what explain reports (each backend's
    run wrapped to record its name)."""
    from kernel_attention.backends import BACKENDS, choose
    from kernel_attention.backends.dispatch import resolve_backend
    from kernel_attention.functional import build_problem

    ran = []
    for name in BACKENDS.names():
        cls = type(resolve_backend(name))
        monkeypatch.setattr(cls, "run", lambda self, p, _run=cls.run, _name=name: ran.append(_name) or _run(self, p))
    for kernel, mask, t, d in (("exp", None, 23, D), ("poly", "causal", 23, D), ("poly", "causal", 460, 24),
                               ("linear", "local:window=2", 23, D), ("rbf", "causal", 23, D),
                               ("periodic", "local:window=2", 23, D),
                               (ka.make_kernel("ikas", n_heads=H, d_head=D).double(), "causal", 23, D),
                               ("rbf-only", None, 23, D)):
        q, k, v = inputs(t, t, d=d)
        p = build_problem(q, k, v, kernel, mask)
        named = explain(q, k, v, kernel, mask).name
        assert choose(p, explain=False).name == choose(p).name == named
        ran.clear()
        ka.attention(q, k, v, kernel, mask)
        assert ran == [named], (kernel, mask, ran)
    p = build_problem(*inputs(23, 23), "exp", need_weights=True)
    assert choose(p, explain=False).name == "dense"
