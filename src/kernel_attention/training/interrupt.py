"""Ctrl-C or a scheduler's SIGTERM during training: the first SIGINT or SIGTERM asks
:meth:`Trainer.fit <.loop.Trainer.fit>` to stop at its next logged step, after writing ``last.pt`` there, so that
the same command resumes with no update lost; a second one of the same signal stops at once (SIGINT: Python's
``KeyboardInterrupt``; SIGTERM: the process ends), losing the updates since the last checkpoint.  A batch
scheduler (SLURM, Kubernetes) sends SIGTERM and waits some seconds before SIGKILL, and ``torchrun`` passes the
one it gets to its workers; a logged step (``train.log_every``) comes within those seconds unless steps are slow.

A request that comes after the trainer's last check (during the final evaluation of a run, which then finishes)
is kept: :func:`stop_if_asked` raises it where a caller would start another run (a study's next cell), so that
the process stops there and not after the next run.

Under ``torchrun`` each rank's request rides along the reduction of the train record, so that all ranks stop
at the same step and write the checkpoint together.  A handler is set only from the main thread and only in
place of the signal's default one (Python's ``default_int_handler`` for SIGINT, ``SIG_DFL`` for SIGTERM): a
handler that a caller installed, or a signal the shell ignores, is left alone.
"""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["StopRequest", "Stopped", "has_default_handler", "stop_if_asked"]

#: each signal handled, with the handler that is its default in Python and how the messages name it
_DEFAULTS = {signal.SIGINT: (signal.default_int_handler, "Ctrl-C"), signal.SIGTERM: (signal.SIG_DFL, "SIGTERM")}


#: the signal of a request made while a run's handler was in place that the run did not stop on (None: none)
_unanswered: int | None = None


def has_default_handler(signum: int) -> bool:
    """Whether SIGINT or SIGTERM has Python's default handler, the only one replaced here: a handler that a caller
    installed, or a signal the shell ignores (nohup and background jobs ignore SIGINT), is left alone."""
    return signal.getsignal(signum) is _DEFAULTS[signum][0]


class Stopped(KeyboardInterrupt):
    """Raised by the trainer where it stopped on request; ``signum`` is the signal that asked (the CLI's exit
    status is 128 + signum, as the shell gives a process that signal ends)."""

    def __init__(self, message: str, signum: int | None = None) -> None:
        super().__init__(message)
        self.signum = int(signum or signal.SIGINT)  # a rank stopped by another's request: as by Ctrl-C


class StopRequest:
    """``requested`` turns True at the first SIGINT or SIGTERM between :meth:`install` and :meth:`uninstall`;
    ``signum`` is that signal."""

    def __init__(self, announce: bool = True) -> None:
        self.announce = announce  # under torchrun only the main rank says so: the signal reaches every rank
        self.requested = False
        self.answered = False  # the trainer stopped on the request
        self.signum: int | None = None
        self._installed: list[int] = []

    def _handler(self, signum, frame) -> None:
        self.requested, self.signum = True, self.signum or signum
        default, name = _DEFAULTS[signum]
        signal.signal(signum, default)  # the same signal again stops at once
        if self.announce:
            print(f"\n{'interrupt' if signum == signal.SIGINT else name}: training stops at its next logged step, "
                  f"once last.pt is written there ({name} again stops at once)", file=sys.stderr, flush=True)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in _DEFAULTS:
            if has_default_handler(signum):
                signal.signal(signum, self._handler)
                self._installed.append(signum)

    def uninstall(self) -> None:
        global _unanswered
        for signum in self._installed:
            signal.signal(signum, _DEFAULTS[signum][0])
        self._installed = []
        if self.requested and not self.answered:
            _unanswered = _unanswered or self.signum


def stop_if_asked(message: str) -> None:
    """Raise :class:`Stopped` with ``message`` when a SIGINT or SIGTERM came during a run that finished all the
    same (after its last logged step); the request is then spent.  For a caller about to start another run."""
    global _unanswered
    signum, _unanswered = _unanswered, None
    if signum is not None:
        raise Stopped(message, signum)
