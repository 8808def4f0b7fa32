import json
import math

import pytest
import torch

from _toy_task import ToyTask
from kernel_attention.training import TrainConfig, Trainer, load_checkpoint
from kernel_attention.training.loop import TIMING_KEYS


def _records(run_dir):
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.append({k: v for k, v in r.items() if k not in TIMING_KEYS})
    return out


def _cfg(**kw):
    base = dict(seed=3, max_steps=10, lr=3e-2, accum_steps=2, schedule="cosine:warmup=2", clip_norm=1.0,
                eval_every=3, checkpoint_every=4, progress=False, weight_decay=0.01, optimizer="adamw")
    base.update(kw)
    return TrainConfig(**base)


def test_resume_is_exact(tmp_path):
    # 6 micro-batches per epoch, 2 per update: 3 updates per epoch, so 10 updates cross epochs.
    full = Trainer(ToyTask(reg=True), _cfg(), tmp_path / "full").fit()
    assert full["step"] == 10 and not full["interrupted"]

    killed = Trainer(ToyTask(reg=True), _cfg(stop_after=7), tmp_path / "part").fit()
    assert killed["interrupted"] and killed["step"] == 7
    assert load_checkpoint(tmp_path / "part" / "last.pt")["step"] == 4  # the kill lost steps 5..7
    resumed_trainer = Trainer(ToyTask(reg=True), _cfg(), tmp_path / "part")
    assert resumed_trainer.resumed_from == 4 and resumed_trainer.epoch == 1 and resumed_trainer.position == 2
    resumed = resumed_trainer.fit()

    a = load_checkpoint(tmp_path / "full" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "part" / "last.pt")["model"]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ra, rb = _records(tmp_path / "full"), _records(tmp_path / "part")
    assert ra == rb
    assert [r["step"] for r in ra if r["split"] == "train"] == list(range(1, 11))
    assert "regularization" in ra[0]
    assert full["best"] == resumed["best"]
    best = load_checkpoint(tmp_path / "full" / "best.pt")
    valid = [r for r in ra if r["split"] == "valid"]
    assert best["step"] == min(valid, key=lambda r: r["loss"])["step"] == full["best"]["step"]


def test_resume_is_exact_where_a_checkpoint_falls_between_two_train_records(tmp_path):
    """A checkpoint at step 4 of records every 3 steps: the record at step 6 of the resumed run averages steps 4 to
    6, as the uninterrupted run's does (the checkpoint keeps the sums of step 4)."""
    Trainer(ToyTask(reg=True), _cfg(log_every=3), tmp_path / "full").fit()
    Trainer(ToyTask(reg=True), _cfg(log_every=3, stop_after=5), tmp_path / "part").fit()
    assert load_checkpoint(tmp_path / "part" / "last.pt")["log_window"][0]["steps"] == 1
    Trainer(ToyTask(reg=True), _cfg(log_every=3), tmp_path / "part").fit()
    ra, rb = _records(tmp_path / "full"), _records(tmp_path / "part")
    assert [r["step"] for r in ra if r["split"] == "train"] == [3, 6, 9, 10]
    assert ra == rb


def test_run_killed_before_its_first_checkpoint_starts_over_with_a_clean_log(tmp_path):
    """No last.pt yet: the next run starts at step 0, and the killed run's records are dropped,
    so the log holds one run (not a second curve appended to the first)."""
    full = Trainer(ToyTask(reg=True), _cfg(), tmp_path / "full").fit()
    killed = Trainer(ToyTask(reg=True), _cfg(stop_after=3), tmp_path / "part").fit()
    assert killed["interrupted"] and not (tmp_path / "part" / "last.pt").exists()
    assert [r["step"] for r in _records(tmp_path / "part") if r["split"] == "train"] == [1, 2, 3]
    again = Trainer(ToyTask(reg=True), _cfg(), tmp_path / "part")
    assert again.resumed_from is None
    assert again.fit()["best"] == full["best"]
    assert _records(tmp_path / "part") == _records(tmp_path / "full")


def test_a_line_cut_short_by_a_kill_neither_stops_the_resume_nor_stays_in_the_log(tmp_path):
    """A process killed while it wrote a record leaves half a line: readers skip it, the resumed run drops it
    with the other records after its checkpoint, and the log ends as the uninterrupted run's."""
    from kernel_attention.training import read_metrics

    Trainer(ToyTask(reg=True), _cfg(), tmp_path / "full").fit()
    Trainer(ToyTask(reg=True), _cfg(stop_after=7), tmp_path / "part").fit()
    with open(tmp_path / "part" / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "epoch": 2, "split": "tr')
    assert [r["step"] for r in read_metrics(tmp_path / "part")][-1] == 7
    Trainer(ToyTask(reg=True), _cfg(), tmp_path / "part").fit()
    assert _records(tmp_path / "part") == _records(tmp_path / "full")


def test_finished_run_is_not_repeated(tmp_path):
    Trainer(ToyTask(), _cfg(max_steps=3, eval_every=0, checkpoint_every=0), tmp_path).fit()
    n = len(_records(tmp_path))
    again = Trainer(ToyTask(), _cfg(max_steps=3, eval_every=0, checkpoint_every=0), tmp_path).fit()
    assert again["step"] == 3 and len(_records(tmp_path)) == n


def test_accumulation_matches_one_big_batch(tmp_path):
    """2 micro-batches of 4 give the gradient of 1 batch of 8 (mean losses, no dropout)."""
    grads = {}

    def capture(trainer, name):
        step = trainer.optimizer.step

        def wrapped(*a, **k):
            grads[name] = [p.grad.detach().clone() for p in trainer.raw_model.parameters()]
            return step(*a, **k)

        trainer.optimizer.step = wrapped

    class Big(ToyTask):
        def train_batches(self, epoch, rank=0, world_size=1):
            small = ToyTask.train_batches(self, epoch)
            return [torch.cat(small[i:i + 2]) for i in range(0, len(small), 2)]

    t1 = Trainer(ToyTask(batch=4, dropout=False), _cfg(max_steps=1, accum_steps=2, clip_norm=0.0), tmp_path / "a")
    capture(t1, "micro")
    t1.fit()
    t2 = Trainer(Big(batch=4, dropout=False), _cfg(max_steps=1, accum_steps=1, clip_norm=0.0), tmp_path / "b")
    capture(t2, "big")
    t2.fit()
    for g1, g2 in zip(grads["micro"], grads["big"]):
        torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in grads["micro"])


def test_max_epochs_and_partial_last_group(tmp_path):
    # 5 micro-batches per epoch with accum 2 -> updates of 2, 2, 1 -> 3 per epoch
    out = Trainer(ToyTask(n_batches=5), _cfg(max_steps=None, max_epochs=2, eval_every=0, checkpoint_every=0),
                  tmp_path).fit()
    assert out["step"] == 6 and out["epoch"] == 2
    recs = _records(tmp_path)
    assert {r["split"] for r in recs} == {"train", "valid", "test"}
    assert sum(1 for r in recs if r.get("checkpoint") == "best") == 1


def test_an_epoch_with_no_batch_is_an_error_not_an_endless_loop(tmp_path):
    from kernel_attention.config import ConfigError

    with pytest.raises(ConfigError, match=r"the training split gave no batch in epoch 0 \(rank 0 of 1\)"):
        Trainer(ToyTask(n_batches=0), _cfg(eval_every=0, checkpoint_every=0), tmp_path).fit()


def test_schedule_drives_optimizer_lr(tmp_path):
    Trainer(ToyTask(), _cfg(max_steps=6, schedule="inverse_sqrt:warmup=3,warmup_init_lr=1e-4",
                            eval_every=0, checkpoint_every=0), tmp_path).fit()
    lrs = [r["lr"] for r in _records(tmp_path) if r["split"] == "train"]
    lr, w, w0 = 3e-2, 3, 1e-4
    expected = [w0 + s * (lr - w0) / w if s < w else lr * math.sqrt(w / s) for s in range(6)]
    assert lrs == pytest.approx(expected, rel=1e-12)


def test_config_errors_and_cpu_precision(tmp_path):
    with pytest.raises(ValueError, match="max_steps or max_epochs"):
        TrainConfig()
    with pytest.raises(ValueError, match="accepted: .*max_steps"):
        TrainConfig.from_dict({"max_steps": 1, "bogus": 2})
    with pytest.raises(ValueError, match="unknown schedule 'warm'; accepted: constant, cosine, inverse_sqrt"):
        TrainConfig(max_steps=1, schedule="warm")
    with pytest.warns(UserWarning, match="'fp16' needs CUDA"):
        t = Trainer(ToyTask(), _cfg(max_steps=1, precision="fp16", device="cpu"), tmp_path)
    assert t.precision == "fp32"


class _DtypeSeen(ToyTask):
    """Records the dtype of the output layer's result in training steps: bfloat16 where a step is autocast."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: set[torch.dtype] = set()

    def build_model(self):
        m = super().build_model()
        m.out.register_forward_hook(lambda mod, args, out: self.seen.add(out.dtype) if mod.training else None)
        return m


def _mixed_precision_resumes_exactly(tmp_path, device, precision):
    cfg = dict(device=device, precision=precision)
    task = _DtypeSeen()
    full = Trainer(task, _cfg(**cfg), tmp_path / "full")
    assert full.precision == precision and full.scaler.is_enabled() == (precision == "fp16")
    full.fit()
    assert task.seen == {full.amp_dtype}  # the weights stay float32, the matmuls run in the low precision
    Trainer(ToyTask(), _cfg(stop_after=6, **cfg), tmp_path / "part").fit()
    ck = load_checkpoint(tmp_path / "part" / "last.pt")
    assert (ck["scaler"] is not None) == (precision == "fp16")
    Trainer(ToyTask(), _cfg(**cfg), tmp_path / "part").fit()
    a = load_checkpoint(tmp_path / "full" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "part" / "last.pt")["model"]
    assert all(a[k].dtype == torch.float32 and torch.equal(a[k], b[k]) for k in a)
    assert all(math.isfinite(r["loss"]) for r in _records(tmp_path / "full") if r["split"] == "train")


def test_bf16_on_the_cpu_autocasts_and_resumes_exactly(tmp_path):
    _mixed_precision_resumes_exactly(tmp_path, "cpu", "bf16")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_cuda_resumes_exactly(tmp_path, precision):
    _mixed_precision_resumes_exactly(tmp_path, "cuda", precision)
    assert load_checkpoint(tmp_path / "part" / "last.pt")["rng"][0]["cuda"] is not None


def test_time_based_checkpoint_bounds_what_a_kill_loses(tmp_path, monkeypatch):
    """With no checkpoint_every (as the papers' configs), last.pt is still written once checkpoint_minutes have
    passed since the last write, so a kill loses at most that much; resuming from it is exact."""
    import kernel_attention.training.loop as loop

    clock = [0.0]
    monkeypatch.setattr(loop.time, "time", lambda: clock[0])

    class Ticking(ToyTask):  # one minute per update
        def loss(self, model, batch):
            clock[0] += 60.0
            return super().loss(model, batch)

    cfg = dict(checkpoint_every=0, eval_every=0, accum_steps=1, max_steps=7)
    full = Trainer(Ticking(), _cfg(**cfg), tmp_path / "full").fit()
    killed = Trainer(Ticking(), _cfg(**cfg, checkpoint_minutes=2.5, stop_after=5), tmp_path / "part").fit()
    assert killed["interrupted"] and load_checkpoint(tmp_path / "part" / "last.pt")["step"] == 3
    off = Trainer(Ticking(), _cfg(**cfg, checkpoint_minutes=0, stop_after=5), tmp_path / "off").fit()
    assert off["interrupted"] and not (tmp_path / "off" / "last.pt").exists()
    resumed = Trainer(Ticking(), _cfg(**cfg, checkpoint_minutes=2.5), tmp_path / "part")
    assert resumed.resumed_from == 3
    assert resumed.fit()["best"] == full["best"]
    a = load_checkpoint(tmp_path / "full" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "part" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="checkpoint_minutes must be >= 0"):
        TrainConfig(max_steps=1, checkpoint_minutes=-1)


def test_wall_time_counts_on_across_a_resume(tmp_path, monkeypatch):
    """``wall_s`` is the run's training time: a resumed run goes on from its checkpoint's ``elapsed_s``, so an
    interrupted run's log (and the time a study records) reads like the uninterrupted run's; the minutes the
    kill lost after the checkpoint are not counted (they are trained again)."""
    import kernel_attention.training.loop as loop

    clock = [1000.0]
    monkeypatch.setattr(loop.time, "time", lambda: clock[0])

    class Ticking(ToyTask):  # one minute per micro-batch
        def loss(self, model, batch):
            clock[0] += 60.0
            return super().loss(model, batch)

    cfg = dict(checkpoint_every=3, eval_every=0, accum_steps=1, max_steps=7)
    Trainer(Ticking(), _cfg(**cfg), tmp_path / "full").fit()
    Trainer(Ticking(), _cfg(**cfg, stop_after=5), tmp_path / "part").fit()
    assert load_checkpoint(tmp_path / "part" / "last.pt")["elapsed_s"] == 180.0
    clock[0] += 3600.0  # the process was down for an hour
    resumed = Trainer(Ticking(), _cfg(**cfg), tmp_path / "part")
    assert resumed.resumed_elapsed == 180.0
    resumed.fit()

    def walls(d):
        rows = map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
        return [(r["step"], r["split"], r["wall_s"]) for r in rows]
    assert walls(tmp_path / "part") == walls(tmp_path / "full")
    assert [w for s, split, w in walls(tmp_path / "full") if split == "train"] == [60.0 * s for s in range(1, 8)]
    assert load_checkpoint(tmp_path / "part" / "last.pt")["elapsed_s"] == 420.0


@pytest.mark.parametrize("field, value, accepted", [
    ("max_steps", "abc", "an integer >= 1"), ("max_steps", -5, "an integer >= 1"), ("max_steps", 2.5, "an integer"),
    ("log_every", 0, "an integer >= 1"), ("lr", float("nan"), "a finite number > 0"), ("lr", "nan", "a finite number"),
    ("lr", -1, "a finite number > 0"), ("lr", 0, "a finite number > 0"), ("clip_norm", -1, "a finite number >= 0"),
    ("eval_every", -1, "an integer >= 0"), ("checkpoint_every", True, "an integer"),
    ("progress", "yes", "true or false"), ("betas", [0.9], "two numbers in \\[0, 1\\)"),
])
def test_train_values_are_checked_naming_the_key_and_what_is_accepted(field, value, accepted):
    with pytest.raises(ValueError, match=f"train.{field} must be {accepted}.*got"):
        TrainConfig.from_dict({"max_steps": 3, field: value})


def test_the_test_split_is_evaluated_once_when_the_best_step_is_the_last(tmp_path):
    """With no evaluation before the end, the final valid evaluation is the best one and best.pt holds
    the final weights: their test numbers are the final ones, not a second pass over the test set."""
    calls = []

    class Counting(ToyTask):
        def evaluate(self, model, split):
            calls.append(split)
            return super().evaluate(model, split)

    out = Trainer(Counting(), _cfg(max_steps=3, eval_every=0, checkpoint_every=0), tmp_path).fit()
    assert calls.count("test") == 1 and out["best"]["step"] == 3
    assert out["best_test"] == out["final"]["test"]
    best = [r for r in _records(tmp_path) if r.get("checkpoint") == "best"]
    assert len(best) == 1 and best[0]["loss"] == out["final"]["test"]["loss"]   # the record is still written


def test_plain_progress_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    Trainer(ToyTask(), _cfg(max_steps=4, log_every=2, progress=None, accum_steps=1), tmp_path).fit()
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("step ")]
    assert len(lines) == 2, lines
    assert lines[0].startswith("step 2/4 (50%)  loss ") and "tokens/s" in lines[0] and "ETA " in lines[0]
    assert lines[1].startswith("step 4/4 (100%)")
    Trainer(ToyTask(), _cfg(max_steps=2, progress=False), tmp_path / "quiet").fit()
    assert "step " not in capsys.readouterr().err                                  # progress=false: nothing


def test_a_run_bounded_by_epochs_logs_its_last_steps(tmp_path, capsys):
    """3 updates an epoch, 2 epochs, a record every 4: steps 5 and 6 end the run between two logged steps; their
    record and progress line come at the end of the last epoch."""
    Trainer(ToyTask(n_batches=5), _cfg(max_steps=None, max_epochs=2, log_every=4, eval_every=0, checkpoint_every=0,
                                       progress=None), tmp_path).fit()
    train = [r for r in _records(tmp_path) if r["split"] == "train"]
    assert [r["step"] for r in train] == [4, 6]
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("step ")]
    assert lines[-1].startswith("step 6 ") or lines[-1].startswith("step 6/"), lines


def test_plain_progress_lines_are_at_most_one_per_interval_but_the_last_always_prints():
    import io

    from kernel_attention.training.progress_line import ProgressLines

    out = io.StringIO()
    lines = ProgressLines(100, 0, stream=out, interval=3600.0)
    for step in (10, 20, 30):
        lines.update(step, 1.0, 1e-3, 100.0, 2.0)
    lines.update(100, 0.5, 1e-3, 100.0, 2.0, final=True)
    printed = out.getvalue().splitlines()
    assert [l.split()[1] for l in printed] == ["10/100", "100/100"]


class _Scripted(ToyTask):
    """Validation loss read from ``script`` at the trainer's step (``trainer`` is set after construction),
    so that the sequence of validation scores is known whatever the weights do."""

    script = {1: 5.0, 2: 4.0, 3: 4.5, 4: 4.2, 5: 3.0, 6: 2.0}
    trainer = None

    def evaluate(self, model, split):
        out = super().evaluate(model, split)
        return {**out, "loss": self.script[self.trainer.step]} if split == "valid" else out


def _scripted_run(run_dir, **kw):
    task = _Scripted()
    trainer = Trainer(task, _cfg(max_steps=6, eval_every=1, accum_steps=1, checkpoint_every=1, **kw), run_dir)
    task.trainer = trainer
    return trainer, trainer.fit()


def test_early_stopping_stops_after_patience_evaluations_without_improvement(tmp_path):
    # valid loss 5, 4 (best), 4.5, 4.2: two evaluations in a row without improvement -> stop at step 4,
    # before the 3.0 of step 5; best.pt is step 2's and is the one tested.
    _, out = _scripted_run(tmp_path / "p2", patience=2)
    assert out["step"] == 4 and out["stopped_early"] and out["best"]["step"] == 2
    assert [r["step"] for r in _records(tmp_path / "p2") if r["split"] == "valid"] == [1, 2, 3, 4]
    assert [r.get("best_step") for r in _records(tmp_path / "p2") if r.get("checkpoint") == "best"] == [2]
    # patience 3 rides over the two bad evaluations and trains to max_steps
    _, out = _scripted_run(tmp_path / "p3", patience=3)
    assert out["step"] == 6 and not out["stopped_early"] and out["best"]["step"] == 6
    # no patience: max_steps
    _, out = _scripted_run(tmp_path / "none")
    assert out["step"] == 6 and not out["stopped_early"]


def test_early_stopping_survives_a_kill_and_a_finished_run_stays_finished(tmp_path):
    full = _records(_scripted_run(tmp_path / "full", patience=2)[0].run_dir)
    _, cut = _scripted_run(tmp_path / "cut", patience=2, stop_after=3)    # killed after one stale evaluation
    assert cut["interrupted"]
    _, out = _scripted_run(tmp_path / "cut", patience=2)                   # resumes with the count kept
    assert out["step"] == 4 and out["stopped_early"]
    assert _records(tmp_path / "cut") == full
    trainer, again = _scripted_run(tmp_path / "cut", patience=2)          # finished: nothing more is trained
    assert again["step"] == 4 and trainer.stale_evals == 2


def test_patience_needs_evaluations():
    with pytest.raises(ValueError, match="train.patience=2 counts evaluations: it needs train.eval_every > 0"):
        TrainConfig(max_steps=3, patience=2)
    with pytest.raises(ValueError, match="train.patience must be an integer >= 1"):
        TrainConfig(max_steps=3, eval_every=1, patience=0)


@pytest.mark.slow
def test_compiled_training_matches_eager_and_its_checkpoint_resumes_eager(tmp_path):
    """``compile=True`` trains through torch.compile: the same losses and weights as eager (no dropout, whose
    random draws differ under Inductor), a checkpoint of the eager module's parameter names, and a run
    killed while compiled that resumes without compiling to the uninterrupted run's weights."""
    torch._dynamo.reset()
    eager = Trainer(ToyTask(dropout=False), _cfg(), tmp_path / "eager").fit()
    compiled = Trainer(ToyTask(dropout=False), _cfg(compile=True), tmp_path / "compiled")
    assert isinstance(compiled.model, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled.fit()["step"] == eager["step"] == 10
    ra, rb = _records(tmp_path / "eager"), _records(tmp_path / "compiled")
    assert [(r["split"], r["step"]) for r in ra] == [(r["split"], r["step"]) for r in rb]
    torch.testing.assert_close([r["loss"] for r in ra], [r["loss"] for r in rb], rtol=1e-5, atol=1e-6)
    a = load_checkpoint(tmp_path / "eager" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "compiled" / "last.pt")["model"]
    assert list(a) == list(b)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    Trainer(ToyTask(dropout=False), _cfg(compile=True, stop_after=7), tmp_path / "part").fit()
    Trainer(ToyTask(dropout=False), _cfg(), tmp_path / "part").fit()
    torch.testing.assert_close(load_checkpoint(tmp_path / "part" / "last.pt")["model"], a, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_a_finished_run_given_more_steps_trains_on_to_the_longer_runs_result(tmp_path):
    """With a schedule that does not depend on max_steps and the old limit on an evaluation step, a run of
    6 updates resumed with max_steps=10 is the run of 10 updates: weights, records and best step."""
    cfg = dict(schedule="inverse_sqrt:warmup=2", eval_every=3)
    full = Trainer(ToyTask(), _cfg(**cfg), tmp_path / "full").fit()
    Trainer(ToyTask(), _cfg(max_steps=6, **cfg), tmp_path / "part").fit()
    assert any(r.get("final") for r in _records(tmp_path / "part"))
    longer = Trainer(ToyTask(), _cfg(**cfg), tmp_path / "part")
    assert longer.finished and longer.resumed_from == 6
    more = longer.fit()
    assert more["step"] == 10 and more["best"] == full["best"]
    def records(run):  # planned_steps: the limit the record was written under
        return [{k: v for k, v in r.items() if k != "planned_steps"} for r in _records(run)]
    assert records(tmp_path / "part") == records(tmp_path / "full")
    a = load_checkpoint(tmp_path / "full" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "part" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
