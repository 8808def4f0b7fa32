import random

import numpy as np
import pytest
import torch

from kernel_attention.training.checkpoint import get_rng_state, load_checkpoint, save_checkpoint, set_rng_state


def test_round_trip_restores_weights_optimizer_and_rng(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    rng = get_rng_state()
    draws = (random.random(), np.random.rand(), torch.rand(2))
    path = save_checkpoint(tmp_path / "last.pt", {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                                  "rng": [rng], "step": 7, "epoch": 1, "position": 3})
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left

    ck = load_checkpoint(path)
    model2 = torch.nn.Linear(3, 2)
    model2.load_state_dict(ck["model"])
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    opt2.load_state_dict(ck["optimizer"])
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], opt2.state_dict()["state"][0]["exp_avg"])
    assert (ck["step"], ck["epoch"], ck["position"]) == (7, 1, 3)
    set_rng_state(ck["rng"][0])
    again = (random.random(), np.random.rand(), torch.rand(2))
    assert draws[0] == again[0] and draws[1] == again[1] and torch.equal(draws[2], again[2])


def test_load_rejects_other_files(tmp_path):
    torch.save({"weights": 1}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="not a kernel-attention checkpoint"):
        load_checkpoint(tmp_path / "x.pt")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_cuda_generator_states_are_restored_per_device_from_cpu_tensors(monkeypatch):
    """The CUDA branch of set_rng_state without a GPU: the saved per-device states reach
    torch.cuda.set_rng_state_all as CPU byte tensors (which it requires; a checkpoint loaded with
    map_location="cuda" holds them on the GPU), one per device, unchanged.  The GPU run of the same
    path is tests/training/test_loop.py::test_mixed_precision_on_cuda_resumes_exactly."""
    got = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: got.extend(states))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all",
                        lambda: [torch.arange(16, dtype=torch.uint8) + i for i in range(2)])
    state = get_rng_state()
    assert len(state["cuda"]) == 2
    set_rng_state(state)
    assert len(got) == 2
    for s, saved in zip(got, state["cuda"]):
        assert s.device.type == "cpu" and s.dtype == torch.uint8 and torch.equal(s, saved)
    got.clear()
    set_rng_state({**state, "cuda": None})  # a checkpoint written without a GPU restores none
    assert got == []
