"""The dispatcher picks the expected backend, says why, and runs what ``explain`` names; unsupported
requests fail clearly."""

import pytest
from _common import B, D, DT, H, inputs

import kernel_attention as ka
from kernel_attention.backends import BACKENDS, BackendError, choose
from kernel_attention.functional import attention, explain
from kernel_attention.positions import default_positions, make_position
from kernel_attention.registry import SpecError

def _choice(kernel, mask=None, t=23, d=D, **kw):
    q, k, v = inputs(t, t, d=d)
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
    name, reasons = ka.choose_backend(*inputs(23, 23), "exp")
    assert name == "fused" and set(reasons) == set(BACKENDS.names())


def _problem(kernel, position="none", mask=None, t=23):
    """The backend Problem of one self-attention call (for dispatch rules that take a Problem)."""
    from kernel_attention.functional import build_problem

    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D).to(DT)
    kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(DT).eval()
    q, k, v = inputs(t, t)
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
    q, k, v = inputs(23, 23)
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



def test_fused_describes_the_path_it_runs(monkeypatch):
    """describe and run share one decision (FusedBackend._route): a key bias has a one-call form only
    without dropout (KeyBiasSDPA takes none), so with dropout both name and take the blocked path."""
    import kernel_attention.backends.fused as fused

    blocked = []
    real = fused.chunked_smoother
    monkeypatch.setattr(fused, "chunked_smoother", lambda *a, **kw: blocked.append(1) or real(*a, **kw))
    q, k, v = inputs(23, 23)
    for dropout, path in ((0.0, "one SDPA call on rbf key bias"),
                          (0.1, "blocked SDPA, 1 blocks of 23 query rows; the key bias has a one-call form only")):
        blocked.clear()
        why = explain(q, k, v, "rbf", None, backend="fused:key_bias=mask", dropout_p=dropout).reasons["fused"]
        attention(q, k, v, "rbf", None, backend="fused:key_bias=mask", dropout_p=dropout)
        assert path in why and bool(blocked) == (dropout > 0), (dropout, why)


def test_large_calls_with_dropout_leave_sdpa_math_path_on_cpu(monkeypatch):
    """SDPA's CPU flash kernel takes no dropout, so above DROPOUT_BLOCKED_ELEMENTS (B, H, Tq, Tk) elements a
    call with dropout runs (and says it runs) on the blocked path; smaller calls and calls without dropout keep
    one SDPA call.  The threshold is lowered so that the test runs on small tensors; the rule counts the batch."""
    import torch

    import kernel_attention.backends.fused as fused

    blocked = []
    real = fused.chunked_smoother
    monkeypatch.setattr(fused, "chunked_smoother", lambda *a, **kw: blocked.append(1) or real(*a, **kw))
    monkeypatch.setattr(fused, "DROPOUT_BLOCKED_ELEMENTS", 48 * 48)
    for b, t, dropout, path in ((1, 48, 0.1, "one SDPA call"), (1, 49, 0.0, "one SDPA call"),
                                (1, 49, 0.1, "above 2304 (B, H, Tq, Tk) elements (here 2401), blocks are faster"),
                                (2, 34, 0.1, "above 2304 (B, H, Tq, Tk) elements (here 2312), blocks are faster")):
        q, k, v = (torch.randn(b, 1, t, 4) for _ in range(3))
        blocked.clear()
        why = explain(q, k, v, "exp", "causal", dropout_p=dropout).reasons["fused"]
        out = attention(q, k, v, "exp", "causal", dropout_p=dropout)
        assert path in why and bool(blocked) == (path != "one SDPA call"), (b, t, dropout, why)
        assert torch.isfinite(out).all()


def test_attention_takes_the_backend_explain_names():
    """attention() skips gathering reasons (explain=False); it must still pick what explain reports."""
    from kernel_attention.backends import choose
    from kernel_attention.functional import build_problem

    for kernel, mask, t, d in (("exp", None, 23, D), ("poly", "causal", 23, D), ("poly", "causal", 460, 24),
                               ("linear", "local:window=2", 23, D), ("rbf", "causal", 23, D)):
        q, k, v = inputs(t, t, d=d)
        p = build_problem(q, k, v, kernel, mask)
        assert choose(p, explain=False).name == choose(p).name == explain(q, k, v, kernel, mask).name
    p = build_problem(*inputs(23, 23), "exp", need_weights=True)
    assert choose(p, explain=False).name == "dense"
