"""The training optimiser: PyTorch's fused Adam / AdamW on the CPU, the same updates as its per-parameter
implementation, and states written by either implementation loading into the other."""

import copy

import pytest
import torch

from kernel_attention.training.config import TrainConfig
from kernel_attention.training.optimizer import load_optimizer_state, make_optimizer


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in ((7, 5), (5,), (3, 2, 4))]


def _steps(opt, params, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_fused_on_the_cpu_and_the_same_updates_as_the_per_parameter_implementation(name):
    cfg = TrainConfig(max_steps=1, optimizer=name, lr=0.01, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6)
    ours, ref = _params(), _params()
    opt = make_optimizer(ours, cfg, torch.device("cpu"))
    assert type(opt) is (torch.optim.AdamW if name == "adamw" else torch.optim.Adam)
    assert all(g["fused"] for g in opt.param_groups)
    cls = type(opt)
    ref_opt = cls(ref, lr=0.01, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6, foreach=False)
    _steps(opt, ours, 5)
    _steps(ref_opt, ref, 5)
    for a, b, before in zip(ours, ref, _params()):
        assert (a - before).abs().min() > 1e-4  # every element moved
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("writer", ["per-parameter", "fused"])
def test_a_state_from_either_implementation_resumes_in_the_other_with_its_own_implementation(writer):
    """Five steps by the writer, its state loaded into a fresh optimiser of the other implementation, five more:
    the same parameters as ten steps of the writer; the loaded optimiser keeps its implementation and its step
    counts are placed for it."""
    cfg = TrainConfig(max_steps=1, lr=0.01)
    fused_writer = writer == "fused"
    straight = _params()
    opt = torch.optim.Adam(straight, lr=0.01, fused=fused_writer or None, foreach=None if fused_writer else False)
    _steps(opt, straight, 5)
    state = copy.deepcopy(opt.state_dict())  # a state dict holds the live tensors
    _steps(opt, straight, 5, seed=2)

    resumed = _params()
    first = torch.optim.Adam(resumed, lr=0.01, fused=fused_writer or None, foreach=None if fused_writer else False)
    _steps(first, resumed, 5)
    if fused_writer:
        loader = torch.optim.Adam(resumed, lr=0.01, foreach=False)
    else:
        loader = make_optimizer(resumed, cfg, torch.device("cpu"))
    load_optimizer_state(loader, state)
    assert bool(loader.param_groups[0]["fused"]) is (not fused_writer)
    assert all(s["step"].dtype == torch.float32 and float(s["step"]) == 5 for s in loader.state.values())
    _steps(loader, resumed, 5, seed=2)
    for a, b in zip(resumed, straight):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_a_per_parameter_state_from_the_cpu_resumes_fused_on_cuda():
    """A checkpoint that travels: five per-parameter steps on the CPU, its state loaded into the fused optimiser
    built for CUDA parameters (the step counts move to the device, as fused needs), five more steps there."""
    cpu = _params()
    opt = torch.optim.Adam(cpu, lr=0.01, foreach=False)
    _steps(opt, cpu, 5)
    state = copy.deepcopy(opt.state_dict())
    cuda = [torch.nn.Parameter(p.detach().cuda()) for p in cpu]
    loader = make_optimizer(cuda, TrainConfig(max_steps=1, lr=0.01), torch.device("cuda"))
    load_optimizer_state(loader, state)
    assert loader.param_groups[0]["fused"]
    assert all(s["step"].device.type == "cuda" for s in loader.state.values())
    _steps(opt, cpu, 5, seed=2)
    g = torch.Generator().manual_seed(2)
    for _ in range(5):
        for p in cuda:
            p.grad = torch.randn(p.shape, generator=g).cuda()
        loader.step()
    for a, b in zip(cuda, cpu):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)


def test_a_state_with_other_parameter_groups_is_refused_by_torch():
    opt = make_optimizer(_params(), TrainConfig(max_steps=1), torch.device("cpu"))
    other = torch.optim.Adam([{"params": _params()[:1]}, {"params": _params()[1:]}])
    with pytest.raises(ValueError, match="different number of parameter groups"):
        load_optimizer_state(opt, other.state_dict())
