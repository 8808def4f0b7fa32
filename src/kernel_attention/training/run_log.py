"""A run's metrics log: ``metrics.jsonl`` in the run directory, and TensorBoard beside it when asked.

    log = RunLog(run_dir, main=rank == 0, tensorboard=False)
    log.write({"step": 10, "epoch": 0, "split": "train", "loss": 2.3, "wall_s": 4.1})
    log.truncate(step)          # on resume: forget what a killed run wrote after its checkpoint
    rows = read_metrics(run_dir)

One JSON object per line (the record layout is the :class:`~.loop.Trainer`'s).  A process killed while it
wrote can leave its last line cut short: :func:`read_metrics` skips such a line and :meth:`RunLog.truncate`
drops it, so that neither a reader nor a resumed run fails on it.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from kernel_attention.atomic_write import write_text

__all__ = ["RunLog", "read_metrics", "end_of_run", "metrics_of", "STAMPS", "METRICS_FILE"]

METRICS_FILE = "metrics.jsonl"


def _lines(path: Path) -> list[tuple[str, dict]]:
    """(line, record) for each line of ``path`` that holds a whole JSON record."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError:  # cut short by a killed run (or blank)
            pass
    return out


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` in order ([] when there is none); a line cut short by a
    killed run is skipped."""
    path = Path(run_dir) / METRICS_FILE
    return [r for _, r in _lines(path)] if path.is_file() else []


def end_of_run(rows: list[dict]) -> dict[str, Any]:
    """``final`` ({split: metrics}) and ``best_test`` of a finished run, as :func:`read_metrics` gives its
    records: the last valid evaluation, the final test one, and the best checkpoint's test one (the shape of
    the summary :meth:`Trainer.fit <kernel_attention.training.loop.Trainer.fit>` returns)."""
    valid = [r for r in rows if r.get("split") == "valid"]
    test = [r for r in rows if r.get("split") == "test" and r.get("final")]
    best = [r for r in rows if r.get("split") == "test" and r.get("checkpoint") == "best"]
    return {"final": {**({"valid": valid[-1]} if valid else {}), **({"test": test[-1]} if test else {})},
            "best_test": best[-1] if best else None}


#: the keys :meth:`Trainer.log <kernel_attention.training.loop.Trainer.log>` stamps on a record besides its metrics
STAMPS = ("step", "epoch", "split", "final", "checkpoint", "best_step", "wall_s")


def metrics_of(record: dict | None) -> dict | None:
    """A record's metrics, the stamps left out: what :meth:`Trainer.fit` reports of an evaluation."""
    return None if record is None else {k: v for k, v in record.items() if k not in STAMPS}


class RunLog:
    """Appends records to ``run_dir/metrics.jsonl`` and, with ``tensorboard=True`` once :meth:`open` is
    called, their numbers to TensorBoard (``run_dir/tb``, tag ``split/key``).  Only the ``main`` process
    (rank 0) writes; on the others every method does nothing."""

    def __init__(self, run_dir: str | Path, main: bool = True, tensorboard: bool = False):
        self.path = Path(run_dir) / METRICS_FILE
        self.main, self.tensorboard = main, tensorboard
        self._writer = None

    def truncate(self, step: int, finals: bool = True) -> None:
        """Keep the records of steps up to ``step`` (those of the checkpoint a run resumes from); drop the
        later ones, which a killed run wrote and the resumed run writes again, and any line cut short.
        ``finals=False`` also drops the end-of-run records (``final``, the best checkpoint's test) of a
        finished run that trains on."""
        if not (self.main and self.path.is_file()):
            return
        keep = [line for line, r in _lines(self.path) if r["step"] <= step
                and (finals or not (r.get("final") or r.get("checkpoint") == "best"))]
        write_text(self.path, "".join(line + "\n" for line in keep))

    def open(self) -> None:
        """Start the TensorBoard writer (when asked for and installed; otherwise metrics.jsonl alone)."""
        if not (self.tensorboard and self.main) or self._writer is not None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            warnings.warn("tensorboard=True but TensorBoard is not installed; logging to metrics.jsonl only")
            return
        self._writer = SummaryWriter(str(self.path.parent / "tb"))

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (which holds ``step``) as one line, and its numbers to TensorBoard if open."""
        if not self.main:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._writer is not None:
            split = record.get("split", "train")
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "epoch"):
                    self._writer.add_scalar(f"{split}/{k}", v, record["step"])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
