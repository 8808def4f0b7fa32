"""Two CPU processes (gloo) train the toy task with DDP; both ranks must hold the same weights."""

import os
import socket

import torch
import torch.multiprocessing as mp

from _toy_task import ToyTask
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
