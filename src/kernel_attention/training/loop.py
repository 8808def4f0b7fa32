"""One training loop for every task family: :class:`Trainer` driven by a :class:`TrainConfig`.

    trainer = Trainer(task, TrainConfig(max_steps=1000, lr=5e-4, schedule="inverse_sqrt:warmup=4000"),
                      run_dir="runs/x")
    summary = trainer.fit()

What one optimiser *step* (update) does, with ``n = accum_steps`` micro-batches ``b_1..b_n`` from
``task.train_batches(epoch, rank, world_size)``::

    lr = schedule(step)                                 # step = updates made so far
    for i, b in enumerate(group):                       # DDP gradient sync only on the last (no_sync)
        with autocast(bf16 | fp16, or off for fp32):
            loss, logs = task.loss(model, b)
            loss += regularization_weight * model.regularization()     # only if the model has it
        scaler.scale(loss / len(group)).backward()      # mean over micro-batches = one big batch
    unscale; clip_grad_norm_(clip_norm) if clip_norm > 0; optimizer.step(); step += 1

then, on multiples of ``log_every`` / ``eval_every`` / ``checkpoint_every`` steps: a ``train`` record in
``metrics.jsonl``, ``task.evaluate(model, "valid")`` (+ ``best.pt`` if it improved
``task.metric_for_selection``), ``last.pt`` (and, with ``keep_last = N``, its weights as ``step_<k>.pt``, the
newest N kept, for checkpoint averaging: :mod:`.averaging`); ``last.pt`` also on a logged step once
``checkpoint_minutes`` have passed since it was last written (the ranks decide on their mean elapsed time,
reduced with the train record, so that they all call the collective save together). Training stops at
``max_steps`` updates or after ``max_epochs`` epochs, whichever comes first, or (``patience = P``) once P
evaluations in a row have not improved on the best validation metric (early stopping; the count is kept in the
checkpoints, so a resumed run stops where an uninterrupted one would); then "valid" and "test" are evaluated,
``last.pt`` is written, and (``test_best``) the ``best.pt`` weights are evaluated on "test" too (unless they are
the final weights, best at the last step: their test numbers are then the final ones, and the test
split is evaluated once).

Run directory: ``metrics.jsonl`` (one JSON object per line: ``{"step", "epoch", "split": "train" |
"valid" | "test", <metrics>, "wall_s"}``; train records also carry ``planned_steps`` where the run's length
is known, so that a reader can tell how far it is; final records have ``"final": true``, the best
checkpoint's test record ``"checkpoint": "best"``; written by :mod:`.run_log`), ``last.pt``, ``best.pt`` (see
:mod:`.checkpoint`), and TensorBoard event files when ``tensorboard=True`` and it is installed.  ``wall_s`` is
the seconds the run has trained, counted on across resumes: a checkpoint keeps the time up to it
(``elapsed_s``) and a resumed run adds on from there.

Exact resume: with ``resume=True`` and a ``last.pt`` in ``run_dir``, the trainer restores weights,
optimiser, scaler, every RNG and the task's training state (per rank: a Transformer-XL memory), the step, the
epoch and the micro-batch position inside it, the sums of the updates since the last train record,
drops ``metrics.jsonl`` lines written after that checkpoint, and continues; the result is identical to an
uninterrupted run.  A finished run resumed with a larger ``max_steps`` trains on from its end, its end-of-run
records dropped: the longer run, where the schedule does not depend on ``max_steps`` and the old limit was
an evaluation step.  ``stop_after`` (or env ``KA_STOP_AFTER``) ends :meth:`Trainer.fit` right after that
many updates *without* writing anything more, which is how tests simulate a kill.  Ctrl-C (SIGINT) or a
scheduler's SIGTERM ends it at the next logged step with ``last.pt`` written there, raising
:class:`~.interrupt.Stopped` (a ``KeyboardInterrupt``; :mod:`.interrupt`).

``compile=True`` trains through ``torch.compile(model, dynamic=True)`` (after the DDP wrapper); ``task.loss``
calls the compiled module, ``task.evaluate`` may call it or :func:`~.task.unwrap` it, and checkpoints hold
the eager module's weights, so a run may be resumed with or without compiling.

Precision ``"bf16"`` uses ``torch.autocast`` on the CPU or CUDA; ``"fp16"`` autocasts on CUDA with a
``GradScaler`` and falls back to fp32, with a warning, elsewhere.  Optimisers (:mod:`.optimizer`): ``"adam"``
(``torch.optim.Adam``, L2 weight decay added to the gradient) and ``"adamw"`` (decoupled weight decay; this
is what fairseq's ``--optimizer adam --weight-decay`` does).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from kernel_attention.atomic_write import remove_orphans
from kernel_attention.config import ConfigError
from kernel_attention.training import distributed as D
from kernel_attention.training.averaging import drop_snapshots_after, keep_snapshot
from kernel_attention.training.checkpoint import (get_rng_state, load_checkpoint, load_model_state, save_checkpoint,
                                                  set_rng_state)
from kernel_attention.training.config import TrainConfig, seed_everything
from kernel_attention.training.interrupt import StopRequest, Stopped
from kernel_attention.training.optimizer import load_optimizer_state, make_optimizer
from kernel_attention.training.progress_line import progress_display
from kernel_attention.training.run_log import METRICS_FILE, RunLog, end_of_run, metrics_of, read_metrics
from kernel_attention.training.schedules import SCHEDULES
from kernel_attention.training.task import Task

__all__ = ["Trainer", "TIMING_KEYS"]

#: keys of metrics.jsonl records that depend on wall-clock time (everything else is reproducible)
TIMING_KEYS = ("wall_s", "steps_per_s", "tokens_per_s")

#: keys that ride along with the train record's reduction (not logged): the seconds since last.pt, and
#: whether a rank was asked to stop (:mod:`.interrupt`)
SINCE_SAVE, STOP = "_since_save_s", "_stop"


class Trainer:
    """Trains ``task``'s model under ``config``, writing into ``run_dir`` (see the module docstring).

    ``resume=True`` continues from ``run_dir/last.pt`` when it exists; ``resume_check``, if given, is called
    with that checkpoint first and may raise to refuse it (the command line's check that the config did not
    change).  ``extra`` is stored in every checkpoint under ``"extra"`` (e.g. the model/task config needed to
    rebuild the model later).
    Attributes after construction: ``model`` (possibly DDP-wrapped), ``raw_model``, ``optimizer``,
    ``schedule``, ``step``, ``epoch``, ``position``, ``best``, ``info`` (:class:`~.distributed.DistInfo`).
    """

    def __init__(self, task: Task, config: TrainConfig, run_dir: str | os.PathLike, resume: bool = True,
                 extra: dict[str, Any] | None = None, resume_check: Callable[[dict], None] | None = None):
        self.task, self.config, self.run_dir, self.extra = task, config, Path(run_dir), dict(extra or {})
        self.info = D.setup(config.device)
        self.device = self.info.device
        self.is_main = self.info.rank == 0
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = RunLog(self.run_dir, main=self.is_main, tensorboard=config.tensorboard)

        self.precision = config.precision
        if self.precision == "fp16" and self.device.type != "cuda":  # its loss scaler is CUDA's
            warnings.warn(f"precision 'fp16' needs CUDA; training in fp32 on {self.device} ('bf16' runs there)")
            self.precision = "fp32"
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)

        seed_everything(config.seed)  # the initial weights depend on the seed only
        self.raw_model: nn.Module = task.build_model().to(self.device)
        task.device = self.device
        seed_everything(config.seed + self.info.rank)  # dropout etc. differ per rank

        self.optimizer = make_optimizer(self.raw_model.parameters(), config, self.device)
        self.planned_steps = self._planned_steps()
        self.schedule = SCHEDULES.create(config.schedule, lr=config.lr, max_steps=self.planned_steps)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")

        self.step, self.epoch, self.position = 0, 0, 0
        self.best: dict[str, Any] = {"metric": task.metric_for_selection, "value": None, "step": None}
        self.stale_evals = 0  # evaluations since the last improvement of best (early stopping)
        self.finished = False
        self.resumed_from: int | None = None
        self.resumed_elapsed = 0.0  # seconds of training up to the checkpoint resumed from
        self._t0: float | None = None  # when fit() began in this process
        # the updates since the last train record: the sums of their logs, their count and their tokens (a
        # checkpoint between two records keeps them, so that the next record averages the same updates)
        self._window: tuple[dict, int, int] = ({}, 0, 0)
        if self.is_main and self.run_dir.is_dir():
            remove_orphans(self.run_dir)  # the half-written checkpoint of a process killed while it saved
        if resume and (self.run_dir / "last.pt").is_file():
            ck = load_checkpoint(self.run_dir / "last.pt", map_location=self.device)
            if resume_check is not None:
                resume_check(ck)
            self._restore(ck)
        else:  # a run killed before its first checkpoint starts again from step 0: its records go too
            self.metrics.truncate(0)
        if self.is_main:
            drop_snapshots_after(self.run_dir, self.step)
        self.model = D.wrap_model(self.raw_model, self.device)
        if config.compile:  # dynamic: token batches vary in length, and one graph serves them all
            self.model = torch.compile(self.model, dynamic=True)
        self._last_eval: tuple[int, dict] | None = None
        self._last_eval_step: int | None = None

    # -- checkpoints ------------------------------------------------------------------------------
    def state(self, ranks: list[tuple] | None = None) -> dict[str, Any]:
        """The checkpoint's dict; ``ranks``: each rank's ``(RNG state, task.train_state(), log window)`` (default:
        this rank's only)."""
        ranks = ranks if ranks is not None else [self._rank_state()]
        return {
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": {"spec": self.config.schedule, "lr": self.schedule(max(self.step - 1, 0))},
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "rng": [r[0] for r in ranks], "task_state": [r[1] for r in ranks], "log_window": [r[2] for r in ranks],
            "step": self.step, "epoch": self.epoch, "position": self.position,
            "best": dict(self.best), "stale_evals": self.stale_evals, "finished": self.finished,
            "elapsed_s": self.elapsed(),
            "config": self.config.to_dict(), "extra": self.extra,
        }

    def save(self, name: str = "last.pt", snapshot: bool = False) -> None:
        """Write ``run_dir/name``, and with ``snapshot`` and ``keep_last`` its weights as ``step_<k>.pt``
        (:mod:`.averaging`); a collective call (every rank contributes its RNG state)."""
        ranks = D.all_gather_object(self._rank_state())
        if self.is_main:
            state = self.state(ranks)
            if snapshot and self.config.keep_last:  # first: a kill between the two is redone from an older last.pt
                keep_snapshot(self.run_dir, state, self.config.keep_last)
            save_checkpoint(self.run_dir / name, state)
        D.barrier()
        self._saved_at = time.time()

    def _rank_state(self) -> tuple:
        sums, steps, tokens = self._window
        return get_rng_state(), self.task.train_state(), {"sums": {k: float(v) for k, v in sums.items()},
                                                          "steps": steps, "tokens": tokens}

    def _restore(self, ck: dict[str, Any]) -> None:
        load_model_state(self.raw_model, ck["model"], self.run_dir / "last.pt")
        load_optimizer_state(self.optimizer, ck["optimizer"])
        if ck.get("scaler") is not None and self.scaler.is_enabled():
            self.scaler.load_state_dict(ck["scaler"])
        rngs = ck["rng"]
        if len(rngs) != self.info.world_size:
            warnings.warn(f"checkpoint holds RNG states of {len(rngs)} ranks, running with "
                          f"{self.info.world_size}: resume is not bit-exact")
        set_rng_state(rngs[self.info.rank % len(rngs)])
        # checkpoints from before these, or of another number of ranks: the task's state and the window start afresh
        same = len(rngs) == self.info.world_size
        tasks, windows = ck.get("task_state") or [None], ck.get("log_window") or [None]
        self.task.load_train_state(tasks[self.info.rank] if same and len(tasks) == len(rngs) else None)
        window = windows[self.info.rank] if same and len(windows) == len(rngs) else None
        if window is not None:
            self._window = (dict(window["sums"]), window["steps"], window["tokens"])
        self.step, self.epoch, self.position = ck["step"], ck["epoch"], ck["position"]
        self.best, self.finished = dict(ck["best"]), bool(ck.get("finished", False))
        self.stale_evals = int(ck.get("stale_evals", 0))
        self.resumed_from = self.step
        self.resumed_elapsed = float(ck.get("elapsed_s", 0.0))  # checkpoints from before it: not known
        self.metrics.truncate(self.step)  # what a run killed after this checkpoint logged is done again

    def elapsed(self) -> float:
        """Seconds this run has trained: the resumed checkpoint's ``elapsed_s`` plus this process's time
        since :meth:`fit` began (what a killed process did after its last checkpoint is not counted: it
        is done again)."""
        return self.resumed_elapsed + (time.time() - self._t0 if self._t0 is not None else 0.0)

    # -- logging ----------------------------------------------------------------------------------
    def log(self, record: dict[str, Any]) -> None:
        """Append one record, stamped with the step, epoch and ``wall_s``, to the run's log (rank 0 only)."""
        self.metrics.write({"step": self.step, "epoch": self.epoch, **record, "wall_s": round(self.elapsed(), 3)})

    # -- evaluation -------------------------------------------------------------------------------
    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def evaluate(self, split: str, model: nn.Module | None = None) -> dict[str, float]:
        """``task.evaluate`` in eval mode without gradients, leaving every RNG as it found it."""
        model = model if model is not None else self.raw_model
        rng = get_rng_state()
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), self._autocast():
                out = self.task.evaluate(model, split)
        finally:
            model.train(was_training)
            set_rng_state(rng)
        return {k: float(v) for k, v in out.items()}

    def _validate(self, final: bool = False) -> None:
        """Rank 0 evaluates "valid", logs it and keeps best.pt; the others wait."""
        self._last_eval_step = self.step
        if self.is_main:
            m = self.evaluate("valid")
            self._last_eval = (self.step, m)
            self.log({"split": "valid", **m, **({"final": True} if final else {})})
            key = self.task.metric_for_selection
            if key not in m:
                raise KeyError(f"task.evaluate(model, 'valid') returned {sorted(m)}, "
                               f"which lacks metric_for_selection {key!r}")
            v, old = m[key], self.best["value"]
            better = old is None or (v > old if self.task.higher_is_better else v < old)
            self.stale_evals = 0 if better else self.stale_evals + 1
            if better:
                self.best = {"metric": key, "value": v, "step": self.step}
                save_checkpoint(self.run_dir / "best.pt", self.state())  # rank 0's RNG only
        # every rank must stop at the same step: rank 0's count is the one that decides
        self.stale_evals = int(D.all_gather_object(self.stale_evals)[0])
        D.barrier()

    # -- training ---------------------------------------------------------------------------------
    def _done(self) -> bool:
        c = self.config
        return (c.max_steps is not None and self.step >= c.max_steps) or (
            c.max_epochs is not None and self.epoch >= c.max_epochs) or self.stopped_early

    @property
    def stopped_early(self) -> bool:
        """True once ``patience`` evaluations in a row have not improved the validation metric."""
        return self.config.patience is not None and self.stale_evals >= self.config.patience

    def _update(self, group: list[Any]) -> dict[str, float | torch.Tensor]:
        """One optimiser step over the micro-batches of ``group``; returns the rank-local logs (floats, or scalar
        tensors on the device, which the host does not wait for until a record is written)."""
        model, n = self.model, len(group)
        lr = self.schedule(self.step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        reg_fn = getattr(self.raw_model, "regularization", None)
        sums: dict[str, float] = {}
        loss_sum = torch.zeros((), device=self.device)
        tokens = 0
        for i, batch in enumerate(group):
            sync = i == n - 1 or not isinstance(model, nn.parallel.DistributedDataParallel)
            with (contextlib.nullcontext() if sync else model.no_sync()):
                with self._autocast():
                    loss, logs = self.task.loss(model, batch)
                    total = loss
                    if callable(reg_fn):
                        reg = reg_fn()
                        total = loss + self.config.regularization_weight * reg
                        logs = {**logs, "regularization": reg.detach()}
                self.scaler.scale(total / n).backward()
            loss_sum += loss.detach().float()
            for k, v in logs.items():  # tensors stay on the device: read when a record is written
                sums[k] = sums.get(k, 0.0) + (v.detach().float() if isinstance(v, torch.Tensor) else float(v)) / n
            t = self.task.batch_tokens(batch)
            tokens += int(t) if t is not None else 0
        out = {"loss": loss_sum / n, **sums}
        if self.config.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            out["grad_norm"] = nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.config.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.position += n
        out["lr"] = lr
        self._tokens = tokens
        return out

    def _planned_steps(self) -> int | None:
        """max_steps, or fewer when max_epochs ends training first (needs ``task.num_batches``, taken
        from epoch 0); None when unknown.  The cosine schedule anneals over this many steps."""
        c = self.config
        total = c.max_steps
        nb = self.task.num_batches(0, self.info.rank, self.info.world_size)
        if nb is not None and self.info.world_size > 1:  # ranks that end an epoch at different steps drift apart
            counts = D.all_gather_object(nb)
            if len(set(counts)) > 1:
                raise ConfigError(f"the ranks get {counts} training batches per epoch: a task must give every rank "
                                  f"as many (drop the last len % world_size), or the ranks leave an epoch at "
                                  f"different steps and a resumed run reads other data")
        if c.max_epochs is not None and nb is not None:
            by_epochs = c.max_epochs * math.ceil(nb / c.accum_steps)
            total = min(total, by_epochs) if total is not None else by_epochs
        return total

    def fit(self) -> dict[str, Any]:
        """Train until max_steps / max_epochs / early stopping (or ``stop_after``); returns a summary dict with
        ``step``, ``epoch``, ``best``, ``final`` ({split: metrics}), ``best_test``, ``interrupted`` and
        ``stopped_early``."""
        c = self.config
        self._t0 = self._saved_at = time.time()
        summary: dict[str, Any] = {"final": {}, "best_test": None, "interrupted": False}
        if self.finished and self._done():  # run again when it has finished: its end-of-run records
            if self.is_main:
                print(f"{self.run_dir} finished at step {self.step}; its end-of-run evaluations, from "
                      f"{METRICS_FILE}:", file=sys.stderr, flush=True)
            ended = end_of_run(read_metrics(self.run_dir))
            final = {split: metrics_of(r) for split, r in ended["final"].items()}
            return self._summary({**summary, "final": final, "best_test": metrics_of(ended["best_test"])})
        if self.finished:  # a finished run given more updates (a larger max_steps) trains on from its end
            self.finished = False
            self.metrics.truncate(self.step, finals=False)
        stop_after = c.stop_after if c.stop_after is not None else (
            int(os.environ["KA_STOP_AFTER"]) if os.environ.get("KA_STOP_AFTER") else None)
        if self.resumed_from and self.is_main:
            print(f"resuming {self.run_dir} at step {self.step} from last.pt", file=sys.stderr, flush=True)
        self.metrics.open()
        bar, lines = progress_display(self.config.progress, self.planned_steps, self.step, self.is_main,
                                      getattr(self.task, "throughput_unit", "tokens"))
        t_last = time.time()
        interrupt = StopRequest(announce=self.is_main)
        interrupt.install()
        try:
            while not self._done():
                it = iter(self.task.train_batches(self.epoch, self.info.rank, self.info.world_size))
                for _ in itertools.islice(it, self.position):  # skip what a resumed run already consumed
                    pass
                fresh = self.position == 0
                while not self._done():
                    group = list(itertools.islice(it, c.accum_steps))
                    if not group:
                        if fresh:  # an epoch with no batch would be followed by another, forever
                            raise ConfigError(f"the training split gave no batch in epoch {self.epoch} (rank "
                                              f"{self.info.rank} of {self.info.world_size}): nothing to train on")
                        break
                    fresh = False
                    logs = self._update(group)
                    acc, steps_since, tokens_since = self._window
                    for k, v in logs.items():
                        acc[k] = acc.get(k, 0.0) + v
                    self._window = acc, steps_since + 1, tokens_since + self._tokens
                    bar.update(1)
                    since_save, stop = None, False  # seconds since last.pt (the ranks' mean); Ctrl-C on a rank
                    if self.step % c.log_every == 0 or self._done():
                        since_save, stop = self._log_window(t_last, interrupt, bar, lines)
                        t_last = time.time()
                    if c.eval_every and self.step % c.eval_every == 0:
                        self._validate()
                    periodic = bool(c.checkpoint_every) and self.step % c.checkpoint_every == 0
                    due = periodic or (bool(c.checkpoint_minutes) and since_save is not None
                                       and since_save >= 60 * c.checkpoint_minutes)
                    if due and not self._done():
                        self.save(snapshot=periodic)
                    if stop and not self._done():
                        if not due:
                            self.save()
                        interrupt.answered = True
                        raise Stopped(f"stopped after step {self.step}, last.pt written there", interrupt.signum)
                    if stop_after is not None and self.step >= stop_after:
                        summary["interrupted"] = True
                        return self._summary(summary)
                else:  # the inner loop ended because training is done, not because the epoch ran out
                    break
                self.epoch, self.position = self.epoch + 1, 0
                if self._done() and self._window[1]:  # the last epoch's steps since the last logged one
                    self._log_window(t_last, interrupt, bar, lines)
            summary.update(self._finish())
        finally:
            interrupt.uninstall()
            bar.close()
            self.metrics.close()
        return self._summary(summary)

    def _summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        return {**summary, "step": self.step, "epoch": self.epoch, "best": self.best,
                "stopped_early": self.stopped_early}

    def _log_window(self, t_last: float, interrupt: StopRequest, bar, lines) -> tuple[float, bool]:
        """Log the updates since the last train record (``self._window``: summed logs, updates, tokens; ``t_last``
        the time of that record) as one, averaged over the ranks, show it on the bar or the progress lines, and
        start a new window.  Returns the ranks' mean seconds since last.pt and whether a rank was asked to stop."""
        acc, steps_since, tokens_since = self._window
        vals = D.all_reduce_mean({**{k: float(v) / steps_since for k, v in acc.items()},
                                  SINCE_SAVE: time.time() - self._saved_at,
                                  STOP: float(interrupt.requested)}, self.device)
        since_save, stop = vals.pop(SINCE_SAVE), vals.pop(STOP) > 0
        dt = max(time.time() - t_last, 1e-9)
        rate = {"steps_per_s": round(steps_since / dt, 3)}
        if tokens_since:
            rate["tokens_per_s"] = round(tokens_since * self.info.world_size / dt, 1)
        planned = {"planned_steps": self.planned_steps} if self.planned_steps else {}
        self.log({"split": "train", **vals, **({"tokens": tokens_since} if tokens_since else {}), **rate, **planned})
        post = {"loss": f"{vals['loss']:.4g}", "lr": f"{vals['lr']:.3g}"}
        post.update({k.replace("_per_s", "/s"): v for k, v in rate.items()})
        bar.set_postfix(post, refresh=False)
        if lines is not None:
            lines.update(self.step, vals["loss"], vals["lr"], rate.get("tokens_per_s"), rate["steps_per_s"],
                         final=self._done())
        self._window = {}, 0, 0
        return since_save, stop

    def _finish(self) -> dict[str, Any]:
        """Final "valid"/"test" evaluation, last.pt, and the best checkpoint's test score."""
        out: dict[str, Any] = {"final": {}, "best_test": None}
        if self._last_eval_step != self.step:  # same on every rank, so the barrier inside matches
            self._validate(final=True)
        if self.is_main:
            out["final"]["valid"] = self._last_eval[1]
            test = self.evaluate("test")
            out["final"]["test"] = test
            self.log({"split": "test", **test, "final": True})
        self.finished = True
        self.save("last.pt", snapshot=True)
        if self.is_main and self.config.test_best and (self.run_dir / "best.pt").is_file():
            if self.best["step"] == self.step:  # best.pt holds the weights just tested: the test set is read once
                test = out["final"]["test"]
            else:
                model = self.task.build_model().to(self.device)
                load_model_state(model, load_checkpoint(self.run_dir / "best.pt", self.device)["model"],
                                 self.run_dir / "best.pt")
                test = self.evaluate("test", model)
            out["best_test"] = test
            self.log({"split": "test", **test, "checkpoint": "best", "best_step": self.best["step"]})
        D.barrier()
        return out
