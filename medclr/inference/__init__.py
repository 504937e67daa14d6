"""Inference on a trained checkpoint: load it, embed images and texts, zero-shot scores, grounding maps.

Used by the app, the index builder, the batch scorer and evaluation, so that every consumer sees the
same preprocessing and the same maths. The parts:

* :mod:`~medclr.inference.preprocess`: training's deterministic image view, its crop geometry, the
  DataLoader that decodes files in workers;
* :mod:`~medclr.inference.checkpoint`: what a checkpoint dir records (``preprocess.json``, tau, eta
  table), the weights fingerprint;
* :mod:`~medclr.inference.stats`: eta_LM and NUCLR zeta per sentence / manifest index;
* :mod:`~medclr.inference.engine`: :class:`Inference` (embeddings, zero-shot, grounding);
* :mod:`~medclr.inference.load`: :func:`load_checkpoint`, a checkpoint dir -> an :class:`Inference`.

This package re-exports their public names; ``from medclr.inference import X`` is the import to use.
"""

from medclr.inference.checkpoint import (
    DEFAULT_TAU as DEFAULT_TAU,
    LOSS_STATE_NAME as LOSS_STATE_NAME,
    PREPROCESS_NAME as PREPROCESS_NAME,
    read_checkpoint_info,
    weights_sha256,
    write_preprocess,
)
from medclr.inference.engine import EncodedImage, Inference
from medclr.inference.load import load_checkpoint
from medclr.inference.preprocess import (
    DEFAULT_IMAGE_SIZE as DEFAULT_IMAGE_SIZE,
    CropGeometry,
    ImageFiles,
    Preprocess,
    collate_images,
    image_loader,
    preprocess_image,
    worker_init,
)
from medclr.inference.stats import SentenceStats

__all__ = ["CropGeometry", "EncodedImage", "ImageFiles", "Inference", "Preprocess", "SentenceStats",
           "collate_images", "image_loader", "load_checkpoint", "preprocess_image", "read_checkpoint_info",
           "weights_sha256", "worker_init", "write_preprocess"]
