"""The backend tests run on small inputs; the CPU policy's minimum length for blockwise's slice loops
(``sliced_min_keys``, a speed rule) is lowered for them so that the loops run at these sizes.
``test_sliced_path_minimum_keys`` checks the rule at its real value.

Without CUDA (or with TRITON_INTERPRET set), Triton and the ``triton`` backend's kernel modules are loaded here
for Triton's interpreter (TRITON_INTERPRET=1 while they load, restored after), before any test module imports them:
Triton decides when a function is defined whether it is interpreted, its own library (``tl.zeros``, ``tl.maximum``)
included, and an interpreted kernel cannot call a library function loaded for compilation, whichever test module
came first."""

import dataclasses
import importlib
import importlib.util

import pytest

from _common import TRITON_ON_CUDA
from kernel_attention.backends.policy import POLICIES
from kernel_attention.backends.triton_aot import _env


def _load_triton_for_the_interpreter():
    """Where the triton tests run on CPU tensors (no CUDA, or TRITON_INTERPRET set), load Triton and the kernel
    modules for the interpreter."""
    if importlib.util.find_spec("triton") is None or TRITON_ON_CUDA:
        return
    with _env("TRITON_INTERPRET", "1"):
        for name in ("triton", "kernel_attention.backends.triton_kernels",
                     "kernel_attention.backends.triton_squared_kernels"):
            importlib.import_module(name)


_load_triton_for_the_interpreter()


@pytest.fixture(autouse=True)
def _sliced_at_any_length(monkeypatch):
    monkeypatch.setitem(POLICIES, "cpu", dataclasses.replace(POLICIES["cpu"], sliced_min_keys=1))
