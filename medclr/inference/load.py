"""Loading a `medclr train` checkpoint directory into an :class:`~medclr.inference.engine.Inference`.

Apart from :mod:`~medclr.inference.checkpoint` and :mod:`~medclr.inference.metadata` (what the
directory holds and records) so that the arrows run one way: metadata <- checkpoint <- stats <- engine <- load.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from medclr.errors import MedclrError
from medclr.inference.checkpoint import (
    DEFAULT_TAU,
    WEIGHTS_NAME,
    check_finite,
    check_tokenizer,
    weights_sha256,
)
from medclr.inference.engine import Inference
from medclr.inference.metadata import METADATA_NAME, read_metadata
from medclr.inference.preprocess import Preprocess
from medclr.inference.stored_prompts import read_prompt_embeddings
from medclr.models.dual import DualEncoder
from medclr.prompts import checkpoint_prompts

log = logging.getLogger(__name__)

# Set to 1 to load weights whose SHA-256 differs from the one training recorded (weights edited on purpose).
TRUST_WEIGHTS_ENV = "MEDCLR_TRUST_WEIGHTS"


def load_checkpoint(directory: str | os.PathLike, device: str | torch.device = "cpu", image_size: int | None = None,
                    resize: int | None = None, tau: float | None = None,
                    verify_weights: bool | None = None, text: bool = True) -> Inference:
    """Load a `medclr train` checkpoint dir for inference. Arguments override what the dir records.

    ``text=False``: when the directory stores its prompts' embeddings (``medclr.prompts.checkpoint_prompts``) for
    these (verified) weights, the text tower is left unloaded until a text is encoded (`medclr score` with the
    checkpoint's prompts never does).

    The weights file is checked against the SHA-256 training recorded (``verify_weights``; None: unless the
    environment sets MEDCLR_TRUST_WEIGHTS=1), and every weight must be finite (always): a damaged file is
    refused in one line instead of scoring NaN."""
    from medclr.pretrained import resolve  # a folder as it is, or a model shipped in the package by name (verified)

    src = resolve(Path(directory))
    if not src.is_dir():
        raise MedclrError(f"checkpoint {str(src)!r}: no such directory (expected a `medclr train` output dir)")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise MedclrError(f"device {device!r}: CUDA is not available on this machine; use --device cpu")
    meta = read_metadata(src)
    verify = os.environ.get(TRUST_WEIGHTS_ENV) != "1" if verify_weights is None else verify_weights
    sha = None  # hashed here only to check it; otherwise the engine hashes on first use (an index or score run)
    if (verify and meta.weights_sha256 and (src / WEIGHTS_NAME).is_file()
            and (sha := weights_sha256(src)) != meta.weights_sha256):
        raise MedclrError(f"{src / WEIGHTS_NAME}: its SHA-256 is not the one training recorded in checkpoint_meta.json, "
                          f"so the file is damaged or was changed (weights edited on purpose: set {TRUST_WEIGHTS_ENV}=1)")
    if verify and meta.lacks_weights_sha256:
        raise MedclrError(f"{src / METADATA_NAME}: format_version {meta.read_version} records the SHA-256 of the weights "
                          "at every save, but this one has no weights_sha256, so model.safetensors cannot be verified "
                          "(the record was edited, or not written by `medclr train`); restore it from the run, or set "
                          f"{TRUST_WEIGHTS_ENV}=1 to load unverified weights")
    if verify and not meta.weights_sha256:
        log.warning("checkpoint %s records no SHA-256 of its weights (saved before medclr recorded one): only damage that "
                    "makes a weight NaN or infinite can be detected", src)
    stored = read_prompt_embeddings(src, sha if verify else None, checkpoint_prompts(meta.findings)[1])
    if not text and stored is None:
        log.info("checkpoint %s stores no prompt embeddings for these weights (trained before medclr stored them, or "
                 "weights not verified): the text tower is loaded to encode the prompts", src)
    model = DualEncoder.from_pretrained(src, map_location=device, text=text or stored is None)
    check_finite(model, src)
    if model.head.kind != "cosine" and not getattr(model.head, "trained", False):
        raise MedclrError(f"checkpoint {str(src)!r}: its {model.head.kind} head was never trained (the loss scored "
                          "global embeddings when it was made), so its scores and heatmaps are noise; retrain with "
                          "this version of `medclr train model.head=lse_nl`, or train with model.head=cosine")
    if model.text_encoder is not None:
        check_tokenizer(model, src)
    size = int(image_size or meta.image_size)
    rsz = resize or meta.resize
    pre = Preprocess(size, int(rsz) if rsz and int(rsz) >= size else None)
    t = tau or meta.tau or DEFAULT_TAU
    return Inference(model, pre, float(t), checkpoint_dir=src, meta=meta, device=device, weights_sha256=sha,
                     stored_prompts=stored)
