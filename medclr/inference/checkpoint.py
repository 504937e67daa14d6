"""The checkpoint directory contract: what a `medclr train` output dir holds besides its metadata.

The model is ``config.json`` + ``model.safetensors`` + ``tokenizer/`` (:class:`~medclr.models.dual.DualEncoder`);
what training records beside it for readers (preprocessing, tau, the eta table, ...) is
``checkpoint_meta.json``, read with :func:`~medclr.inference.metadata.read_metadata`; the per-sample
tables are in ``loss_state.safetensors``. :func:`medclr.inference.load.load_checkpoint` puts them
together into an :class:`~medclr.inference.engine.Inference`; the checks made of the files as they load are here
(finite weights, a tokenizer), so that the engine can load the text tower later (this module imports no engine: the engine
imports it).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from medclr.errors import MedclrError
from medclr.files import file_sha256
from medclr.models.dual import WEIGHTS_NAME

# loss_state.safetensors: per-sample tables (u, zeta) are indexed by the row's position in the training
# split; this tensor beside them maps each position to the manifest `index` (written by training).
SAMPLE_INDEX_KEY = "sample_manifest_index"
# Text tables keyed by sentence (NUCLR with loss.zeta_key: sentence) are indexed by the sentence's position in
# the sorted distinct training sentences; this tensor maps each position to its sentence_hash as an int64
# (the hash's first 15 hex digits, medclr.data.text.sentence_hash).
TEXT_HASH_KEY = "text_sentence_hash"


def hash_to_int(sentence_hash: str) -> int:
    return int(sentence_hash[:15], 16)
DEFAULT_TAU = 1.0 / 14.0  # the paper initialises the hypersphere radius at sqrt(14): tau = 1/gamma^2


def weights_sha256(directory: str | os.PathLike) -> str:
    """SHA-256 of the checkpoint's ``model.safetensors`` (identifies the model an index was built from)."""
    return file_sha256(Path(directory) / WEIGHTS_NAME)


def first_non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating tensor holding NaN or infinity, or None.

    A tensor whose sum is finite holds neither (NaN propagates through a sum, an infinity stays one or meets the
    opposite one in a NaN), and a sum is one pass without the byte mask ``isfinite`` writes: 5-20x faster on a
    ResNet-50 + BERT. Only a non-finite sum (overflow of finite values included) is looked at element-wise."""
    for name, t in tensors.items():
        if t.is_floating_point() and not torch.isfinite(t.sum()) and not torch.isfinite(t).all():
            return name
    return None


def attach_text(model, directory: Path) -> None:
    """Add the text tower of ``directory`` to a model loaded without it, with the loader's checks."""
    model.attach_text(directory)
    check_finite(model.text_encoder, directory)
    check_tokenizer(model, directory)


def check_finite(module, src: Path) -> None:
    bad = first_non_finite(module.state_dict())
    if bad is not None:
        raise MedclrError(f"{src / WEIGHTS_NAME}: weight {bad!r} holds NaN or infinity: the file is damaged; "
                          "restore it from a copy or retrain")


def check_tokenizer(model, src: Path) -> None:
    if model.tokenizer is None:
        raise MedclrError(f"checkpoint {str(src)!r}: no tokenizer/ directory; texts cannot be encoded")
