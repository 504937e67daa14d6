"""Inference on a trained checkpoint: load it, embed images and texts, zero-shot scores, grounding maps.

Used by the app, the index builder, the batch scorer and evaluation, so that every consumer sees the
same preprocessing and the same maths. The parts:

* :mod:`~medclr.inference.preprocess`: training's deterministic image view, its crop geometry, the
  DataLoader that decodes files in workers;
* :mod:`~medclr.inference.metadata`: ``checkpoint_meta.json``, what a checkpoint records for its readers
  (preprocessing, tau, eta table, training provenance): :func:`read_metadata`, :func:`write_metadata`;
* :mod:`~medclr.inference.checkpoint`: the rest of the directory's names, the weights fingerprint;
* :mod:`~medclr.inference.stats`: eta_LM and NUCLR zeta per sentence / manifest index;
* :mod:`~medclr.inference.engine`: :class:`Inference` (embeddings, zero-shot, grounding);
* :mod:`~medclr.inference.load`: :func:`load_checkpoint`, a checkpoint dir -> an :class:`Inference`.

This package re-exports their public names; ``from medclr.inference import X`` is the import to use.
"""

from medclr.inference.checkpoint import DEFAULT_TAU as DEFAULT_TAU, weights_sha256
from medclr.inference.engine import EncodedImage, Inference
from medclr.inference.load import load_checkpoint
from medclr.inference.metadata import (
    LOSS_STATE_NAME as LOSS_STATE_NAME,
    METADATA_NAME as METADATA_NAME,
    CheckpointMeta,
    read_metadata,
    write_metadata,
)
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

__all__ = ["CheckpointMeta", "CropGeometry", "EncodedImage", "ImageFiles", "Inference", "Preprocess",
           "SentenceStats", "collate_images", "image_loader", "load_checkpoint", "preprocess_image", "read_metadata",
           "weights_sha256", "worker_init", "write_metadata"]
