"""The trainer reads no value back to the host between its records: on a GPU each read waits for the device,
and a step that waits cannot be queued behind the one before it."""

from _toy_task import ToyTask
from kernel_attention.training import TrainConfig, Trainer


def _reads(tmp_path, host_reads, steps: int) -> int:
    """Reads of tensor values by the library or the task in a run of ``steps`` updates that writes one train
    record (at its end), with no evaluation or checkpoint in between.  torch's optimisers read their step counts,
    which they keep on the CPU: not counted."""
    cfg = TrainConfig(seed=0, max_steps=steps, lr=1e-2, clip_norm=1.0, log_every=1000, eval_every=0,
                      checkpoint_every=0, progress=False)
    host_reads.clear()
    Trainer(ToyTask(reg=True), cfg, tmp_path / f"run{steps}").fit()
    return sum("kernel_attention" in f or "_toy_task" in f for f in host_reads)


def test_steps_between_records_read_nothing(tmp_path, host_reads):
    """Loss, the task's logs, the regulariser and the gradient norm stay on the device until the record: a run
    of 8 updates reads as often as a run of 2."""
    assert _reads(tmp_path, host_reads, 2) == _reads(tmp_path, host_reads, 8)
