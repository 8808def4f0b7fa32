"""The errors a command line answers with one message and exit status 2, instead of a traceback.

These are the errors of input the user gave or can fix: a config (:class:`~kernel_attention.config.ConfigError`,
:class:`~kernel_attention.registry.SpecError`), a data file (:class:`~kernel_attention.data.files.DataFormatError`,
:class:`~kernel_attention.data.files.MissingDataError`, a refused pickle), a checkpoint
(:class:`~kernel_attention.training.checkpoint.CheckpointError`, including a refused resume) and a full
disk.  Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import pickle
import sys

__all__ = ["EXIT_USER", "user_message", "report"]

#: exit status of a command stopped by an input it cannot use
EXIT_USER = 2


def user_message(e: BaseException) -> str | None:
    """One line for an expected error (its message, which names what was wrong and what is accepted), or
    None for an unexpected one."""
    from kernel_attention.training.checkpoint import CheckpointError

    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        where = f" writing {e.filename}" if e.filename else ""
        return f"{e.strerror or 'No space left on device'}{where}; free some space or choose another --run-dir"
    if isinstance(e, CheckpointError):
        return str(e)
    if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
        return None  # permissions, I/O errors: the traceback says more than a line would
    if isinstance(e, (ValueError, FileNotFoundError, KeyError, pickle.UnpicklingError)):
        text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        return " ".join(text.split()) if "\n" in text else text
    return None


def report(prefix: str, e: BaseException, hint: str = "") -> int:
    """Print ``kernel-attention: <prefix><message><hint>`` to stderr and return :data:`EXIT_USER`; an
    unexpected error is raised again."""
    msg = user_message(e)
    if msg is None:
        raise e
    print(f"kernel-attention: {prefix}{msg}{hint}", file=sys.stderr)
    return EXIT_USER
