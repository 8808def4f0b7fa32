"""The ``triton`` backend's kernels compiled for a Hopper GPU (sm_90: the H100, H200) without one.

The launches of a call on CPU tensors are recorded, not run, and compiled as a CUDA launch compiles them
(:mod:`~kernel_attention.backends.triton_aot`).  Checked: every launch compiles to a cubin (an error that Triton's
interpreter does not raise, such as a tile shape the tensor cores do not take, fails here), and where the filter
is a band (full, causal, local) with no sparse pattern or padding, each key or query loop copies its tiles
asynchronously (``async_copy_global_to_local``: Triton's software pipeline, which a branch around the loads
disables).

Each case compiles with the installed Triton and with every other release installed into a folder named in
``KERNEL_ATTENTION_TRITON_SITES`` (``pip install --target DIR triton==X``; folders separated by ``os.pathsep``):
Triton's releases reject different code (a constexpr bound to a local name compiles with 3.9 and fails with
3.6), and ``.ci/run`` adds 3.3.0, the oldest the extras accept, and 3.6.0, the one torch 2.11's CUDA build pins,
to its slow run.

Skipped where triton is not installed; takes a few seconds per kernel and release.
"""

import glob
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[gpu]')")

pytestmark = pytest.mark.triton

#: name: (backend_call's arguments, whether the filter is a band)
CASES = {
    "exp causal": (dict(kernel="exp", filt="causal"), True),
    "exp full": (dict(kernel="exp"), True),
    "shaw keys and values, local": (dict(kernel="exp", position="shaw", filt="local:window=128", value="relative"),
                                    True),
    "rbf, xl causal": (dict(kernel="rbf", position="xl", filt="causal"), True),
    "exp causal, grouped key/value heads": (dict(kernel="exp", filt="causal", h=4, kv_heads=2), True),
    "exp strided": (dict(kernel="exp", filt="strided:stride=16"), False),
    "rbf (key bias), shaw strided": (dict(kernel="rbf", position="shaw", filt="strided:stride=16"), False),
    "ikas causal": (dict(kernel="ikas", filt="causal"), True),
    "ikan-direct magnitude dropout, causal": (dict(kernel="ikan-direct:magnitude_dropout=0.1", filt="causal",
                                                   train=True), True),
}

# Triton's interpreter, once it has run in a process (tests/backends/test_triton.py), leaves triton.language
# patched for itself: the compilation runs in a fresh process.
_COMPILE = """
import json, sys, triton
from kernel_attention.backends.triton_aot import (backend_call, compile_launch, compiled_modules, pipelined,
                                                  record_launches)
mods = compiled_modules()
out = {name: [[x.kernel, pipelined(compile_launch(x, mods))]
              for x in record_launches(backend_call(**kw))] for name, kw in json.loads(sys.argv[1]).items()}
print(json.dumps({"triton": triton.__version__, "cases": out}))
"""


#: folders holding other Triton releases to compile with (marked slow), besides the installed one (None)
SITES = [None] + [pytest.param(p, marks=pytest.mark.slow)
                  for p in os.environ.get("KERNEL_ATTENTION_TRITON_SITES", "").split(os.pathsep) if p]


def _release(site):
    """The Triton release a site folder holds, from its dist-info folder's name: 'triton-3.6.0'."""
    if site is None:
        return "installed"
    found = glob.glob(os.path.join(site, "triton-*.dist-info"))
    assert len(found) == 1, f"{site} should hold one Triton release (pip install --target), found {found}"
    return os.path.basename(found[0])[:-len(".dist-info")]


@pytest.fixture(scope="module", params=SITES, ids=_release)
def compiled(request):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if request.param is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (request.param, env.get("PYTHONPATH")) if p)
    cases = json.dumps({name: kw for name, (kw, _) in CASES.items()})
    run = subprocess.run([sys.executable, "-c", _COMPILE, cases], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert request.param is None or _release(request.param) == f"triton-{out['triton']}", out["triton"]
    return out["cases"]


@pytest.mark.parametrize("case", list(CASES))
def test_kernels_compile_for_hopper_with_pipelined_loops(case, compiled):
    launches = compiled[case]
    assert sorted(k for k, _ in launches) in (["flash_backward_kv", "flash_backward_q", "flash_forward"],
                                              ["squared_backward_kv", "squared_backward_q", "squared_forward"])
    unpipelined = [k for k, pipelined in launches if not pipelined]
    assert not (CASES[case][1] and unpipelined), f"loop loads not pipelined in {unpipelined}"
