"""Image preprocessing for inference: training's deterministic view, and the way back to the original image.

Kept apart from the engine because the index builder, the batch scorer and evaluation decode and
preprocess files in DataLoader workers (:func:`image_loader`) without needing a model.

* Image preprocessing matches training's deterministic view (and BioViL's inference transform in hi-ml-multimodal):
  ``medclr.io.read_image`` (float32 H x W in [0, 1], air dark) -> shorter side resized to R (area
  averaging when shrinking) -> centre crop C -> ``1 x C x C``. C (``image_size``) and R (``resize``,
  default C) come from the checkpoint (see :func:`medclr.inference.metadata.read_metadata`);
  default 224. Sizes, crop origin and the :class:`~medclr.geometry.CropGeometry` returned with the
  tensor (which carries heatmaps back to the original image, NaN outside the crop) all come from
  :mod:`medclr.geometry`, the rule training uses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from medclr.errors import MedclrError
from medclr.geometry import CropGeometry, centre_crop, resize_shorter_side
from medclr.io import MAX_PIXELS, read_image_with_caution
from medclr.io.limits import MIN_SIDE, image_problem  # noqa: F401 - MIN_SIDE re-exported

DEFAULT_IMAGE_SIZE = 224


@dataclass(frozen=True)
class Preprocess:
    """Resize the shorter side to ``resize`` (default ``image_size``), then centre-crop ``image_size``."""

    image_size: int = DEFAULT_IMAGE_SIZE
    resize: int | None = None

    def __post_init__(self) -> None:
        if int(self.image_size) < 32 or (self.resize is not None and int(self.resize) < int(self.image_size)):
            raise MedclrError(f"preprocess: image_size {self.image_size} must be >= 32 and <= resize {self.resize}")

    @property
    def resize_to(self) -> int:
        return int(self.resize or self.image_size)


def preprocess_image(image: np.ndarray, pre: Preprocess = Preprocess()) -> tuple[torch.Tensor, CropGeometry]:
    """H x W float image in [0, 1] -> (1 x C x C float32 tensor, its crop geometry).

    The deterministic view of training (``training/data.py``), both through :mod:`medclr.geometry`: shorter
    side resized to R (longer side round(long * R / short)), area averaging when shrinking and bilinear
    when enlarging, then the centre crop C (start = size // 2 - C // 2). Training may cache the resized
    image as uint8; that quantisation (< 1/255) is not repeated here."""
    arr = np.asarray(image, dtype=np.float32)
    if arr.ndim != 2 or min(arr.shape) < 1:
        raise MedclrError(f"image: expected a 2-D grey array, got shape {arr.shape}")
    problem = image_problem(arr)
    if problem:
        raise MedclrError(f"image: {problem}; nothing was scored")
    r, c = pre.resize_to, int(pre.image_size)
    t = centre_crop(resize_shorter_side(torch.from_numpy(np.ascontiguousarray(arr))[None], r), c)
    return t.clamp_(0.0, 1.0).contiguous(), CropGeometry.from_resize_crop(arr.shape, r, c)


class ImageFiles(torch.utils.data.Dataset):
    """Decode + preprocess files (in DataLoader workers). Items never raise: a bad file gives
    ``ok=False`` and its one-line error, so a batch job records it and goes on."""

    def __init__(self, paths: Sequence[str | os.PathLike], pre: Preprocess, max_pixels: int = MAX_PIXELS) -> None:
        self.paths, self.pre, self.max_pixels = [str(p) for p in paths], pre, max_pixels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        c = int(self.pre.image_size)
        try:
            # a DICOM header that says "maybe not a chest radiograph" (OT, another body part) travels with the scores
            arr, caution = read_image_with_caution(self.paths[i], max_pixels=self.max_pixels)
            tensor, geo = preprocess_image(arr, self.pre)
            return {"i": i, "tensor": tensor, "ok": True, "error": "", "height": geo.height, "width": geo.width,
                    "caution": caution}
        except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded error row
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return {"i": i, "tensor": torch.zeros(1, c, c), "ok": False, "error": msg, "height": 0, "width": 0,
                    "caution": ""}


def collate_images(batch: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "i": torch.tensor([b["i"] for b in batch], dtype=torch.long),
        "tensor": torch.stack([b["tensor"] for b in batch]),
        "ok": torch.tensor([b["ok"] for b in batch], dtype=torch.bool),
        "error": [b["error"] for b in batch],
        "height": [b["height"] for b in batch],
        "width": [b["width"] for b in batch],
        "caution": [b["caution"] for b in batch],
    }


def worker_init(_worker_id: int) -> None:
    """DataLoader workers decode with one thread each; the model keeps the cores."""
    torch.set_num_threads(1)


def image_loader(paths: Sequence[str | os.PathLike], pre: Preprocess, batch_size: int = 16, num_workers: int = 0,
                 max_pixels: int = MAX_PIXELS, prefetch_factor: int = 4) -> torch.utils.data.DataLoader:
    """An ordered DataLoader over :class:`ImageFiles` (workers decode while the model runs)."""
    kw: dict[str, Any] = {}
    if num_workers > 0:
        kw = {"worker_init_fn": worker_init, "prefetch_factor": prefetch_factor, "persistent_workers": False}
    return torch.utils.data.DataLoader(ImageFiles(paths, pre, max_pixels), batch_size=batch_size, shuffle=False,
                                       num_workers=num_workers, collate_fn=collate_images, **kw)
