"""medclr: chest X-ray vision-language pretraining with false-negative-aware contrastive losses.

``medclr.load(folder_or_name)`` is the Python entry: a trained checkpoint, or a model shipped with medclr by name,
ready for zero-shot labels, grounding maps, embeddings and retrieval (:class:`medclr.inference.Inference`;
docs/models.md shows the calls).
"""

from __future__ import annotations

__version__ = "0.1.0"


def load(path, device: str = "cpu", **options):
    """A `medclr train` checkpoint folder, or the name of a model shipped with medclr (``medclr.pretrained``,
    `medclr models`; its files are checked against its SHA256SUMS, nothing is downloaded) ->
    :class:`medclr.inference.Inference` (``model.zero_shot(image)``, ``model.ground(image, phrase)``,
    ``model.overlay(image, phrase)``, ``model.embed_images(images)``, ``model.embed_texts(sentences)``,
    ``model.retrieve(index, image=... | text=...)``). ``options`` are
    :func:`medclr.inference.load_checkpoint`'s (image_size, resize, tau, verify_weights). torch and the towers are
    imported here, not by ``import medclr``."""
    from medclr.inference import load_checkpoint

    return load_checkpoint(path, device=device, **options)
