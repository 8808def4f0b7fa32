"""``explain`` describes a structured filter without its (Tq, Tk) mask: the filters' row bounds, the block plan
and the kept keys read off them agree with the mask, the reports are those of the formed mask, and at
T = 2**17 (a 16 GiB bool mask) explain runs under an address-space limit of 1.5 GiB above what is mapped."""

import itertools
import subprocess
import sys
import textwrap

import pytest
import torch

from kernel_attention.backends import choose
from kernel_attention.backends.base import kept_keys
from kernel_attention.backends.chunked import block_spans, plan_blocks
from kernel_attention.filters import make_filter
from kernel_attention.functional import build_problem
from kernel_attention.kernels import make_kernel

FILTERS = ["full", "causal", "local:window=3", "local:window=40", "strided:stride=4", "fixed:stride=5,c=2", "memory",
           "memory:same_length=true", "memory:same_length=true,mem_len=3", "causal&local:window=2", "cross",
           "strided:stride=3|local:window=1", "local:window=0|causal&local:window=5"]
SHAPES = [(7, 7), (5, 12), (12, 5), (1, 9), (37, 37)]


def applies(spec, tq, tk) -> bool:
    """Whether the filter takes (Tq, Tk): same_length without mem_len takes its window from the memory present."""
    return spec != "memory:same_length=true" or tk > tq


@pytest.mark.parametrize("spec", FILTERS)
def test_row_bounds_are_the_masks_first_and_last_kept_keys(spec):
    f = make_filter(spec)
    for tq, tk in filter(lambda shape: applies(spec, *shape), SHAPES):
        lo, hi = f.row_bounds(tq, tk)
        m = f.mask(tq, tk)
        for i in range(tq):
            cols = m[i].nonzero().flatten().tolist()
            want = (cols[0], cols[-1] + 1) if cols else None
            assert (None if lo[i] >= hi[i] else (int(lo[i]), int(hi[i]))) == want, (spec, tq, tk, i)


def test_filters_without_bounds_say_so():
    assert make_filter("causal&strided:stride=3").row_bounds(8, 8) is None   # two patterns: not one range
    assert make_filter(torch.ones(4, 4, dtype=torch.bool)).row_bounds(4, 4) is None


def problem(spec, tq, tk, kernel="exp", defer=True):
    q, k, v = torch.randn(1, 2, tq, 4), torch.randn(1, 2, tk, 4), torch.randn(1, 2, tk, 4)
    return build_problem(q, k, v, kernel, spec, defer_mask=defer)


@pytest.mark.parametrize("spec", FILTERS)
def test_block_plan_and_kept_keys_from_bounds_equal_the_masks(spec):
    for (tq, tk), rows in itertools.product(SHAPES, (1, 4, 16)):
        if not applies(spec, tq, tk):
            continue
        p = problem(spec, tq, tk)
        if p.full:
            continue
        assert p.deferred
        assert block_spans(p, rows) == plan_blocks(p.filter.mask(tq, tk), tq, tk, rows)[1], (spec, tq, tk, rows)
        keys = kept_keys(p)
        if keys is not None:
            assert keys[0].tolist() == p.filter.mask(tq, tk).any(0).tolist(), (spec, tq, tk)
        assert p.deferred                                       # none of it formed the mask


@pytest.mark.parametrize("kernel", ["exp", "poly", "linear", "rbf", "ikan", "mikan"])
def test_explain_reports_what_the_formed_mask_gives(kernel):
    kern = make_kernel(kernel, n_heads=2, d_head=4) if kernel in ("ikan", "mikan") else kernel
    for spec, (tq, tk) in itertools.product([None, *FILTERS], [(37, 37), (16, 40), (300, 300)]):
        if not applies(spec, tq, tk):
            continue
        torch.manual_seed(0)
        deferred = str(choose(problem(spec, tq, tk, kern)))
        torch.manual_seed(0)
        assert deferred == str(choose(problem(spec, tq, tk, kern, defer=False))), (kernel, spec, tq, tk)


@pytest.mark.parametrize("spec", ["strided:stride=4", "fixed:stride=5,c=2"])
def test_squared_reads_a_sparse_patterns_kept_keys_without_the_mask(spec):
    """The implicit kernels' squared path masks its per-key log factor to the keys some query keeps; for a sparse
    pattern (no single range of keys per row) those come from the pattern's tile form, not the mask."""
    kern = make_kernel("ikan", n_heads=2, d_head=4)
    for tq, tk in [(37, 37), (16, 40), (300, 300)]:
        torch.manual_seed(0)
        p = problem(spec, tq, tk, kern)
        deferred = str(choose(p))
        assert p.deferred, (spec, tq, tk)                       # the squared check formed no mask
        torch.manual_seed(0)
        assert deferred == str(choose(problem(spec, tq, tk, kern, defer=False))), (spec, tq, tk)


def test_a_deferred_mask_is_formed_when_read():
    p = problem("local:window=2", 6, 6)
    assert p.deferred and not p.full and not p.key_only
    assert torch.equal(p.keep, make_filter("local:window=2").mask(6, 6)) and not p.deferred


# The child maps torch, then limits its address space to what is mapped + 1.5 GiB: a (T, T) bool mask at
# T = 2**17 (16 GiB), or any tensor of T**2 / 16 bytes, fails to allocate there.
_CHILD = textwrap.dedent("""
    import resource, sys, torch
    from kernel_attention.backends import choose
    from kernel_attention.functional import build_problem
    from kernel_attention.kernels import make_kernel
    T, defer = 2 ** 17, sys.argv[1] == "deferred"
    q = k = v = torch.randn(1, 2, T, 8)
    mapped = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 3 * 2 ** 29, resource.getrlimit(resource.RLIMIT_AS)[1]))
    ikan = make_kernel("ikan", n_heads=2, d_head=8)
    for kernel, mask in (("exp", "local:window=4"), ("exp", "causal&local:window=64"), ("poly", "local:window=4"),
                         (ikan, "local:window=4"), (ikan, "strided:stride=64")):
        print(choose(build_problem(q, k, v, kernel, mask, defer_mask=defer)).name, flush=True)
""")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
def test_explain_at_t_2_17_forms_no_quadratic_tensor():
    run = lambda how: subprocess.run([sys.executable, "-c", _CHILD, how], capture_output=True, text=True,  # noqa: E731
                                     timeout=120)
    ok = run("deferred")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.split() == ["blockwise", "blockwise", "dense", "squared", "squared"]
    formed = run("formed")   # the limit is tight enough to catch the mask when it is formed
    assert formed.returncode != 0 and ("memory" in formed.stderr.lower() or "alloc" in formed.stderr.lower())
