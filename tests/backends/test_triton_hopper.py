"""The ``triton`` backend's kernels compiled for a Hopper GPU (sm_90: the H100, H200) without one.

A call on the backend runs on CPU tensors with its kernel modules replaced by a recorder, so the launches a call
makes (forward and backward, with their arguments) are captured and not run; each launch is then compiled by
Triton for sm_90 with the specialisations a launch on CUDA gets (16-aligned pointers, integers divisible by 16,
integers equal to 1).  Checked: every launch compiles to a cubin (an error that Triton's interpreter does not
raise, such as a tile shape the tensor cores do not take, fails here), and where the filter is a band (full,
causal, local) with no sparse pattern or padding, each key or query loop copies its tiles asynchronously
(``async_copy_global_to_local``: Triton's software pipeline, which a branch around the loads disables).

Skipped where triton is not installed; takes a few seconds per kernel.
"""

import dataclasses
import importlib
import os
import sys

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[gpu]')")

import kernel_attention as ka  # noqa: E402
from kernel_attention.backends import triton_flash, triton_squared  # noqa: E402
from kernel_attention.functional import attention, validation  # noqa: E402
from kernel_attention.positions import default_positions, make_position  # noqa: E402

pytestmark = pytest.mark.triton

MODULES = ("triton_kernels", "triton_squared_kernels")
_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int8: "i8",
          torch.int32: "i32", torch.int64: "i64"}


@dataclasses.dataclass
class Launch:
    module: str
    kernel: str
    args: tuple
    kwargs: dict


class _Recorder:
    """Stands for a kernel module: ``module.kernel[grid](*args, **kwargs)`` records the launch."""

    def __init__(self, module, launches):
        self.module, self.launches = module, launches

    def __getattr__(self, kernel):
        record = lambda *args, **kwargs: self.launches.append(Launch(self.module, kernel, args, kwargs))
        return _Grid(record)


class _Grid:
    def __init__(self, record):
        self.record = record

    def __getitem__(self, grid):
        return self.record


def _compiled_modules() -> dict:
    """Fresh copies of the kernel modules loaded for compilation (TRITON_INTERPRET unset while they load), whatever
    the cached ones were loaded for; the cached ones are put back."""
    names = [f"kernel_attention.backends.{m}" for m in MODULES]
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    env = os.environ.pop("TRITON_INTERPRET", None)
    try:
        return {m: importlib.import_module(n) for m, n in zip(MODULES, names)}
    finally:
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)
        if env is not None:
            os.environ["TRITON_INTERPRET"] = env


@pytest.fixture(scope="module")
def compiled():
    mods = _compiled_modules()
    assert not mods["triton_kernels"].INTERPRETED
    return mods


def _record(monkeypatch, call) -> list:
    """The launches ``call()`` makes on the triton backend (forward, then backward), none of them run."""
    launches = []
    recorder = lambda module: _Recorder(module, launches)
    monkeypatch.setattr(triton_flash, "kernels", recorder)
    monkeypatch.setattr(triton_squared, "kernels", recorder)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the backend takes CPU tensors only for its interpreter
    with validation(False):
        call()
    return launches


def _signature(fn, launch: Launch):
    """Triton's signature, constants and attributes for ``launch``, as the JIT specialises a CUDA launch."""
    import inspect

    params = list(inspect.signature(fn.fn).parameters)
    values = dict(zip(params, launch.args))
    options = {k: launch.kwargs[k] for k in ("num_warps", "num_stages") if k in launch.kwargs}
    values.update({k: v for k, v in launch.kwargs.items() if k not in options})
    sig, const, attrs = {}, {}, {}
    for i, name in enumerate(params):
        x = values[name]
        if isinstance(x, torch.Tensor):
            sig[name] = "*" + _TYPES[x.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif i in fn.constexprs:
            sig[name], const[(i,)] = "constexpr", x
        elif isinstance(x, int):
            if x == 1:
                sig[name], const[(i,)] = "constexpr", 1
            else:
                sig[name] = "i64" if abs(x) >= 2 ** 31 else "i32"
                if x % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    return sig, const, attrs, options


def _compile(mods, launch: Launch):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(mods[launch.module], launch.kernel)
    sig, const, attrs, options = _signature(fn, launch)
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


B, H, T, D = 1, 2, 256, 64
DT = torch.bfloat16


def _flash_call(position, filt, value="none", kernel="exp"):
    def call():
        torch.manual_seed(0)
        pos = make_position(position, d_model=H * D, n_heads=H, d_head=D, value_position=value).to(dtype=DT)
        kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(dtype=DT)
        q, k, v = (torch.randn(B, H, T, D, dtype=DT).requires_grad_() for _ in range(3))
        pq, pk = default_positions(T, T, q.device, True)
        out = attention(q, k, v, kern, filt, terms=pos.terms(q, k, pq, pk), backend="triton:block=64")
        out.sum().backward()
    return call


def _squared_call(kernel, filt):
    def call():
        torch.manual_seed(0)
        kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(dtype=DT).train()
        q, k, v = (torch.randn(B, H, T, D, dtype=DT).requires_grad_() for _ in range(3))
        attention(q, k, v, kern, filt, backend="triton:block=64").float().sum().backward()
    return call


CASES = {
    "exp causal": (_flash_call("none", "causal"), True),
    "exp full": (_flash_call("none", None), True),
    "shaw keys and values, local": (_flash_call("shaw", "local:window=128", value="relative"), True),
    "xl causal": (_flash_call("xl", "causal", kernel="rbf"), True),
    "exp strided": (_flash_call("none", "strided:stride=16"), False),
    "ikan-direct magnitude dropout, causal": (_squared_call("ikan-direct:magnitude_dropout=0.1", "causal"), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_kernels_compile_for_hopper_with_pipelined_loops(case, compiled, monkeypatch):
    call, band = CASES[case]
    launches = _record(monkeypatch, call)
    kernels = sorted(x.kernel for x in launches)
    assert len(kernels) == 3, kernels  # forward, backward over keys, backward over queries
    unpipelined = [x.kernel for x in launches
                   if "ttg.async_copy_global_to_local" not in _compile(compiled, x).asm["ttgir"]]
    assert not (band and unpipelined), f"loop loads not pipelined in {unpipelined}"
