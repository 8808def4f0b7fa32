"""Plain progress lines for a training run whose output is not a terminal.

A tqdm bar redraws one line with carriage returns: in a log file or a pipe that is unreadable, so the
loop shows it only on a terminal.  Elsewhere (a job's log, ``2> train.log``, a CI job) the loop prints a
line on logged steps (every ``train.log_every`` updates), at most one per ``interval`` seconds besides the
first and the last, to stderr instead, so that a long run still says how far it is, how fast it goes and
when it should end, without a line per update::

    step 40/250 (16%)  loss 1.234  lr 0.001  2,345 tokens/s  elapsed 0m12s  ETA 1m03s
"""

from __future__ import annotations

import sys
import time
from typing import IO

__all__ = ["ProgressLines", "format_duration", "progress_display"]

#: Seconds between two lines at least (the first and the last logged step always print).
INTERVAL = 10.0


def format_duration(s: float) -> str:
    """Seconds as ``1h05m`` (an hour or more) or ``4m07s``."""
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class ProgressLines:
    """Prints a line per :meth:`update` call to ``stream`` (stderr by default), at most one per ``interval``
    seconds but always for the first call and for the last step (``final``).

    ``planned`` is the run's planned number of updates (None: unknown, then no percentage or ETA);
    ``start_step`` the step this process began at (a resumed run's), so that the pace, and from it the
    ETA, counts only the updates made here."""

    def __init__(self, planned: int | None, start_step: int, unit: str = "tokens", stream: IO[str] | None = None,
                 interval: float = INTERVAL):
        self.planned, self.start_step, self.unit, self.interval = planned, start_step, unit, interval
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.time()
        self.printed_at: float | None = None

    def update(self, step: int, loss: float, lr: float, per_s: float | None, steps_per_s: float,
               final: bool = False) -> None:
        now = time.time()
        if not final and self.printed_at is not None and now - self.printed_at < self.interval:
            return
        self.printed_at = now
        parts = [f"step {step}/{self.planned} ({100 * step / self.planned:.0f}%)" if self.planned else f"step {step}",
                 f"loss {loss:.4g}", f"lr {lr:.3g}",
                 f"{per_s:,.0f} {self.unit}/s" if per_s else f"{steps_per_s:.3g} steps/s"]
        elapsed = time.time() - self.t0
        parts.append(f"elapsed {format_duration(elapsed)}")
        done = step - self.start_step
        if self.planned and done > 0:
            parts.append(f"ETA {format_duration(elapsed / done * max(self.planned - step, 0))}")
        print("  ".join(parts), file=self.stream, flush=True)


def progress_display(progress: bool | None, total: int | None, step: int, is_main: bool, unit: str):
    """``(bar, lines)`` for ``train.progress``: the tqdm bar (disabled unless ``progress`` is true, or None
    on a terminal), and the plain :class:`ProgressLines` that replace it when ``progress`` is None and stderr
    is not a terminal (None where they are off).  Only the main process (``is_main``) shows either."""
    from tqdm.auto import tqdm

    tty = sys.stderr.isatty()
    enabled = progress if progress is not None else tty
    bar = tqdm(total=total, initial=step, disable=not (enabled and is_main), unit="step", dynamic_ncols=True)
    lines = ProgressLines(total, step, unit) if progress is None and not tty and is_main else None
    return bar, lines
