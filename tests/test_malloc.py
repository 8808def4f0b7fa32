"""heap_malloc: large CPU tensors reuse freed heap memory instead of faulting in fresh pages."""

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


def _faults(mode):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_heap_malloc_reuses_large_blocks_instead_of_faulting_pages_in():
    pages = 8 * 64 * 2 ** 20 // os.sysconf("SC_PAGE_SIZE")
    system, heap = _faults("system"), _faults("heap")
    assert heap["on"] and not system["on"]
    assert system["faults"] > 0.9 * pages, system  # a fresh mmap per allocation
    assert heap["faults"] < pages // 4, heap       # the freed block is reused


def test_configure_reads_its_environment_variable(monkeypatch):
    monkeypatch.setattr(malloc, "heap_malloc", lambda children=True: True)
    monkeypatch.setenv(malloc.ENV, "system")
    assert malloc.configure() == "system"
    monkeypatch.setenv(malloc.ENV, "heap")
    assert malloc.configure() == "heap"
    monkeypatch.setenv(malloc.ENV, "jemalloc")
    with pytest.raises(ValueError, match="KERNEL_ATTENTION_MALLOC='jemalloc' is not one of"):
        malloc.configure()
