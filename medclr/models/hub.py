"""Reading Hugging Face checkpoints for the text encoder: tensors and tokenizers, without running their code.

Where a checkpoint lives (a local directory or a cached hub id) is :func:`medclr.hub.resolve_model_dir`,
shared with ``medclr.lm``. Pickled ``.bin`` files are read with ``weights_only=True``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from medclr.errors import MedclrError
from medclr.hub import one_line, quiet_transformers

log = logging.getLogger(__name__)


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


# CXR-BERT's config (microsoft/BiomedVLP-CXR-BERT-*): model_type "cxr-bert", class CXRBertModel from the repository's
# own code. Its class is transformers' BertForMaskedLM plus a cls_projection_head, so a BertConfig of the same
# fields builds the body natively: no remote code (which breaks on transformers >= 4.40, hi-ml#956).
CXR_BERT_TYPES = {"cxr-bert"}
_NOT_BERT_FIELDS = {"model_type", "architectures", "auto_map", "transformers_version"}


def cxr_bert_config(model_dir: Path):
    """A transformers ``BertConfig`` for a CXR-BERT checkpoint folder, or None when ``model_dir`` holds another
    model (an unreadable config.json is None too: the caller's own loading then says why)."""
    from transformers import BertConfig

    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if raw.get("model_type") not in CXR_BERT_TYPES and "CXRBertModel" not in (raw.get("architectures") or []):
        return None
    return BertConfig(**{k: v for k, v in raw.items() if k not in _NOT_BERT_FIELDS})


def drop_pooler(model: nn.Module) -> nn.Module:
    # BERT-style models build a pooler ([CLS] -> dense -> tanh) that we never use; an unused
    # parameter breaks DDP (find_unused_parameters) and bloats checkpoints, so remove it.
    if getattr(model, "pooler", None) is not None:
        model.pooler = None
    return model


def remote_tokenizer_class(model_dir: Path) -> str | None:
    """The tokenizer class a folder's ``tokenizer_config.json`` names through ``auto_map`` when transformers does not
    hold it (code from the model's own repository, e.g. CXR-BERT's ``CXRBertTokenizer``), else None."""
    import transformers

    try:
        raw = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    auto = raw.get("auto_map") if isinstance(raw, dict) else None
    auto = auto.get("AutoTokenizer") if isinstance(auto, dict) else None
    if not auto:
        return None
    # an entry reads "module.Class" or, as saved from the hub, "org/repo--module.Class"
    name = raw.get("tokenizer_class") or str(auto[0] if isinstance(auto, list) else auto).rsplit(".", 1)[-1]
    return None if hasattr(transformers, str(name)) else str(name)


def load_tokenizer(model_dir: Path, trust_remote_code: bool, bert_fallback: bool = False):
    from transformers import AutoTokenizer, BertTokenizerFast

    model_dir = Path(model_dir)
    remote = None if trust_remote_code else remote_tokenizer_class(model_dir)
    if remote is not None:
        # Asked for it, AutoTokenizer refuses with the hub's words ("You can inspect the repository content at
        # https://hf.co/..."), which read wrong for a local folder: say what the folder holds instead.
        if not (bert_fallback and (model_dir / "vocab.txt").is_file()):
            raise MedclrError(f"text model {str(model_dir)!r}: its tokenizer_config.json names {remote}, code from the "
                              "model's own repository; pass trust_remote_code (--trust-remote-code) only if you trust it")
        log.info("text tokenizer: %s names %s, code of the model's repository that medclr does not run; its vocab.txt "
                 "is read as the BERT WordPiece tokenizer that class is", model_dir / "tokenizer_config.json", remote)
        return _bert_from_vocab(model_dir, BertTokenizerFast)
    try:
        with quiet_transformers():  # it warns that e.g. a "cxr-bert" config is not a tokenizer config
            return AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        vocab = model_dir / "vocab.txt"
        if not (bert_fallback and vocab.is_file()):
            raise MedclrError(f"text model {str(model_dir)!r}: tokenizer cannot be loaded ({one_line(exc)})") from exc
        log.info("text tokenizer: transformers could not read the tokenizer of %s (%s); reading its vocab.txt as a "
                 "BERT tokenizer", model_dir, one_line(exc))
        return _bert_from_vocab(model_dir, BertTokenizerFast)


def _bert_from_vocab(model_dir: Path, bert_tokenizer):
    try:
        with quiet_transformers():
            # the concrete class ignores tokenizer_config's auto_map, so nothing remote runs
            return bert_tokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise MedclrError(f"text model {str(model_dir)!r}: tokenizer cannot be loaded ({one_line(exc)})") from exc
