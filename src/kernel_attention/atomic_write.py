"""Files that are whole or absent: write beside the file, then move onto it.

    with replacing(path) as tmp:        # torch.save(state, tmp), yaml dump, ...
        torch.save(state, tmp)
    write_text(path, text)              # the same for a string

The new content goes to ``<name>.<pid>.tmp`` in the same directory and :func:`os.replace` moves it onto
``path`` (atomic within one file system; the process id keeps two processes that write the same file, such as
the processes that share a study folder, off each other's temporary file).  So a process killed while it wrote
(a lease that ends, a Ctrl-C) leaves the old file or the new one, never half of one: a checkpoint that does not
load, or a study's ``result.json`` that marks a cell finished but does not parse, would stop the next invocation.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["replacing", "write_text", "remove_orphans"]


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """Yield the temporary path to write; on leaving without an exception move it onto ``path``.  An
    exception leaves ``path`` as it was (and removes the temporary file)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (module docstring); returns the path."""
    path = Path(path)
    with replacing(path) as tmp:
        tmp.write_text(text)
    return path


def remove_orphans(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files in ``folder`` left by processes killed while they wrote (``<name>.<pid>.tmp``
    of a process id no process here has any more); returns them.  One of a living process is its write in
    progress, and stays."""
    removed = []
    for tmp in Path(folder).glob("*.*.tmp"):
        pid = tmp.name[:-4].rsplit(".", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
