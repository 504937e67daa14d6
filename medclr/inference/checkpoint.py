"""The checkpoint directory contract: what a `medclr train` output dir holds, and loading it for inference.

The model is ``config.json`` + ``model.safetensors`` + ``tokenizer/`` (:class:`~medclr.models.dual.DualEncoder`);
what training records beside it for readers (preprocessing, tau, the eta table, ...) is
``checkpoint_meta.json``, read with :func:`~medclr.inference.metadata.read_metadata`;
:func:`load_checkpoint` puts them together into an :class:`~medclr.inference.engine.Inference`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from medclr.errors import MedclrError
from medclr.inference.metadata import LOSS_STATE_NAME as LOSS_STATE_NAME  # noqa: F401 - re-exported
from medclr.inference.metadata import read_metadata
from medclr.inference.preprocess import Preprocess
from medclr.models.dual import WEIGHTS_NAME, DualEncoder

if TYPE_CHECKING:
    from medclr.inference.engine import Inference

# loss_state.safetensors: per-sample tables (u, zeta) are indexed by the row's position in the training
# split; this tensor beside them maps each position to the manifest `index` (written by training).
SAMPLE_INDEX_KEY = "sample_manifest_index"
DEFAULT_TAU = 1.0 / 14.0  # the paper initialises the hypersphere radius at sqrt(14): tau = 1/gamma^2


def weights_sha256(directory: str | os.PathLike) -> str:
    """SHA-256 of the checkpoint's ``model.safetensors`` (identifies the model an index was built from)."""
    h = hashlib.sha256()
    with open(Path(directory) / WEIGHTS_NAME, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def load_checkpoint(directory: str | os.PathLike, device: str | torch.device = "cpu", image_size: int | None = None,
                    resize: int | None = None, tau: float | None = None) -> Inference:
    """Load a `medclr train` checkpoint dir for inference. Arguments override what the dir records."""
    from medclr.inference.engine import Inference  # the engine imports this module

    src = Path(directory).expanduser()
    if not src.is_dir():
        raise MedclrError(f"checkpoint {str(src)!r}: no such directory (expected a `medclr train` output dir)")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise MedclrError(f"device {device!r}: CUDA is not available on this machine; use --device cpu")
    meta = read_metadata(src)
    model = DualEncoder.from_pretrained(src, map_location=device)
    if model.head.kind != "cosine" and not getattr(model.head, "trained", False):
        raise MedclrError(f"checkpoint {str(src)!r}: its {model.head.kind} head was never trained (the loss scored "
                          "global embeddings when it was made), so its scores and heatmaps are noise; retrain with "
                          "this version of `medclr train model.head=lse_nl`, or train with model.head=cosine")
    if model.tokenizer is None:
        raise MedclrError(f"checkpoint {str(src)!r}: no tokenizer/ directory; texts cannot be encoded")
    size = int(image_size or meta.image_size)
    rsz = resize or meta.resize
    pre = Preprocess(size, int(rsz) if rsz and int(rsz) >= size else None)
    t = tau or meta.tau or DEFAULT_TAU
    return Inference(model, pre, float(t), checkpoint_dir=src, meta=meta, device=device)
