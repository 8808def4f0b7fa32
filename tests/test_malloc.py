"""heap_malloc: large CPU tensors reuse freed heap memory instead of faulting in fresh pages, and tensors
above the mmap threshold still go back to the system when freed."""

import json
import os
import platform
import subprocess
import sys

import pytest

from kernel_attention import malloc

# Allocate, touch and free a 64 MB tensor ten times; report the minor page faults of the last eight
# (the heap may still grow once while glibc settles on a block).
_PROBE = """
import json, resource, sys, torch
from kernel_attention.malloc import heap_malloc
on = heap_malloc(children=False) if sys.argv[1] == "heap" else False
def cycle():
    x = torch.empty(16 * 2 ** 20)
    x.fill_(1.0)
    del x
cycle()
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    cycle()
print(json.dumps({"on": on, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _probe(code, *args):
    """Run ``code`` in a fresh interpreter without glibc's MALLOC_ variables; its last line, as JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_heap_malloc_reuses_large_blocks_instead_of_faulting_pages_in():
    pages = 8 * 64 * 2 ** 20 // os.sysconf("SC_PAGE_SIZE")
    system, heap = _probe(_PROBE, "system"), _probe(_PROBE, "heap")
    assert heap["on"] and not system["on"]
    assert system["faults"] > 0.9 * pages, system  # a fresh mmap per allocation
    assert heap["faults"] < pages // 4, heap       # the freed block is reused


# Allocate and touch a tensor just above the mmap threshold, free it, and report the resident set before,
# during and after (MB): a block served from the heap would stay resident under the trim threshold.
_ABOVE = """
import json, os, sys, torch
from kernel_attention.malloc import MMAP_THRESHOLD, heap_malloc
assert heap_malloc(children=False)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
before = rss()
x = torch.empty(MMAP_THRESHOLD // 4 + 2 ** 22)
x.fill_(1.0)
during = rss()
del x
print(json.dumps({"before": before, "during": during, "after": rss()}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_tensors_above_the_threshold_go_back_to_the_system():
    m = _probe(_ABOVE)
    size = malloc.MMAP_THRESHOLD / 2 ** 20 + 16
    assert m["during"] - m["before"] > 0.9 * size, m
    assert m["after"] - m["before"] < 0.1 * size, m


def test_configure_reads_its_environment_variable(monkeypatch):
    monkeypatch.setattr(malloc, "heap_malloc", lambda children=True: True)
    monkeypatch.setenv(malloc.ENV, "system")
    assert malloc.configure() == "system"
    monkeypatch.setenv(malloc.ENV, "heap")
    assert malloc.configure() == "heap"
    monkeypatch.setattr(malloc, "heap_malloc", lambda children=True: False)  # not glibc: the system's it stays
    assert malloc.configure() == "system"
    monkeypatch.setenv(malloc.ENV, "jemalloc")
    with pytest.raises(ValueError, match="KERNEL_ATTENTION_MALLOC='jemalloc' is not one of"):
        malloc.configure()


def test_machine_lines_name_the_setting_children_get(monkeypatch):
    from kernel_attention.backends.bench import machine as bench_machine
    from kernel_attention.study.api import machine as study_machine

    for var, value in malloc.CHILD_ENV.items():
        monkeypatch.setenv(var, value)
    assert malloc.describe() == "blocks under 256 MiB from the heap"
    assert bench_machine(1).endswith("malloc: blocks under 256 MiB from the heap")
    assert study_machine().endswith("malloc: blocks under 256 MiB from the heap")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert malloc.describe() == "glibc defaults" and study_machine().endswith("malloc: glibc defaults")
