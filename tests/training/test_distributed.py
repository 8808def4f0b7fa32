"""Two CPU processes (gloo) train the toy task with DDP; both ranks must hold the same weights."""

import os
import socket

import torch
import torch.multiprocessing as mp

from _toy_task import ToyTask
from kernel_attention.config import ConfigError
from kernel_attention.training import TrainConfig, Trainer, distributed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    cfg = TrainConfig(seed=1, max_steps=2, lr=0.05, accum_steps=2, checkpoint_every=1, progress=False,
                      device="cpu")
    trainer = Trainer(ToyTask(n_batches=8), cfg, os.path.join(out_dir, "run"))
    assert trainer.info.world_size == world and trainer.info.backend == "gloo"
    init = {k: v.clone() for k, v in trainer.raw_model.state_dict().items()}
    trainer.fit()
    torch.save({"init": init, "final": trainer.raw_model.state_dict()}, os.path.join(out_dir, f"rank{rank}.pt"))
    distributed.shutdown()


def test_two_process_ddp_keeps_ranks_identical(tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    r0 = torch.load(tmp_path / "rank0.pt")
    r1 = torch.load(tmp_path / "rank1.pt")
    for k in r0["final"]:
        assert torch.equal(r0["init"][k], r1["init"][k]), k
        assert torch.equal(r0["final"][k], r1["final"][k]), k
    assert any(not torch.equal(r0["init"][k], r0["final"][k]) for k in r0["final"])
    assert (tmp_path / "run" / "last.pt").is_file()
    ck = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert len(ck["rng"]) == 2 and ck["step"] == 2


def _uneven_worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    try:
        Trainer(ToyTask(n_batches=7), TrainConfig(max_steps=2, progress=False, device="cpu"),
                os.path.join(out_dir, "run"))
    except ConfigError as e:
        with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
            f.write(str(e))
    distributed.shutdown()


def test_ranks_with_unequal_batch_counts_are_refused_on_every_rank(tmp_path):
    """7 batches over 2 ranks (4 and 3): the ranks would leave epoch 0 at different steps, and a resume, which
    restores rank 0's epoch and position on every rank, would read other data than the uninterrupted run."""
    mp.spawn(_uneven_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        assert "the ranks get [4, 3] training batches per epoch" in (tmp_path / f"rank{rank}.txt").read_text()
