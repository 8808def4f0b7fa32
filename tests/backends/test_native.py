"""blockwise's slice loops compiled (backends/native.py, csrc/sliced.cpp) against the Python loop they replace
and against ``dense``: values and gradients for Transformer-XL's relative term and product's shared positions,
in float64 and float32, over several blocks and with the relative products in row chunks; the switch, the
reasons it gives, and the fallback when the build fails."""

import os
import shutil

import pytest
import torch
from _common import DT, close, padding_mask, run

from kernel_attention.backends import native
from kernel_attention.functional import attention, explain

# 300 query rows: a block of 256 and one of 44, and the first block's relative products in 128-row chunks
# (256 rows against 300 keys)
T = 300


@pytest.fixture
def python_loop(monkeypatch):
    """Run blockwise's slice loops in Python (the compiled loops turned off) inside ``with python_loop():``."""
    import contextlib

    @contextlib.contextmanager
    def off():
        with monkeypatch.context() as m:
            m.setenv(native.ENV, "0")
            yield
    return off


# Skipped only without a C++ compiler; with one, a build that fails is a failure (test_the_build_works).
needs_build = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                 reason="no C++ compiler on PATH: the compiled loops cannot be built")


@needs_build
def test_the_build_works():
    """With a compiler present the compiled loops build (or load from the cache) and run float32 and float64."""
    assert native.why_not(torch.float32) is None, native.why_not(torch.float32)
    assert native.why_not(torch.float64) is None and native.sliced(torch.float32) is not None


@needs_build
@pytest.mark.parametrize("position", ["xl", "product"])
@pytest.mark.parametrize("filt", [None, "causal", "local:window=40", "padding"])
def test_compiled_loop_matches_python_loop_and_dense(position, filt, python_loop):
    """float64: the compiled loops equal the Python loop and dense (values; gradients of q, k, v and the
    positional parameters), with rbf's key bias entering the slices' term, under full, causal, local and padding filters (one
    sequence with no key: zero output, zero gradient)."""
    assert native.sliced(torch.float64) is not None  # the compiled side is compiled, not the Python loop again
    km = padding_mask(T, empty=True) if filt == "padding" else None
    for kernel, backend in (("exp", "blockwise"), ("rbf", "blockwise")):
        compiled = run(backend, kernel, position, filt, tq=T, tk=T, key_mask=km)
        with python_loop():
            loop = run(backend, kernel, position, filt, tq=T, tk=T, key_mask=km)
        close(compiled, loop)
        close(compiled, run("dense", kernel, position, filt, tq=T, tk=T, key_mask=km))
        if km is not None:
            assert torch.equal(compiled[0][0], torch.zeros_like(compiled[0][0]))


@needs_build
@pytest.mark.parametrize("position", ["xl", "product"])
def test_compiled_loop_float32_and_memory(position, python_loop):
    """float32: the compiled loops agree with dense to float32's rounding; Transformer-XL with a memory
    in front of the segment (Tq < Tk, lower-right causal) in float64."""
    assert native.sliced(torch.float32) is not None and native.sliced(torch.float64) is not None
    ref = run("dense", "exp", position, "causal", tq=T, tk=T, dtype=torch.float32)
    got = run("blockwise", "exp", position, "causal", tq=T, tk=T, dtype=torch.float32)
    assert got[0].dtype == torch.float32
    close(got, ref, atol=2e-4)
    if position == "xl":
        close(run("blockwise", "exp", "xl", "memory", tq=100, tk=T), run("dense", "exp", "xl", "memory", tq=100, tk=T))


@needs_build
@pytest.mark.parametrize("position", ["xl", "product"])
def test_block_without_keys(position, python_loop):
    """A filter under which every query of the first block (256 rows) keeps no key: the compiled loops skip
    that block, and its rows of the output and of dq' are zeros (they are not written by any block), as in
    the Python loop and dense; the other rows are causal."""
    keep = torch.ones(T, T, dtype=torch.bool).tril()
    keep[:260] = False
    compiled = run("blockwise", "exp", position, keep, tq=T, tk=T)
    with python_loop():
        close(compiled, run("blockwise", "exp", position, keep, tq=T, tk=T))
    close(compiled, run("dense", "exp", position, keep, tq=T, tk=T))
    assert torch.equal(compiled[0][:, :, :260], torch.zeros_like(compiled[0][:, :, :260]))
    assert torch.equal(compiled[1][0][:, :, :260], torch.zeros_like(compiled[1][0][:, :, :260]))


def test_switch_and_reasons(monkeypatch):
    """KERNEL_ATTENTION_NATIVE=0 turns the compiled loops off; dtypes other than float32 and float64 keep the
    Python loop; explain names the loop that runs and why."""
    monkeypatch.setenv(native.ENV, "0")
    assert native.why_not(torch.float32) == f"turned off by {native.ENV}=0" and native.sliced(torch.float32) is None
    q, k, v = (torch.randn(2, 2, 40, 8, dtype=DT) for _ in range(3))
    why = explain(q, k, v, "exp", "causal", terms=_terms("xl", q, k), backend="blockwise").reasons["blockwise"]
    assert "slice on Python loops (compiled loops: turned off by KERNEL_ATTENTION_NATIVE=0)" in why, why
    monkeypatch.delenv(native.ENV)
    assert "bfloat16" in native.why_not(torch.bfloat16)
    if native.why_not(DT) is None:
        why = explain(q, k, v, "exp", "causal", terms=_terms("xl", q, k), backend="blockwise").reasons["blockwise"]
        assert "per (head, block, batch element) slice on compiled loops" in why, why


def test_failed_build_falls_back_to_the_python_loop(monkeypatch):
    """A build that fails (no compiler, say) leaves the Python loop running, with the error as the reason."""
    def fail():
        raise RuntimeError("Error building extension\nc++: not found")
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "_build", fail)
    assert native.why_not(torch.float32) == "the build failed (RuntimeError: c++: not found)"
    assert native.sliced(torch.float32) is None
    close(run("blockwise", "exp", "xl", "causal", tq=40, tk=40), run("dense", "exp", "xl", "causal", tq=40, tk=40))


def test_sliced_path_minimum_keys(monkeypatch):
    """Below the CPU policy's sliced_min_keys Transformer-XL's term and product's shared positions run on
    blockwise's per-block form (the per-slice calls would cost more than they save), and explain says so; from
    it on, on the slice loops.  ``auto`` runs them on dense below it (blockwise declines: dense is faster than
    its blocks there) and on blockwise from it on; with dropout (no slice loops at any length) it keeps xl on
    blockwise and product on sdpa (concatenated features)."""
    import dataclasses

    from kernel_attention.backends.policy import POLICIES

    monkeypatch.setitem(POLICIES, "cpu", dataclasses.replace(POLICIES["cpu"], sliced_min_keys=256))
    for position in ("xl", "product"):
        for t, sliced in ((40, False), (256, True)):
            q, k, v = (torch.randn(2, 2, t, 8, dtype=DT) for _ in range(3))
            terms = _terms(position, q, k)
            why = explain(q, k, v, "exp", "causal", terms=terms, backend="blockwise").reasons["blockwise"]
            assert ("element) slice" in why) == sliced, why
            auto = explain(q, k, v, "exp", "causal", terms=terms)
            assert auto.name == ("blockwise" if sliced else "dense"), auto
            if not sliced:
                assert "Tk=40 is below the 256 keys from which its slice loops run" in auto.reasons["blockwise"], auto
                c = explain(q, k, v, "exp", "causal", terms=terms, dropout_p=0.1)
                assert c.name == ("blockwise" if position == "xl" else "sdpa"), c
    close(run("blockwise", "exp", "xl", "causal", tq=40, tk=40), run("dense", "exp", "xl", "causal", tq=40, tk=40))


def _terms(position, q, k):
    from kernel_attention.positions import default_positions, make_position

    pos = make_position(position, d_model=16, n_heads=2, d_head=8).to(DT)
    return pos.terms(q, k, *default_positions(q.shape[2], k.shape[2], "cpu", True))


@needs_build
@pytest.mark.parametrize("position", ["xl", "product"])
def test_compiled_loops_on_one_thread_and_on_several(position):
    """With more than one thread the compiled loops run a block's heads on different threads, each with its own
    buffers; on one thread, in one call: the same values and gradients."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run("blockwise", "exp", position, "causal", tq=T, tk=T)
        torch.set_num_threads(max(2, threads))
        several = run("blockwise", "exp", position, "causal", tq=T, tk=T)
    finally:
        torch.set_num_threads(threads)
    close(one, several)


@needs_build
def test_compiled_gradients_come_contiguous(python_loop):
    """The compiled loops accumulate dk' and dv untransposed: the gradients they return are contiguous (the Python
    loop's are transposed views, which cost a transposing copy where a contiguous gradient is needed), and equal
    the Python loop's."""
    from kernel_attention.backends.chunked import plan_blocks
    from kernel_attention.backends.sliced import SliceSpec, sliced_smoother

    torch.manual_seed(0)
    b, h, t, d = 2, 2, 300, 8
    qf, kf, v, qv = (torch.randn(b, h, t, d, dtype=DT, requires_grad=True) for _ in range(4))
    table = torch.randn(h, 2 * t - 1, d, dtype=DT, requires_grad=True)
    spec = SliceSpec(scale=d ** -0.5, keep=None, blocks=plan_blocks(None, t, t, 256)[1], term="relative", base=t - 1)

    def grads():
        out = sliced_smoother(spec, qf, kf, v, None, qv, table)
        return torch.autograd.grad(out, (qf, kf, v, qv, table), torch.ones_like(out) + out.detach())
    compiled = grads()
    assert all(g.is_contiguous() for g in compiled[:3]), [g.stride() for g in compiled[:3]]
    with python_loop():
        loop = grads()
    assert not loop[1].is_contiguous()  # the transposed accumulation this guards against
    for x, y in zip(compiled, loop):
        torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-10)


class _Spy:
    """The compiled module, recording for each block call whether it was given kept logits (its last argument)."""

    def __init__(self, module):
        self.module, self.forward, self.backward = module, [], []

    def block_forward(self, *args):
        self.forward.append(args[-1] is not None)
        return self.module.block_forward(*args)

    def block_backward(self, *args):
        self.backward.append(args[-1] is not None)
        return self.module.block_backward(*args)


@needs_build
@pytest.mark.parametrize("position", ["xl", "product"])
@pytest.mark.parametrize("filt", [None, "causal"])
def test_kept_logits_equal_recomputed_ones(position, filt, monkeypatch):
    """The forward keeps the (B, H, rows, cols) logits of the blocks that fit blockwise's ``kept`` budget, in order,
    and their backward forms P from them: all blocks by default, only the 44-row one with kept=60000 (the first
    block's 2·2·256·300 elements, or 2·2·256·256 causal, do not fit, the second's 2·2·44·300 do), none with 0.
    Values and gradients equal dense's in each case; without gradients nothing is kept; explain counts them."""
    spy = _Spy(native.sliced(DT))
    monkeypatch.setattr(native, "sliced", lambda dtype: spy)
    ref = run("dense", "exp", position, filt, tq=T, tk=T)
    for backend, keeps in (("blockwise", [True, True]), ("blockwise:kept=60000", [False, True]),
                           ("blockwise:kept=0", [False, False])):
        spy.forward.clear(), spy.backward.clear()
        close(run(backend, "exp", position, filt, tq=T, tk=T), ref)
        assert spy.forward == keeps and spy.backward == keeps, (backend, spy.forward, spy.backward)
    q, k, v = (torch.randn(2, 2, T, 8, dtype=DT) for _ in range(3))
    call = dict(terms=_terms(position, q, k), backend="blockwise:kept=60000")
    spy.forward.clear()
    with torch.no_grad():
        attention(q, k, v, "exp", filt, **call)
    assert spy.forward == [False, False], spy.forward
    why = explain(q, k, v, "exp", filt, **call).reasons["blockwise"]
    assert "the forward keeps the logits of 1 of 2 blocks for the backward" in why, why


@needs_build
def test_kept_logits_of_the_wrong_shape_are_refused():
    """The compiled loops check the buffer of kept logits they are given: (B, H, n, m) and contiguous."""
    mod = native.sliced(DT)
    b, h, t, d = 1, 2, 4, 2
    qf, kf, v = (torch.randn(b, h, t, d, dtype=DT) for _ in range(3))
    feats = [torch.randn(1, h, t, 3, dtype=DT) for _ in range(2)]
    out, lse = torch.empty(b, h, t, d, dtype=DT), torch.empty(b, h, t, dtype=DT)
    for bad in (torch.empty(b, h, t, t + 1, dtype=DT), torch.empty(b, h, t, t, dtype=DT).transpose(-1, -2)):
        with pytest.raises(RuntimeError, match=r"kept logits must be \(B, H, n, m\), contiguous"):
            mod.block_forward(qf, kf, v, None, None, 0, 0, t, 0, t, 1.0, out, lse, 1, t, feats, bad)
    mod.block_forward(qf, kf, v, None, None, 0, 0, t, 0, t, 1.0, out, lse, 1, t, feats,
                      torch.empty(b, h, t, t, dtype=DT))
    torch.testing.assert_close(out, torch.softmax(qf @ kf.transpose(-1, -2) + feats[0] @ feats[1].transpose(-1, -2),
                                                  -1) @ v)
