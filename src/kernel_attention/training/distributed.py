"""Multi-process data parallelism: plain ``torch.distributed`` + ``DistributedDataParallel``.

Launch with torchrun (it sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)::

    torchrun --standalone --nproc_per_node=2 -m kernel_attention train ...

:func:`setup` reads those variables and, when ``WORLD_SIZE > 1``, joins the process group: ``nccl`` when
CUDA is available (each process on ``cuda:LOCAL_RANK``), ``gloo`` otherwise (CPU, what the tests use).
Without them it is a no-op and everything below degrades to single-process behaviour, so the same code
runs under ``python`` and ``torchrun``.  Only rank 0 logs, evaluates and writes checkpoints
(:func:`is_main`); the others wait at :func:`barrier`.  Call :func:`shutdown` at the end.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from kernel_attention.config import ConfigError

__all__ = ["DistInfo", "setup", "shutdown", "is_distributed", "rank", "world_size", "is_main", "barrier",
           "all_reduce_mean", "all_gather_object", "wrap_model"]


@dataclasses.dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None when not distributed


def setup(device: str | torch.device | None = None, backend: str | None = None,
          timeout_s: float = 600.0) -> DistInfo:
    """Join the process group described by the torchrun environment (if any) and pick the device.

    ``device=None`` picks ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``.  ``backend=None`` picks
    ``nccl`` for CUDA devices and ``gloo`` for CPU.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rk = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rk)))
    if device is None:
        device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={str(device)!r}: this machine has no CUDA device that torch "
                          f"{torch.__version__} can use; leave train.device out to train on the CPU")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        dist.init_process_group(backend=backend, rank=rk, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    if dist.is_initialized():
        return DistInfo(dist.get_rank(), local, dist.get_world_size(), device, dist.get_backend())
    return DistInfo(0, 0, 1, device, None)


def shutdown() -> None:
    """Leave the process group (after a barrier so no rank exits while others still talk)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_mean(values: dict[str, float], device: torch.device | str = "cpu") -> dict[str, float]:
    """Average a dict of floats over ranks (keys must agree on every rank)."""
    if not is_distributed() or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t /= world_size()
    return dict(zip(keys, t.tolist()))


def all_gather_object(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` (a one-element list when not distributed)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def wrap_model(model: nn.Module, device: torch.device) -> nn.Module:
    """``DistributedDataParallel(model)`` when distributed, else ``model``.  DDP broadcasts rank 0's
    parameters and buffers at construction, so all ranks start identical."""
    if not is_distributed():
        return model
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)
