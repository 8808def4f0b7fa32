"""Reading dataset files: where they live, how they are opened, and how a bad record is reported.

Every loader in this package reads through these helpers so that

* a missing file fails with :class:`MissingDataError`, naming the path it looked for and how to get it
  (``kernel-attention data check`` / ``--download``), never with a bare ``FileNotFoundError``;
* a malformed record fails with :class:`DataFormatError`, naming the file and the 1-based line;
* ``X`` and ``X.gz`` are interchangeable (the staged copies gzip some large files, upstream does not);
* text is split on ``b"\\n"`` only.  Several classic classification files are Latin-1/cp1252 and contain
  byte 0x85, which ``str.splitlines()`` would treat as a line break after decoding.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

ENV_VAR = "KERNEL_ATTENTION_DATA"

__all__ = [
    "DataFormatError",
    "MissingDataError",
    "default_root",
    "resolve",
    "read_bytes",
    "read_lines",
    "sha256_file",
    "SPLIT_NAMES",
    "find_split",
    "split_names",
]

#: The file stems a split of the user's own data may have (a validation split may be named val or dev).
SPLIT_NAMES = {"train": ("train",), "valid": ("valid", "val", "dev"), "test": ("test",)}


class DataFormatError(ValueError):
    """A record in a data file that does not have the expected form.  Message: ``path:line: what``."""

    def __init__(self, path: str | os.PathLike, line: int | None, message: str):
        self.path, self.line = str(path), line
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")


class MissingDataError(FileNotFoundError):
    """A dataset file that is not where it is expected."""


def default_root() -> Path:
    """The data root: ``$KERNEL_ATTENTION_DATA``, else ``../shared/data`` (relative to the current
    directory) if it exists, else ``~/.cache/kernel-attention``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    shared = Path.cwd().parent / "shared" / "data"
    if shared.is_dir():
        return shared
    return Path.home() / ".cache" / "kernel-attention"


def resolve(path: str | os.PathLike, dataset: str | None = None) -> Path:
    """Return ``path`` or ``path.gz`` (or ``path`` without ``.gz``), whichever exists.

    Raises :class:`MissingDataError` naming the expected path and how to obtain the file.
    """
    p = Path(path)
    candidates = [p, Path(str(p)[:-3])] if p.suffix == ".gz" else [p, Path(str(p) + ".gz")]
    for c in candidates:
        if c.is_file():
            return c
    hint = (
        f"; run `kernel-attention data check` to see what is expected, or place the file there "
        f"(`kernel-attention data check --download` fetches {dataset!r} into the cache when online)"
        if dataset
        else ""
    )
    raise MissingDataError(f"missing data file {p} (also looked for {candidates[1].name}){hint}")


def find_split(folder: Path, split: str, suffix: str) -> Path | None:
    """``folder/<stem><suffix>`` (or its ``.gz``) for the first of the split's :data:`SPLIT_NAMES` present, else
    None; ``suffix`` is the extension with its dot (``".txt"``, ``".en"``)."""
    for stem in SPLIT_NAMES[split]:
        for cand in (folder / f"{stem}{suffix}", folder / f"{stem}{suffix}.gz"):
            if cand.is_file():
                return cand
    return None


def split_names(split: str, suffix: str) -> str:
    """The file names :func:`find_split` accepts for a split, for a message: ``valid.txt, val.txt or dev.txt``."""
    names = [f"{stem}{suffix}" for stem in SPLIT_NAMES[split]]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def read_bytes(path: str | os.PathLike, dataset: str | None = None) -> bytes:
    """The bytes of a file, gunzipped if it is a ``.gz`` file."""
    p = resolve(path, dataset)
    data = p.read_bytes()
    if p.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise DataFormatError(p, None, f"not a valid gzip file ({e})") from None
    return data


def read_lines(
    path: str | os.PathLike,
    encoding: str = "utf-8",
    dataset: str | None = None,
    keep_trailing_empty: bool = False,
) -> tuple[Path, list[str]]:
    """Decode a text file and split it on ``\\n`` only (never on 0x85, U+2028, ... as
    ``str.splitlines`` does).  A final empty piece after a trailing newline is dropped; ``\\r`` of
    CRLF files is stripped.  Returns ``(resolved_path, lines)``; line ``i`` of the list is line
    ``i + 1`` of the file.  ``encoding="latin-1"`` never fails; a UTF-8 decoding error is reported
    with its line number."""
    p = resolve(path, dataset)
    return p, split_lines(read_bytes(p, dataset), p, encoding, keep_trailing_empty)


def split_lines(raw: bytes, where: str | os.PathLike, encoding: str = "utf-8",
                keep_trailing_empty: bool = False) -> list[str]:
    """The lines of ``raw`` as :func:`read_lines` gives a file's (``where`` names the source in errors); a UTF-8
    byte-order mark, which spreadsheets write, is dropped."""
    pieces = raw.split(b"\n")
    if pieces and pieces[-1] == b"" and not keep_trailing_empty:
        pieces.pop()
    lines = []
    for i, b in enumerate(pieces):
        if b.endswith(b"\r"):
            b = b[:-1]
        try:
            lines.append(b.decode("utf-8-sig" if i == 0 and encoding.lower() in ("utf-8", "utf8") else encoding))
        except UnicodeDecodeError as e:
            raise DataFormatError(
                where, i + 1, f"cannot decode as {encoding} ({e.reason} at byte {e.start}); save the file as "
                              f"UTF-8 (iconv -f latin1 -t utf-8), or read it with encoding=latin-1 where the dataset "
                              f"takes one (tsv, csv, graph)"
            ) from None
    return lines


def sha256_file(path: str | os.PathLike, decompress: bool = False) -> str:
    """Hex sha256 of a file's bytes (of its gunzipped content when ``decompress``)."""
    p = Path(path)
    if decompress:
        return hashlib.sha256(gzip.decompress(p.read_bytes())).hexdigest()
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
