"""A cell folder's lock: several processes may run one study into the same output folder at once (one per
core, say), and each trains a cell only while it holds that cell's lock, skipping the cells another holds.

The lock is an exclusive ``flock`` on ``cells/<cell>/running.lock``.  The operating system drops it when its
process ends, so a killed run leaves nothing to clean up.  The empty lock file itself stays: removing it while
another process has it open would let a third create a new file and lock that, and two processes would train
the cell.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["cell_lock", "running_elsewhere"]


def running_elsewhere(d: Path) -> bool:
    """Whether another process holds the lock of cell folder ``d`` (without creating the folder)."""
    if not d.is_dir():
        return False
    with cell_lock(d) as held:
        return not held


@contextlib.contextmanager
def cell_lock(d: Path):
    """Yields True while this process holds the cell folder ``d``'s lock (module docstring), False when
    another process holds it.  Without ``fcntl`` (not POSIX) there is no lock and it yields True."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield True
        return
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / "running.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock
