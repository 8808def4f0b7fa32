"""The ``triton`` backend's compile check: the first call of a specialisation compiles, without running them, the
kernels it will launch (forward, and backward where it differentiates) before the forward runs, so that where
Triton cannot compile them ``auto`` runs the call on the next backend (with one warning) and a backend asked for
by name raises :class:`~kernel_attention.backends.KernelCompileError`.

The launches are recorded, not run (:func:`~kernel_attention.backends.triton_aot.record_launches`): what the
check compiles is compared launch by launch with what the call then launches, and a compile failure is Triton's
error raised by the recorder's warm-up of one kernel.  That the kernels compile with each Triton release is
tests/backends/test_triton_hopper.py's.
"""

import warnings

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[gpu]')")

import kernel_attention as ka  # noqa: E402
from kernel_attention.backends import KernelCompileError, triton_support  # noqa: E402
from kernel_attention.backends.triton_aot import _Grid, backend_call, record_launches  # noqa: E402
from kernel_attention.backends.triton_flash import TritonBackend  # noqa: E402
from kernel_attention.functional import attention, explain  # noqa: E402
from kernel_attention.positions import default_positions, make_position  # noqa: E402

pytestmark = pytest.mark.triton

B, H, T, D = 1, 2, 32, 16


@pytest.fixture(autouse=True)
def _fresh_checks(monkeypatch):
    """Every test starts with no specialisation checked."""
    monkeypatch.setattr(triton_support, "_checked", {})


def _compiled(launch) -> tuple:
    """What a launch compiles to: its kernel, its keyword arguments (the constexprs among them) and each tensor
    argument's dtype and shape."""
    tensors = tuple((x.dtype, tuple(x.shape)) for x in launch.args if isinstance(x, torch.Tensor))
    return launch.kernel, tuple(sorted(launch.kwargs.items())), tensors


def _bias_call():
    """A float bias that takes a gradient (the backward's kernels then write dS)."""
    q, k, v, bias = (torch.randn(B, H, T, n, requires_grad=True) for n in (D, D, D, T))
    return lambda: attention(q, k, v, "exp", "causal", bias=bias, backend="triton:block=16").sum().backward()


CASES = {
    "shaw keys and values, local": dict(kernel="exp", position="shaw", filt="local:window=8", value="relative"),
    "rbf, xl causal": dict(kernel="rbf", position="xl", filt="causal"),
    "grouped key/value heads": dict(kernel="exp", filt="causal", h=4, kv_heads=2),
    "ikas causal": dict(kernel="ikas", filt="causal"),
    "ikan-direct magnitude dropout": dict(kernel="ikan-direct:magnitude_dropout=0.1", filt="causal", train=True),
    "a bias with its gradient": None,
}


@pytest.mark.parametrize("case", list(CASES))
def test_check_compiles_what_the_call_launches(case):
    warm: list = []
    call = _bias_call() if CASES[case] is None else backend_call(**CASES[case], t=T, d=D, block=16,
                                                                  dtype=torch.float32)
    launched = record_launches(call, warm)
    assert len(launched) == 3  # forward, the keys' and the queries' backward
    assert [_compiled(x) for x in warm] == [_compiled(x) for x in launched]
    again: list = []
    assert len(record_launches(call, again)) == 3 and again == []  # checked once per specialisation


def test_check_compiles_no_backward_without_gradients():
    kern, pos, pq, pk, qkv = _inputs("exp", "shaw")
    warm: list = []
    with torch.no_grad():
        launched = record_launches(lambda: attention(*qkv, kern, "causal", terms=pos.terms(qkv[0], qkv[1], pq, pk, 0),
                                                     backend="triton"), warm)
    assert [x.kernel for x in warm] == [x.kernel for x in launched] == ["flash_forward"]


def _fail(monkeypatch, kernel: str):
    """Triton's compiler fails on ``kernel``: its warm-up raises as a failed pass raises."""
    warmup = _Grid.warmup

    def failing(self, *args, grid, **kwargs):
        if self.__name__ == kernel:
            raise RuntimeError("PassManager::run failed")
        warmup(self, *args, grid=grid, **kwargs)
    monkeypatch.setattr(_Grid, "warmup", failing)


def _inputs(kernel: str, position: str):
    torch.manual_seed(0)
    kern = ka.make_kernel(kernel, n_heads=H, d_head=D).eval()
    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D)
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    pq, pk = default_positions(T, T, q.device, True)
    return kern, pos, pq, pk, (q, k, v)


@pytest.mark.parametrize("kernel,position,failing", [("exp", "shaw", "flash_backward_q"),
                                                     ("ikas", "none", "squared_backward_kv")])
def test_auto_runs_the_call_on_the_next_backend(monkeypatch, kernel, position, failing):
    """``auto`` on the CPU as on a GPU (its policy there would take triton): the backward kernel fails to compile,
    so no kernel runs, the call gives dense's output and gradients, and one warning names Triton's error."""
    _fail(monkeypatch, failing)
    monkeypatch.setattr(TritonBackend, "declines", lambda self, p: None)
    kern, pos, pq, pk, qkv = _inputs(kernel, position)

    def run(backend):
        out = attention(*qkv, kern, "causal", terms=pos.terms(qkv[0], qkv[1], pq, pk, 0), backend=backend)
        return (out, *torch.autograd.grad(out.square().sum(), qkv))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = []
        launched = record_launches(lambda: got.extend(run("auto") + run("auto")))
    assert launched == []
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1
    assert f"{failing}: RuntimeError: PassManager::run failed" in messages[0] and "instead" in messages[0]
    want = run("dense")
    for g, w in zip(got, want + want):
        torch.testing.assert_close(g, w)
    with pytest.MonkeyPatch.context() as m:  # explain says so where it takes triton
        m.setenv("TRITON_INTERPRET", "1")
        text = str(explain(*qkv, kern, "causal", terms=pos.terms(qkv[0], qkv[1], pq, pk, 0)))
    assert "triton: chosen" in text and "failed to compile 1 of its kernels' specialisations" in text


def test_backend_by_name_raises(monkeypatch):
    _fail(monkeypatch, "flash_backward_kv")
    kern, pos, pq, pk, qkv = _inputs("exp", "shaw")
    call = lambda: attention(*qkv, kern, "causal", terms=pos.terms(qkv[0], qkv[1], pq, pk, 0), backend="triton")
    with pytest.raises(KernelCompileError, match=r"Triton \d+\.\d+.* failed to compile .*flash_backward_kv: "
                                                 r"RuntimeError: PassManager::run failed.*backend='auto'"):
        record_launches(call)
    with torch.no_grad():  # the forward compiles: a call without gradients runs
        assert [x.kernel for x in record_launches(call)] == ["flash_forward"]


def test_out_of_memory_in_the_check_is_not_a_compile_failure(monkeypatch):
    """Memory runs out while the check allocates its stand-in outputs: the error is the caller's, and the
    specialisation is checked again at the next call."""
    warmup = _Grid.warmup

    def oom(self, *args, grid, **kwargs):
        raise torch.OutOfMemoryError("out of memory")
    monkeypatch.setattr(_Grid, "warmup", oom)
    call = backend_call("exp", "shaw", "causal", t=T, d=D, block=16, dtype=torch.float32)
    with pytest.raises(torch.OutOfMemoryError):
        record_launches(call)
    assert triton_support._checked == {}
    monkeypatch.setattr(_Grid, "warmup", warmup)
    assert len(record_launches(call)) == 3 and list(triton_support._checked.values()) == [None]


def test_recording_works_where_the_kernels_were_loaded_compiled(monkeypatch):
    """On a GPU machine's test run the kernel modules are loaded compiled, which refuses CPU tensors; recorded
    launches run nothing, so recording ignores that, and the refusal holds again after it."""
    monkeypatch.setattr(triton_support, "_loaded_interpreted", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    call = backend_call("exp", "xl", "causal", t=T, d=D, block=16, dtype=torch.float32)
    assert len(record_launches(call)) == 3
    with pytest.raises(ka.backends.BackendError, match="loaded compiled"):
        call()
