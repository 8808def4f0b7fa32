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


@pytest.mark.parametrize("content, message", [
    (b"", "is empty \\(0 bytes\\)"),
    (bytes(range(256)) * 4, "is damaged or not a PyTorch file"),
    (b"task: {name: lm}\ntrain: {max_steps: 3}\n", "is damaged or not a PyTorch file"),  # a config.yaml
    (b"import torch\nprint(torch.ones(2))\n", "is damaged or not a PyTorch file"),
    ("half", "is damaged \\(truncated or overwritten\\?\\)"),
])
@pytest.mark.parametrize("mmap", [False, True])
def test_a_damaged_file_is_a_checkpoint_error_naming_it(tmp_path, content, message, mmap):
    from kernel_attention.training.checkpoint import CheckpointError

    path = save_checkpoint(tmp_path / "last.pt", {"model": {"w": torch.zeros(64)}, "step": 1})
    if content == "half":
        content = path.read_bytes()[: path.stat().st_size // 2]
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=f"checkpoint {path} {message}") as e:
        load_checkpoint(path, mmap=mmap)
    assert e.value.path == path


def test_a_refused_pickle_is_a_checkpoint_error(tmp_path):
    import argparse

    from kernel_attention.training.checkpoint import CheckpointError

    torch.save({"format": "kernel-attention-checkpoint", "x": argparse.Namespace()}, tmp_path / "x.pt")
    with pytest.raises(CheckpointError, match="refused because loading them could run code .*argparse.Namespace"):
        load_checkpoint(tmp_path / "x.pt")


def test_another_models_weights_are_named_not_listed_raw(tmp_path):
    from kernel_attention.training.checkpoint import CheckpointError, load_model_state

    state = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2)).state_dict()
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    with pytest.raises(CheckpointError, match=r"x.pt was written by a different model than this config builds: it has "
                                              r"2 weights this model does not \(1.weight, 1.bias\); 1 weights have "
                                              r"another shape \(checkpoint's, then this model's: 0.weight \(2, 3\) here "
                                              r"\(2, 4\)\)"):
        load_model_state(model, state, tmp_path / "x.pt")


def test_a_full_disk_says_so(tmp_path, monkeypatch):
    import errno

    import kernel_attention.training.checkpoint as checkpoint

    def full(obj, f, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(checkpoint.CheckpointError, match="cannot write checkpoint .*last.pt: No space left on device"):
        save_checkpoint(tmp_path / "last.pt", {"step": 1})
    assert list(tmp_path.iterdir()) == []   # no temporary file left behind

    def zip_writer_fails(obj, f, *a, **k):  # what torch's zip writer raises on a full disk: no errno
        raise RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(checkpoint.torch, "save", zip_writer_fails)
    monkeypatch.setattr(checkpoint, "_free_bytes", lambda folder: 1024)
    with pytest.raises(checkpoint.CheckpointError, match="No space left on device \\(0 MiB free there\\)"):
        save_checkpoint(tmp_path / "last.pt", {"step": 1})
