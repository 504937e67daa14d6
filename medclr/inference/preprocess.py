"""Image preprocessing for inference: training's deterministic view, and the way back to the original image.

Kept apart from the engine because the index builder, the batch scorer and evaluation decode and
preprocess files in DataLoader workers (:func:`image_loader`) without needing a model.

* Image preprocessing matches training's deterministic view (and BioViL's, DATASETS §1.3):
  ``medclr.io.read_image`` (float32 H x W in [0, 1], air dark) -> shorter side resized to R (area
  averaging when shrinking) -> centre crop C -> ``1 x C x C``. C (``image_size``) and R (``resize``, default C) come from the checkpoint (see
  :func:`medclr.inference.checkpoint.read_checkpoint_info`); default 224. The :class:`CropGeometry` returned with the tensor
  undoes the crop for heatmaps (BioViL's ``convert_similarity_to_image_size``: NaN outside the crop).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from medclr.errors import MedclrError
from medclr.io import MAX_PIXELS, read_image

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


@dataclass(frozen=True)
class CropGeometry:
    """Where the model's C x C crop lies in an original H x W image (hi-ml conventions)."""

    height: int
    width: int
    resize: int
    crop: int

    @property
    def side(self) -> int:
        """Crop side in original pixels: floor(C * min(H, W) / R)."""
        return int(self.crop * min(self.height, self.width) // self.resize)

    def box(self) -> tuple[int, int, int, int]:
        """(top, left, bottom, right) of the crop in original pixels (floor margins, as hi-ml)."""
        side = self.side
        top, left = (self.height - side) // 2, (self.width - side) // 2
        return top, left, top + side, left + side

    def resized(self, height: int, width: int) -> "CropGeometry":
        """The same crop for a display copy of the image scaled to ``height x width``."""
        return CropGeometry(int(height), int(width), self.resize, self.crop)

    def to_original(self, grid_map: np.ndarray, interpolation: str = "bilinear") -> np.ndarray:
        """h x w map over the crop -> H x W float32, upsampled into the crop, NaN outside it."""
        top, left, bottom, right = self.box()
        t = torch.as_tensor(np.asarray(grid_map, dtype=np.float32))[None, None]
        kw = {"align_corners": False} if interpolation in ("bilinear", "bicubic") else {}
        up = torch.nn.functional.interpolate(t, size=(bottom - top, right - left), mode=interpolation, **kw)[0, 0]
        out = np.full((self.height, self.width), np.nan, dtype=np.float32)
        out[top:bottom, left:right] = up.numpy()
        return out


# The smallest side an input may have: below it an "image" (1x1, 2x500, 16384x3) carries no anatomy,
# and resizing it up would give the model a smear to score with confident-looking percentages.
MIN_SIDE = 32


def preprocess_image(image: np.ndarray, pre: Preprocess = Preprocess()) -> tuple[torch.Tensor, CropGeometry]:
    """H x W float image in [0, 1] -> (1 x C x C float32 tensor, its crop geometry).

    The deterministic view of training (``training/data.py``): shorter side resized to R (longer side
    round(long * R / short)), area averaging when shrinking and bilinear when enlarging, then MONAI's
    ``CenterSpatialCrop(C)`` (start = size // 2 - C // 2). Training may cache the resized image as
    uint8; that quantisation (< 1/255) is not repeated here."""
    arr = np.asarray(image, dtype=np.float32)
    if arr.ndim != 2 or min(arr.shape) < 1:
        raise MedclrError(f"image: expected a 2-D grey array, got shape {arr.shape}")
    if min(arr.shape) < MIN_SIDE:
        raise MedclrError(f"image: {arr.shape[1]}x{arr.shape[0]} pixels is not a radiograph (each side must be at "
                          f"least {MIN_SIDE} px); nothing was scored")
    if not np.isfinite(arr).all():
        raise MedclrError("image: it holds NaN or infinite pixel values (a float image without a valid range?); "
                          "nothing was scored")
    h, w = arr.shape
    r, c = pre.resize_to, int(pre.image_size)
    s = r / min(h, w)
    size = (max(r, round(h * s)), max(r, round(w * s)))
    t = torch.from_numpy(np.ascontiguousarray(arr))[None, None]
    if s < 1:
        t = torch.nn.functional.interpolate(t, size=size, mode="area")
    else:
        t = torch.nn.functional.interpolate(t, size=size, mode="bilinear", align_corners=False)
    top, left = size[0] // 2 - c // 2, size[1] // 2 - c // 2
    t = t[0, :, top:top + c, left:left + c].clamp_(0.0, 1.0).contiguous()
    return t, CropGeometry(h, w, r, c)


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
            arr = read_image(self.paths[i], max_pixels=self.max_pixels)
            tensor, geo = preprocess_image(arr, self.pre)
            return {"i": i, "tensor": tensor, "ok": True, "error": "", "height": geo.height, "width": geo.width}
        except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded error row
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return {"i": i, "tensor": torch.zeros(1, c, c), "ok": False, "error": msg, "height": 0, "width": 0}


def collate_images(batch: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "i": torch.tensor([b["i"] for b in batch], dtype=torch.long),
        "tensor": torch.stack([b["tensor"] for b in batch]),
        "ok": torch.tensor([b["ok"] for b in batch], dtype=torch.bool),
        "error": [b["error"] for b in batch],
        "height": [b["height"] for b in batch],
        "width": [b["width"] for b in batch],
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
