"""Files that a reader, or a crash, never sees half written: write beside, flush to disk, rename into place.

* :func:`atomic_path` yields a temporary path in the target's folder (hidden, unique per process and
  call, ending in the target's own suffix so writers that go by the extension, numpy's ``savez`` and
  PIL among them, still work). The caller writes it by any means (parquet, safetensors, numpy, text).
  On a clean exit the file is fsynced, renamed over the target (``os.replace``: atomic on POSIX and
  Windows), and the folder is fsynced so the rename itself survives a power loss. On an exception the
  temporary is removed and the target is untouched.
* :func:`write_text` is that for a string.
* :func:`check_free_space` is the preflight of a writer that may need a lot of space (checkpoints, an index,
  a score table): its rough estimate against the free space of the target's filesystem, refused in one line
  before any work starts when it clearly does not fit.
* :func:`refuse_foreign` is the one rule for a writer's target: what is already there is replaced only when it
  is that writer's own earlier output (or the user says ``--overwrite``), else refused in one line.
* :func:`stable_safetensors` makes a safetensors file's bytes a function of its tensors and metadata only.

Folder swaps (a checkpoint step, the index's data folder) rename whole folders with the same
``os.replace`` after fsyncing every file in them; they keep their own code.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from medclr.errors import MedclrError

__all__ = ["atomic_path", "check_free_space", "fsync_dir", "read_json_object", "refuse_foreign", "stable_safetensors",
           "write_text"]


def read_json_object(path: str | os.PathLike) -> dict:
    """The JSON object in ``path``; one MedclrError line naming the file when it is unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MedclrError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise MedclrError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in 4 MiB pieces (weights files are hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


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


def check_free_space(path: str | os.PathLike, needed: int, what: str) -> None:
    """Raise MedclrError (one line naming ``path``, ``what``, the estimate and the free space) when ``needed`` bytes
    exceed the free space of the filesystem that holds or will hold ``path``. Estimates are rough, so only a clear
    shortfall is refused; a write that fails all the same is still one line (``medclr.cli.refused_write``)."""
    folder = Path(path).expanduser().absolute()
    while not folder.exists() and folder != folder.parent:  # not created yet: the filesystem it will land on
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise MedclrError(f"{path}: about {_size(needed)} needed for {what}, but its filesystem has {_size(free)} "
                          "free; free some space or write elsewhere")


def refuse_foreign(path: str | os.PathLike, is_ours: Callable[[Path], bool], what: str,
                   overwrite: bool | None = None, flag: str = "--out") -> None:
    """Raise MedclrError (one line) when ``path`` holds something (a file, or a folder with anything in it) that
    ``is_ours`` does not recognise as ``what``, the writer's own earlier output (which it resumes or replaces).

    ``overwrite``: None for a writer without an ``--overwrite`` flag; True when the user passed it (anything there
    is then replaced). A missing path or an empty folder is always free."""
    target = Path(path)
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        return
    if overwrite or is_ours(target):
        return
    if target.is_dir():
        held = f"the folder holds other files (not {what})"
        fix = "choose a new or empty folder"
    else:
        held = f"the file there is not {what}"
        fix = "choose another path"
    if overwrite is not None:
        fix = f"pass --overwrite to replace it, or {fix}"
    raise MedclrError(f"{flag} {target}: {held}; {fix}")


def stable_safetensors(path: str | os.PathLike) -> None:
    """Rewrite the header of the safetensors file ``path`` in place so that its bytes depend on its tensors and
    metadata only.

    The safetensors library writes the ``__metadata__`` map in the order of a Rust HashMap, which is seeded anew
    in every process: two saves of the same tensors with two metadata keys differed in their header (and so in
    their SHA-256, which checkpoints record). The header is written back as compact JSON with the metadata keys
    sorted (the tensors keep their order and offsets), padded with spaces to its old length (the format allows
    trailing spaces), so the data is not moved."""
    with open(path, "r+b") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        if "__metadata__" in header:
            header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) <= n:
            fh.seek(8)
            fh.write(text + b" " * (n - len(text)))
            return
        # not expected (the library writes this compact JSON, in another order): a longer header moves the data
        data = fh.read()
        size = -(-len(text) // 8) * 8  # the data stays 8-byte aligned
        fh.seek(0)
        fh.write(struct.pack("<Q", size) + text + b" " * (size - len(text)) + data)
        fh.truncate()


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} bytes"
