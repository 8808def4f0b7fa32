"""The trainer reads no value back to the host between its records: on a GPU each read waits for the device,
and a step that waits cannot be queued behind the one before it."""

import sys

import torch

from _toy_task import ToyTask
from kernel_attention.training import TrainConfig, Trainer


def _reads(tmp_path, monkeypatch, steps: int) -> int:
    """Reads of tensor values (bool, int, float, item, tolist) by the library or the task in a run of ``steps``
    updates that writes one train record (at its end), with no evaluation or checkpoint in between.  torch's
    optimisers read their step counts, which they keep on the CPU: not counted."""
    reads = []

    def counted(orig):
        def read(self, *a, **k):
            caller = sys._getframe(1).f_code.co_filename
            if "kernel_attention" in caller or "_toy_task" in caller:
                reads.append(caller)
            return orig(self, *a, **k)
        return read

    for name in ("__bool__", "__int__", "__float__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    cfg = TrainConfig(seed=0, max_steps=steps, lr=1e-2, clip_norm=1.0, log_every=1000, eval_every=0,
                      checkpoint_every=0, progress=False)
    Trainer(ToyTask(reg=True), cfg, tmp_path / f"run{steps}").fit()
    monkeypatch.undo()
    return len(reads)


def test_steps_between_records_read_nothing(tmp_path, monkeypatch):
    """Loss, the task's logs, the regulariser and the gradient norm stay on the device until the record: a run
    of 8 updates reads as often as a run of 2."""
    assert _reads(tmp_path, monkeypatch, 2) == _reads(tmp_path, monkeypatch, 8)
