"""`medclr export`: load a checkpoint, write one format into a staging folder beside OUT, and put it in place.

OUT is written whole or not at all: the files go to a hidden folder next to it, are flushed to disk, and the folder
is renamed to OUT (a previous export there is moved aside first and removed after). An OUT that holds anything
but an earlier `medclr export` is refused, so a wrong path never deletes a user's files.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from medclr.errors import MedclrError
from medclr.files import fsync_dir, refuse_foreign

FORMATS = ("hf", "onnx", "torchscript")
_MARKERS = ("config.json", "export.json")  # the JSON each format writes at its top, with "format": FORMAT


def export(checkpoint: str | os.PathLike, fmt: str, out: str | os.PathLike, *, report: str | os.PathLike | None = None,
           check_batch: int = 3) -> Path:
    """Export the `medclr train` checkpoint ``checkpoint`` as ``fmt`` (hf, onnx, torchscript) into ``out``;
    ``report``: a `medclr eval` folder (or its metrics.json) of this checkpoint for the hf model card."""
    if fmt not in FORMATS:
        raise MedclrError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if report is not None and fmt != "hf":
        raise MedclrError(f"--report: only --format hf writes a model card (got --format {fmt})")
    target = Path(out).expanduser()
    _check_target(target)
    if fmt == "onnx":
        from medclr.export.to_onnx import require_onnx

        require_onnx()
    from medclr.inference import load_checkpoint

    inference = load_checkpoint(checkpoint)
    metrics = None
    if report is not None:
        from medclr.export.card import read_report

        metrics = read_report(report, inference)
    with _staging(target) as folder:
        if fmt == "hf":
            from medclr.export.to_hf import write as write_hf

            write_hf(inference, folder, metrics)
        elif fmt == "onnx":
            from medclr.export.to_onnx import write as write_onnx

            write_onnx(inference, folder, check_batch)
        else:
            from medclr.export.to_torchscript import write as write_torchscript

            write_torchscript(inference, folder, check_batch)
    return target


def _check_target(target: Path) -> None:
    if target.exists() and not target.is_dir():
        raise MedclrError(f"--out {target}: is a file; expected a folder to write the export into")
    refuse_foreign(target, is_export, "an earlier `medclr export`")


def is_export(folder: Path) -> bool:
    """Whether ``folder`` holds a `medclr export` (its config.json or export.json says so)."""
    from medclr.export.describe import FORMAT

    for name in _MARKERS:
        try:
            if json.loads((folder / name).read_text(encoding="utf-8")).get("format") == FORMAT:
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


@contextmanager
def _staging(target: Path) -> Iterator[Path]:
    """``with _staging(target) as folder``: write into ``folder``; on a clean exit it becomes ``target``."""
    folder = target.parent / f".{target.name}.export-{os.getpid()}-{secrets.token_hex(4)}"
    folder.mkdir(parents=True)
    try:
        yield folder
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    old = target.parent / f"{folder.name}.old"
    if target.exists():
        os.replace(target, old)
    os.replace(folder, target)
    fsync_dir(target.parent)
    shutil.rmtree(old, ignore_errors=True)
