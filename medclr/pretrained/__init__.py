"""Models shipped inside the package, opened by name, offline.

Each shipped model is a folder ``medclr/pretrained/<NAME>/`` (docs/models.md, "Shipped models"):

* the checkpoint files inference reads: ``config.json``, ``model.safetensors``, ``tokenizer/``,
  ``checkpoint_meta.json``, ``prompt_embeddings.safetensors``;
* ``model.json``: a short summary (recipe, steps, dtype, headline metrics and where they come from);
* ``provenance/``: how it was made (commands, commit, seeds, training log, eval report, validation record, card);
* ``SHA256SUMS``: the SHA-256 of every other file in the folder, in ``sha256sum`` format (``sha256sum -c`` reads it).

:func:`resolve` turns a name into its folder after checking every file against ``SHA256SUMS``; the checkpoint
loader (:func:`medclr.inference.load_checkpoint`) calls it, so ``medclr.load("NAME")`` and every command's
``--checkpoint NAME`` open a shipped model. Nothing is ever downloaded. :func:`available` lists them
(`medclr models`); :mod:`medclr.export.pack` writes a folder (`medclr models pack`).

The folder they are looked for in is this package's, or ``$MEDCLR_PRETRAINED_DIR`` when set (tests, a private
collection). This module imports nothing of medclr but its errors and atomic writes: the loader imports it, so
the packer, which loads checkpoints, lives in ``medclr.export`` (no two parts import each other).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from medclr.errors import MedclrError
from medclr.files import file_sha256, read_json_object, write_text

ROOT_ENV = "MEDCLR_PRETRAINED_DIR"
MODEL_JSON = "model.json"
SUMS_NAME = "SHA256SUMS"
PROVENANCE_DIR = "provenance"
FORMAT = "medclr.pretrained/1"
# the model `medclr demo` serves when none is named: trained by training/configs/preset_reference.yaml
REFERENCE = "phantom-resnet18"
# a name is a folder name that cannot be mistaken for a path or a hidden file
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_SUM_LINE = re.compile(r"([0-9a-f]{64}) [ *](.+)")

# folder -> the (file, size, mtime) stamp of its last successful check in this process: resolved twice in one run
# (a command's early check, then the loader) the files are hashed once
_VERIFIED: dict[Path, tuple] = {}


def root() -> Path:
    """The folder the shipped models are in: ``$MEDCLR_PRETRAINED_DIR`` when set, else this package's."""
    env = os.environ.get(ROOT_ENV)
    return Path(env).expanduser() if env else Path(__file__).resolve().parent


def names(where: str | os.PathLike | None = None) -> list[str]:
    """The shipped models' names, sorted: the folders of the root that hold a ``model.json``."""
    base = root() if where is None else Path(where)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if NAME_RE.fullmatch(p.name) and (p / MODEL_JSON).is_file())


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` as a POSIX path relative to it, sorted (links to files count as files)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        rel = Path(dirpath).relative_to(folder)
        found += [(rel / f).as_posix() for f in filenames]
    return sorted(found)


def folder_size(folder: str | os.PathLike) -> int:
    """Bytes of every file under ``folder``."""
    return sum((Path(folder) / f).stat().st_size for f in _files(Path(folder)))


def write_sums(folder: str | os.PathLike) -> Path:
    """Write ``SHA256SUMS`` for every file in ``folder`` but itself (``sha256sum`` format, sorted by path)."""
    folder = Path(folder)
    lines = [f"{file_sha256(folder / rel)}  {rel}\n" for rel in _files(folder) if rel != SUMS_NAME]
    return write_text(folder / SUMS_NAME, "".join(lines))


def read_sums(folder: str | os.PathLike) -> dict[str, str]:
    """``SHA256SUMS`` of ``folder`` as {relative path: sha256}; a missing or malformed file is one line."""
    path = Path(folder) / SUMS_NAME
    if not path.is_file():
        raise MedclrError(f"{path}: missing, so the shipped model cannot be verified; repack it with "
                          "`medclr models pack` or reinstall medclr")
    sums: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = _SUM_LINE.fullmatch(line)
        rel = match.group(2) if match else ""
        if not match or rel.startswith("/") or ".." in Path(rel).parts:
            raise MedclrError(f"{path}: line {number} is not `<sha256>  <file in the folder>`")
        sums[rel] = match.group(1)
    return sums


def verify(folder: str | os.PathLike) -> None:
    """Check every file of a shipped model's ``folder`` against its ``SHA256SUMS``: a changed, missing or added
    file is refused in one line that names it."""
    folder = Path(folder)
    present = [rel for rel in _files(folder) if rel != SUMS_NAME]
    stamp = tuple((rel, (s := (folder / rel).stat()).st_size, s.st_mtime_ns) for rel in [*present, SUMS_NAME]
                  if (folder / rel).is_file())
    key = folder.resolve()
    if _VERIFIED.get(key) == stamp:
        return
    sums = read_sums(folder)
    for rel in present:
        if rel not in sums:
            raise MedclrError(f"{folder / rel}: not in {SUMS_NAME}, so it was added after the model was packed; "
                              "remove it, or repack the model")
    for rel, expected in sums.items():
        path = folder / rel
        if not path.is_file():
            raise MedclrError(f"{path}: missing (listed in {SUMS_NAME}); reinstall medclr or repack the model")
        if file_sha256(path) != expected:
            raise MedclrError(f"{path}: its SHA-256 is not the one {SUMS_NAME} records, so the file was changed or "
                              "damaged after packing; reinstall medclr or repack the model")
    _VERIFIED[key] = stamp


def resolve(name_or_path: str | os.PathLike, where: str | os.PathLike | None = None) -> Path:
    """A checkpoint folder from a path or a shipped model's name.

    An existing path is returned as it is (a path wins over a name). Otherwise a shipped model's name gives its
    folder once every file matches ``SHA256SUMS`` (:func:`verify`); anything else is one line naming the shipped
    models. ``where``: the root to look in (default :func:`root`)."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    base = root() if where is None else Path(where)
    text = str(name_or_path)
    if NAME_RE.fullmatch(text) and (base / text / MODEL_JSON).is_file():
        verify(base / text)
        return base / text
    shipped = ", ".join(names(base)) or "none"
    raise MedclrError(f"no checkpoint folder or shipped model named {text!r} (no such directory); "
                      f"shipped: {shipped} (medclr models)")


def read_model_json(folder: str | os.PathLike) -> dict[str, Any]:
    return read_json_object(Path(folder) / MODEL_JSON)


SUMMARY_FIELDS = ("description", "recipe", "preset", "seed", "loss", "steps", "total_steps", "dtype", "headline",
                  "headline_source")


def available(where: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The shipped models, by name: name, path, size in bytes and the summary ``model.json`` gives (recipe, steps,
    dtype, headline metrics). Nothing is hashed here (:func:`resolve` checks a model when it is opened); a folder
    whose model.json cannot be read is listed with ``error``."""
    base = root() if where is None else Path(where)
    out = []
    for name in names(base):
        folder = base / name
        entry: dict[str, Any] = {"name": name, "path": str(folder), "size_bytes": folder_size(folder)}
        try:
            data = read_model_json(folder)
            entry.update({k: data.get(k) for k in SUMMARY_FIELDS})
        except MedclrError as exc:
            entry["error"] = str(exc)
        out.append(entry)
    return out


__all__ = ["MODEL_JSON", "REFERENCE", "ROOT_ENV", "SUMS_NAME", "available", "names", "read_sums", "resolve", "root", "verify",
           "write_sums"]
