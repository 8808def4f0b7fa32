"""The git revision of the code a study cell ran with, kept in its record (``revision``) and in runs.csv.

    code_revision()  ->  "b8dcbe0"          the checkout's HEAD, abbreviated
                         "b8dcbe0+dirty"    HEAD plus uncommitted changes under src/ (the code that ran is
                                            then HEAD's and more: the suffix says so)
                         ""                 not a git checkout (an installed package), or no git

One call of ``git`` each per process: the answer is cached, since a study process runs one code state, and
:func:`~kernel_attention.study.runner.run_study` asks before its first cell, so that a commit made while the
process trains does not name code it did not run.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

__all__ = ["code_revision"]

_ROOT = Path(__file__).resolve().parents[3]  # the repository root of a source checkout (src/kernel_attention/study)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_revision() -> str:
    """``git rev-parse --short HEAD`` of the checkout this package is imported from, with ``+dirty`` when
    ``git status --porcelain -- src`` lists a change (tracked or untracked); "" outside a checkout."""
    if not (_ROOT / ".git").exists():
        return ""
    head = _git("rev-parse", "--short", "HEAD")
    if not head:
        return ""
    changes = _git("status", "--porcelain", "--", "src")
    return head + ("+dirty" if changes else "")
