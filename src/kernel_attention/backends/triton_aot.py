r"""The ``triton`` backend's kernels compiled for a GPU without one: what a call launches, compiled as a launch on
CUDA compiles it, and what each kernel takes of the chip (for tests and ``benchmarks/triton_resources.py``).

A call on the backend runs on CPU tensors with the kernel modules replaced by a recorder, so that the launches it
makes (forward and backward, with their arguments) are captured and not run (:func:`record_launches`).  Each is
then compiled by Triton for a CUDA architecture (default sm_90: the H100, H200) with the specialisations Triton's
JIT gives a CUDA launch: pointers 16-byte aligned, integers divisible by 16 marked so, integers equal to 1 made
constants (:func:`compile_launch`).  :func:`resources` reads the registers per thread and the bytes per thread
spilled to local memory from the cubin (``cuobjdump -res-usage``, shipped with Triton), and whether the kernel's
loops copy tiles asynchronously (``async_copy_global_to_local`` in its TTGIR: Triton's software pipeline).
Compile in a process where Triton's interpreter has not run: once it has, it leaves ``triton.language`` patched
for itself.

    from kernel_attention.backends.triton_aot import backend_call, compile_launch, compiled_modules, \
        record_launches, resources
    launches = record_launches(backend_call("exp", "xl", "causal"))
    mods = compiled_modules()
    print([resources(compile_launch(x, mods)) for x in launches])
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import os
import re
import subprocess
import sys
import tempfile

import torch

__all__ = ["Launch", "backend_call", "record_launches", "compiled_modules", "compile_launch", "pipelined",
           "resources"]

MODULES = ("triton_tiles", "triton_shaw", "triton_kernels", "triton_squared_kernels")
_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int8: "i8",
          torch.int32: "i32", torch.int64: "i64"}


@dataclasses.dataclass
class Launch:
    """One kernel launch: the kernel module's name, the kernel's, and the arguments it was given."""

    module: str
    kernel: str
    args: tuple
    kwargs: dict


class _Recorder:
    """Stands for a kernel module: ``module.kernel[grid](*args, **kwargs)`` records the launch in ``launches``,
    ``module.kernel.warmup(*args, grid=grid, **kwargs)`` (a compilation without a launch) in ``warmups``."""

    def __init__(self, module: str, launches: list, warmups: list):
        self.module, self.launches, self.warmups = module, launches, warmups

    def __getattr__(self, kernel: str):
        return _Grid(self.module, kernel, self.launches, self.warmups)


class _Grid:
    def __init__(self, module: str, kernel: str, launches: list, warmups: list):
        self.module, self.__name__, self.launches, self.warmups = module, kernel, launches, warmups

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append(Launch(self.module, self.__name__, args, kwargs))

    def warmup(self, *args, grid, **kwargs):
        self.warmups.append(Launch(self.module, self.__name__, args, kwargs))


@contextlib.contextmanager
def _env(name: str, value: str | None):
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def backend_call(kernel: str, position: str = "none", filt=None, value: str = "none", b: int = 1, h: int = 2,
                 t: int = 256, d: int = 64, block: int = 64, dtype=torch.bfloat16, train: bool = False,
                 kv_heads: int | None = None):
    """A call for :func:`record_launches`: self-attention of B x H x T x D ``dtype`` CPU tensors on the triton
    backend in tiles of ``block``, with kernel, positions (``value``: positions in the value) and filter by name,
    then its backward (of the output's sum); ``kv_heads``: that many key/value heads (grouped-query attention)."""
    import kernel_attention as ka
    from kernel_attention.functional import attention
    from kernel_attention.positions import default_positions, make_position

    def call():
        torch.manual_seed(0)
        pos = make_position(position, d_model=h * d, n_heads=h, d_head=d, value_position=value).to(dtype=dtype)
        kern = ka.make_kernel(kernel, n_heads=h, d_head=d).to(dtype=dtype).train(train)
        q, k, v = (torch.randn(b, n, t, d, dtype=dtype).requires_grad_() for n in (h, kv_heads or h, kv_heads or h))
        pq, pk = default_positions(t, t, q.device, True)
        out = attention(q, k, v, kern, filt, terms=pos.terms(q, k, pq, pk, 0), backend=f"triton:block={block}",
                        enable_gqa=kv_heads is not None)
        out.float().sum().backward()
    return call


def record_launches(call, warmups: list | None = None) -> list[Launch]:
    """The launches that ``call()``, a call on the triton backend with CPU tensors, makes (forward, then backward
    where it differentiates), none of them run: outputs are left unwritten, and the input checks are off.  The
    launches its compile check compiles without running them (:func:`~kernel_attention.backends.triton_support.
    compile_check`, the first call of a specialisation) go to ``warmups``."""
    from kernel_attention.backends import triton_flash, triton_squared, triton_support
    from kernel_attention.functional import validation

    launches: list = []
    warmups = [] if warmups is None else warmups
    recorder = lambda module: _Recorder(module, launches, warmups)
    saved = triton_flash.kernels, triton_squared.kernels, triton_support._loaded_interpreted
    triton_flash.kernels = triton_squared.kernels = recorder
    # the kernels are recorded, not run: whether the process loaded them compiled (on a GPU) does not matter
    triton_support._loaded_interpreted = lambda: None
    try:
        with _env("TRITON_INTERPRET", "1"), validation(False):  # the backend takes CPU tensors for its interpreter
            call()
    finally:
        triton_flash.kernels, triton_squared.kernels, triton_support._loaded_interpreted = saved
    return launches


def compiled_modules() -> dict:
    """Fresh copies of the kernel modules loaded for compilation (TRITON_INTERPRET unset while they load), whatever
    the cached ones were loaded for; the cached ones are put back."""
    names = [f"kernel_attention.backends.{m}" for m in MODULES]
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    try:
        with _env("TRITON_INTERPRET", None):
            return {m: importlib.import_module(n) for m, n in zip(MODULES, names)}
    finally:
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


def _signature(fn, launch: Launch):
    """Triton's signature, constants, attributes and options for ``launch``, as its JIT specialises a CUDA launch."""
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


def compile_launch(launch: Launch, modules: dict, arch: int = 90):
    """``launch`` compiled by Triton for CUDA architecture ``arch`` (sm_90 by default), from ``modules``
    (:func:`compiled_modules`): a compiled kernel whose ``asm`` holds its TTGIR, PTX and cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(modules[launch.module], launch.kernel)
    sig, const, attrs, options = _signature(fn, launch)
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def pipelined(kernel) -> bool:
    """Whether a compiled kernel's loops copy tiles asynchronously (Triton's software pipeline)."""
    return "ttg.async_copy_global_to_local" in kernel.asm["ttgir"]


def resources(kernel) -> dict:
    """What a compiled kernel takes: ``registers`` per thread, ``spill_bytes`` per thread (its stack in local
    memory), ``shared`` memory in bytes, and whether its loops are ``pipelined`` (copy tiles asynchronously)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    field = lambda name: int(re.search(rf"\b{name}:(\d+)", usage).group(1))
    return dict(registers=field("REG"), spill_bytes=field("STACK"), shared=kernel.metadata.shared,
                pipelined=pipelined(kernel))
