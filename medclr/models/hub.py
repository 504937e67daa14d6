"""Offline resolution and reading of Hugging Face checkpoints for the text encoder.

A local directory is used as is; a hub id is looked up in the local Hugging Face cache only unless
the caller allows the network. Nothing here runs code from a checkpoint, and pickled ``.bin`` files
are read with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from medclr.errors import MedclrError

log = logging.getLogger(__name__)

WHAT_TO_PASS = "pass a local model directory (e.g. the output of `medclr lm fit`), or allow_network=True"


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


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1 or os.path.exists(name)


def resolve_model_dir(
    name_or_path: str | os.PathLike,
    *,
    allow_network: bool = False,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    trust_remote_code: bool = False,
) -> Path:
    """A local directory holding the model: the path itself, or the hub cache snapshot of a hub id.

    With ``allow_network=False`` (default) the hub is never contacted: a hub id missing from the cache
    raises MedclrError saying what to pass instead.
    """
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise MedclrError(f"text model {name!r}: directory has no config.json (expected a Hugging Face model dir)")
        return path
    if _looks_like_path(name):
        raise MedclrError(f"text model {name!r}: no such directory; {WHAT_TO_PASS}")
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
        raise MedclrError(f"text model {name!r}: not a directory nor a valid hub id; {WHAT_TO_PASS}") from exc
    except LocalEntryNotFoundError as exc:
        if allow_network:
            raise MedclrError(f"text model {name!r}: could not be fetched (offline? HF_HUB_OFFLINE set?); "
                              "pass a local model directory") from exc
        raise MedclrError(
            f"text model {name!r}: not a local directory and not in the Hugging Face cache (no download "
            f"without allow_network=True); {WHAT_TO_PASS}"
        ) from exc
    except OSError as exc:  # repository not found, gated, HTTP errors
        raise MedclrError(f"text model {name!r}: cannot be fetched from the hub ({exc.__class__.__name__}); "
                          "pass a local model directory") from exc
    if not (snap / "config.json").is_file():
        raise MedclrError(f"text model {name!r}: cached snapshot {snap} has no config.json; {WHAT_TO_PASS}")
    return snap


def read_prefixed_tensors(model_dir: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Tensors whose key starts with ``prefix`` (prefix stripped) from a checkpoint's weight files,
    without building the model. Pickled .bin files are read with ``weights_only=True``."""
    from safetensors import safe_open

    def from_safetensors(files: Sequence[Path]) -> dict[str, torch.Tensor]:
        out = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    if k.startswith(prefix):
                        out[k[len(prefix):]] = fh.get_tensor(k)
        return out

    def from_bin(files: Sequence[Path]) -> dict[str, torch.Tensor]:
        out = {}
        for f in files:
            state = torch.load(f, map_location="cpu", weights_only=True)
            out.update({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        return out

    def shards(index: Path) -> list[Path]:
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / f for f in sorted({f for k, f in weight_map.items() if k.startswith(prefix)})]

    if (model_dir / "model.safetensors").is_file():
        return from_safetensors([model_dir / "model.safetensors"])
    if (model_dir / "model.safetensors.index.json").is_file():
        return from_safetensors(shards(model_dir / "model.safetensors.index.json"))
    if (model_dir / "pytorch_model.bin").is_file():
        return from_bin([model_dir / "pytorch_model.bin"])
    if (model_dir / "pytorch_model.bin.index.json").is_file():
        return from_bin(shards(model_dir / "pytorch_model.bin.index.json"))
    return {}


def drop_pooler(model: nn.Module) -> nn.Module:
    # BERT-style models build a pooler ([CLS] -> dense -> tanh) that we never use; an unused
    # parameter breaks DDP (find_unused_parameters) and bloats checkpoints, so remove it.
    if getattr(model, "pooler", None) is not None:
        model.pooler = None
    return model


def load_tokenizer(model_dir: Path, trust_remote_code: bool, bert_fallback: bool = False):
    from transformers import AutoTokenizer, BertTokenizerFast

    try:
        with quiet_transformers():  # it warns that e.g. a "cxr-bert" config is not a tokenizer config
            return AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # CXR-BERT's tokenizer_config names a remote CXRBertTokenizer, which is a plain BertTokenizer:
        # build that from vocab.txt instead of running remote code.
        vocab = model_dir / "vocab.txt"
        if not (bert_fallback and vocab.is_file()):
            raise MedclrError(f"text model {str(model_dir)!r}: tokenizer cannot be loaded ({one_line(exc)})") from exc
        log.info("text tokenizer: AutoTokenizer refused %s (%s); loading vocab.txt as a BERT tokenizer",
                 model_dir, one_line(exc))
        try:
            with quiet_transformers():
                # the concrete class ignores tokenizer_config's auto_map, so nothing remote runs
                return BertTokenizerFast.from_pretrained(model_dir, local_files_only=True)
        except (OSError, ValueError) as exc2:
            raise MedclrError(f"text model {str(model_dir)!r}: tokenizer cannot be loaded ({one_line(exc2)})") from exc2
