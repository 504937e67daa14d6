"""Loading a `medclr train` checkpoint directory into an :class:`~medclr.inference.engine.Inference`.

Apart from :mod:`~medclr.inference.checkpoint` and :mod:`~medclr.inference.metadata` (what the
directory holds and records) so that the arrows run one way: metadata <- checkpoint <- stats <- engine <- load.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from medclr.errors import MedclrError
from medclr.inference.checkpoint import DEFAULT_TAU
from medclr.inference.engine import Inference
from medclr.inference.metadata import read_metadata
from medclr.inference.preprocess import Preprocess
from medclr.models.dual import DualEncoder


def load_checkpoint(directory: str | os.PathLike, device: str | torch.device = "cpu", image_size: int | None = None,
                    resize: int | None = None, tau: float | None = None) -> Inference:
    """Load a `medclr train` checkpoint dir for inference. Arguments override what the dir records."""
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
