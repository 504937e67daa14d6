"""Hugging Face checkpoints, offline first: where a model name or path lives, and quiet loading.

One resolution for the text encoder (``medclr.models``) and the PLL language model (``medclr.lm``), so
neither imports the other. A local directory is used as is; a hub id is looked up in the local Hugging
Face cache only unless the caller allows the network. Nothing here runs code from a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from medclr.errors import MedclrError

__all__ = ["WHAT_TO_PASS", "looks_like_path", "one_line", "quiet_transformers", "resolve_model_dir"]

WHAT_TO_PASS = ("pass a local model directory (e.g. the output of `medclr lm fit`), or allow the download: "
                "model.allow_network=true for `medclr train`, --allow-network for `medclr lm`, allow_network=True in Python")

# "name" or "org/name", as the hub spells ids; anything else is a path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load report and progress bar while we load an MLM into an encoder
    (the dropped ``cls.*`` head is expected); restore the user's settings afterwards."""
    from transformers.utils import logging as hf_logging

    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else exc.__class__.__name__)[:300]


def looks_like_path(name: str) -> bool:
    """True when ``name`` exists on disk or cannot be a hub id ("name" or "org/name")."""
    return os.path.exists(name) or not _HUB_ID.match(name)


def resolve_model_dir(
    name_or_path: str | os.PathLike,
    *,
    allow_network: bool = False,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    trust_remote_code: bool = False,
    what: str = "text model",
) -> Path:
    """A local directory holding the model: the path itself, or the hub cache snapshot of a hub id.

    With ``allow_network=False`` (default) the hub is never contacted: a hub id missing from the cache
    raises MedclrError saying what to pass instead. ``what`` names the model in the messages.
    """
    name = os.fspath(name_or_path)
    if not name.strip():
        raise MedclrError(f"{what}: no model given; {WHAT_TO_PASS}")
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise MedclrError(f"{what} {name!r}: directory has no config.json (expected a Hugging Face model dir)")
        return path
    if path.exists():
        raise MedclrError(f"{what} {name!r}: is a file, not a model directory; {WHAT_TO_PASS}")
    if looks_like_path(name):
        raise MedclrError(f"{what} {name!r}: not found (no such directory); {WHAT_TO_PASS}")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    patterns = ["*.json", "*.txt", "*.model"] + (["*.py"] if trust_remote_code else [])
    try:
        snap = Path(
            snapshot_download(
                name,
                revision=revision,
                cache_dir=cache_dir,
                local_files_only=not allow_network,
                allow_patterns=patterns + ["*.safetensors"],
            )
        )
        if allow_network and not any(snap.glob("*.safetensors")):
            # Older repos (CXR-BERT) ship only pytorch_model.bin; fetch it only when needed.
            snap = Path(snapshot_download(name, revision=revision, cache_dir=cache_dir, allow_patterns=patterns + ["*.bin"]))
    except HFValidationError as exc:
        raise MedclrError(f"{what} {name!r}: not a directory nor a valid hub id; {WHAT_TO_PASS}") from exc
    except LocalEntryNotFoundError as exc:
        if allow_network:
            raise MedclrError(f"{what} {name!r}: could not be fetched (offline? HF_HUB_OFFLINE set?); "
                              "pass a local model directory") from exc
        raise MedclrError(
            f"{what} {name!r}: not a local directory and not in the Hugging Face cache (nothing is downloaded "
            f"unless allowed); {WHAT_TO_PASS}"
        ) from exc
    except OSError as exc:  # repository not found, gated, HTTP errors
        raise MedclrError(f"{what} {name!r}: cannot be fetched from the hub ({exc.__class__.__name__}); "
                          "pass a local model directory") from exc
    if not (snap / "config.json").is_file():
        raise MedclrError(f"{what} {name!r}: cached snapshot {snap} has no config.json; {WHAT_TO_PASS}")
    return snap
