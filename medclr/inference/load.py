"""Loading a `medclr train` checkpoint directory into an :class:`~medclr.inference.engine.Inference`.

Apart from :mod:`~medclr.inference.checkpoint` (what the directory records) so that the arrows run one
way: checkpoint <- stats <- engine <- load.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from medclr.errors import MedclrError
from medclr.inference.checkpoint import DEFAULT_TAU, _loss_tau, read_checkpoint_info
from medclr.inference.engine import Inference
from medclr.inference.preprocess import DEFAULT_IMAGE_SIZE, Preprocess
from medclr.models.dual import DualEncoder


def load_checkpoint(directory: str | os.PathLike, device: str | torch.device = "cpu", image_size: int | None = None,
                    resize: int | None = None, tau: float | None = None) -> Inference:
    """Load a `medclr train` checkpoint dir for inference. Arguments override what the dir records."""
    src = Path(directory).expanduser()
    if not src.is_dir():
        raise MedclrError(f"checkpoint {str(src)!r}: no such directory (expected a `medclr train` output dir)")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise MedclrError(f"device {device!r}: CUDA is not available on this machine; use --device cpu")
    model = DualEncoder.from_pretrained(src, map_location=device)
    if model.head.kind != "cosine" and not getattr(model.head, "trained", False):
        raise MedclrError(f"checkpoint {str(src)!r}: its {model.head.kind} head was never trained (the loss scored "
                          "global embeddings when it was made), so its scores and heatmaps are noise; retrain with "
                          "this version of `medclr train model.head=lse_nl`, or train with model.head=cosine")
    if model.tokenizer is None:
        raise MedclrError(f"checkpoint {str(src)!r}: no tokenizer/ directory; texts cannot be encoded")
    info = read_checkpoint_info(src)
    size = int(image_size or info["image_size"] or DEFAULT_IMAGE_SIZE)
    rsz = resize or info["resize"]
    pre = Preprocess(size, int(rsz) if rsz and int(rsz) >= size else None)
    t = tau or info["tau"] or _loss_tau(src) or DEFAULT_TAU
    return Inference(model, pre, float(t), checkpoint_dir=src, info=info, device=device)
