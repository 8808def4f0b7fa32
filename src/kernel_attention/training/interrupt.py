"""Ctrl-C during training: the first SIGINT asks :meth:`Trainer.fit <.loop.Trainer.fit>` to stop at its next
logged step, after writing ``last.pt`` there, so that the same command resumes with no update lost; a second
SIGINT stops at once (Python's ``KeyboardInterrupt``), losing the updates since the last checkpoint.

Under ``torchrun`` each rank's request rides along the reduction of the train record, so that all ranks stop
at the same step and write the checkpoint together.  A handler is set only from the main thread and only in
place of Python's default one: a handler that a caller installed is left alone.
"""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["StopRequest"]


class StopRequest:
    """``requested`` turns True at the first SIGINT between :meth:`install` and :meth:`uninstall`."""

    def __init__(self) -> None:
        self.requested = False
        self._installed = False

    def _handler(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C raises KeyboardInterrupt
        print("\ninterrupt: training stops at its next logged step, once last.pt is written there "
              "(Ctrl-C again stops at once)", file=sys.stderr, flush=True)

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._handler)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self._installed = False
