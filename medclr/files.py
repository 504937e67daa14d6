"""Files that a reader, or a crash, never sees half written: write beside, flush to disk, rename into place.

* :func:`atomic_path` yields a temporary path in the target's folder (hidden, unique per process and
  call, ending in the target's own suffix so writers that go by the extension, numpy's ``savez`` and
  PIL among them, still work). The caller writes it by any means (parquet, safetensors, numpy, text).
  On a clean exit the file is fsynced, renamed over the target (``os.replace``: atomic on POSIX and
  Windows), and the folder is fsynced so the rename itself survives a power loss. On an exception the
  temporary is removed and the target is untouched.
* :func:`write_text` is that for a string.

Folder swaps (a checkpoint step, the index's data folder) rename whole folders with the same
``os.replace`` after fsyncing every file in them; they keep their own code.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "fsync_dir", "write_text"]


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename in ``folder`` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """``with atomic_path(p) as tmp: write(tmp)``: ``p`` holds the complete new file, or its old content."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix}")
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically and durably."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
