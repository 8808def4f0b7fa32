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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
