import os
import sys

import pytest
import torch

# Test folders share helper modules (training/_toy_task.py, backends/_common.py); pytest's importlib
# mode does not put a test's folder on sys.path, so do it here for those folders (spawned DDP workers
# inherit sys.path, and re-import their test module with the same).
HERE = os.path.dirname(os.path.abspath(__file__))
for folder in ("training", "backends"):
    path = os.path.join(HERE, folder)
    if path not in sys.path:
        sys.path.insert(0, path)


def pytest_configure(config):
    """Under pytest-xdist (``-n``) each worker takes its share of the cores for torch's intra-op threads: the
    workers' default pools, one thread per core each, would oversubscribe the machine."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // int(workers)))


@pytest.fixture
def host_reads(monkeypatch):
    """The list to which every read of a tensor's value by the host (bool, int, float, item, tolist) appends the
    file of the code that read it: on a GPU each such read waits for the device."""
    reads = []

    def counted(orig):
        def read(self, *a, **k):
            reads.append(sys._getframe(1).f_code.co_filename)
            return orig(self, *a, **k)
        return read

    for name in ("__bool__", "__int__", "__float__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    return reads


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip without CUDA; tests marked ``slow`` run only when asked for with ``-m slow``
    (what .ci/run does after the default suite) or ``KA_SLOW=1``."""
    slow = "slow" in (config.getoption("-m") or "") or os.environ.get("KA_SLOW") == "1"
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "slow" in item.keywords and not slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with -m slow or KA_SLOW=1"))
