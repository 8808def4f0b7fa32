"""The run's metrics log: append, read back, cut back to a checkpoint's step; rank 0 alone writes."""

import importlib.util

import pytest

from kernel_attention.training.run_log import RunLog, read_metrics


def test_write_read_and_truncate(tmp_path):
    log = RunLog(tmp_path)
    for step in (1, 2, 3, 4):
        log.write({"step": step, "split": "train", "loss": 1.0 / step})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    text = (tmp_path / "metrics.jsonl").read_text()
    log.truncate(2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert (tmp_path / "metrics.jsonl").read_text() == "".join(text.splitlines(keepends=True)[:2])  # lines as written
    assert read_metrics(tmp_path / "none") == []


def test_other_ranks_write_nothing(tmp_path):
    log = RunLog(tmp_path, main=False, tensorboard=True)
    log.open()
    log.write({"step": 1, "loss": 0.5})
    log.truncate(0)
    log.close()
    assert not list(tmp_path.iterdir())


def test_tensorboard_when_asked(tmp_path):
    """Scalars go to run_dir/tb when TensorBoard is installed; without it a warning, and metrics.jsonl alone."""
    log = RunLog(tmp_path, tensorboard=True)
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.warns(UserWarning, match="TensorBoard is not installed"):
            log.open()
    else:
        log.open()
    log.write({"step": 1, "split": "valid", "loss": 0.5})
    log.close()
    assert read_metrics(tmp_path) == [{"step": 1, "split": "valid", "loss": 0.5}]
    if importlib.util.find_spec("tensorboard") is not None:
        assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_end_of_run_reads_what_fit_returned_from_the_records(tmp_path):
    """A finished run's summary, read back from metrics.jsonl (a cell whose record must be rebuilt later)."""
    from _toy_task import ToyTask
    from kernel_attention.training import TrainConfig, Trainer
    from kernel_attention.training.run_log import end_of_run

    cfg = TrainConfig(seed=1, max_steps=7, lr=3e-2, eval_every=3, progress=False)
    summary = Trainer(ToyTask(), cfg, tmp_path).fit()
    ended = end_of_run(read_metrics(tmp_path))
    assert ended["final"]["valid"]["step"] == ended["final"]["test"]["step"] == 7
    for split in ("valid", "test"):
        assert ended["final"][split]["loss"] == pytest.approx(summary["final"][split]["loss"])
    assert ended["best_test"]["loss"] == pytest.approx(summary["best_test"]["loss"])
    assert end_of_run([]) == {"final": {}, "best_test": None}
    again = Trainer(ToyTask(), cfg, tmp_path).fit()   # a finished run run again reports its end, trains no more
    assert again["step"] == 7 and again["final"]["test"]["loss"] == pytest.approx(summary["final"]["test"]["loss"])
    assert again["best_test"]["loss"] == pytest.approx(summary["best_test"]["loss"])
    for split in ("valid", "test"):  # the metrics alone, as the first fit gave them: no step, split or wall_s stamps
        assert again["final"][split].keys() == summary["final"][split].keys()
    assert again["best_test"].keys() == summary["best_test"].keys()
