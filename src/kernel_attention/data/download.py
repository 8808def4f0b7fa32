"""Fetching a dataset's files from their usual public URL into a data root, with checksum verification.

Never called implicitly: only ``kernel-attention data check --download`` or a loader built with
``download=True`` reach this code.  Files go to ``<root>/<path>`` exactly where the loaders look.  A file
published uncompressed whose staged copy is gzipped (``data.txt`` vs ``data.txt.gz``) is stored
uncompressed and verified against the sha256 of the decompressed content; the loaders accept both forms.
Files published inside a zip archive (WikiText-103) are extracted from one cached copy of the archive.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Mapping

__all__ = ["DownloadError", "fetch_url", "download_file"]

TIMEOUT_S = 60


class DownloadError(RuntimeError):
    """A file that could not be fetched or whose checksum does not match."""


def fetch_url(url: str, timeout: float = TIMEOUT_S) -> bytes:
    """GET ``url``; any network failure becomes a :class:`DownloadError` saying that we are offline or
    the address is unreachable.  (Tests replace this function; it is never called by them.)"""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (fixed https URLs from the registry)
            return r.read()
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise DownloadError(f"could not fetch {url} ({e}); this machine looks offline") from None


def download_file(
    root: Path,
    path: str,
    url: str,
    checksums: Mapping[str, str],
    member: str | None = None,
    fetch: Callable[[str], bytes] | None = None,
) -> Path:
    """Fetch ``url`` (or ``member`` of the zip at ``url``) to ``root/path`` and verify it against
    ``checksums[relative path as stored]`` (not verified when no checksum is known).  Returns the path."""
    fetch = fetch or fetch_url
    target = Path(root) / path
    if member is not None:
        archive = Path(root) / "_archives" / url.rsplit("/", 1)[-1]
        if not archive.is_file():
            archive.parent.mkdir(parents=True, exist_ok=True)
            archive.write_bytes(fetch(url))
        try:
            with zipfile.ZipFile(archive) as z:
                data = z.read(member)
        except (zipfile.BadZipFile, KeyError) as e:
            raise DownloadError(f"{archive}: cannot extract {member} ({e})") from None
    else:
        data = fetch(url)
    if path.endswith(".gz") and data[:2] != b"\x1f\x8b":
        target = target.with_suffix("")  # published uncompressed: keep it so, checksum of the content
        path = path[:-3]
    sha256 = checksums.get(path)
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise DownloadError(f"checksum mismatch for {url}: got sha256 {digest}, expected {sha256}; file not written")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target
