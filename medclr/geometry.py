"""Resize the shorter side, centre-crop: the one rule for where the model's input lies in the original image.

Training's deterministic view (``medclr.training.data``), inference preprocessing (``medclr.inference.preprocess``)
and evaluation's heatmap placement and box features (``medclr.evaluation.grounding``, ``medclr.evaluation.runner``) all
take their sizes, crop origin and coordinate maps from here, so a pixel of the original image lands on the
same crop pixel in every path.

The rule is training's deterministic view, the crop the model was trained and is run on:

* resize: the shorter side becomes R, the longer side ``round(long * R / short)`` (Python's ``round``,
  half to even; never below R). Each axis is scaled by its own factor ``resized / original``: area
  averaging when shrinking, bilinear (``align_corners=False``) when enlarging;
* centre crop C of the resized image: start ``size // 2 - C // 2`` on each axis (MONAI's
  ``CenterSpatialCrop``; C <= R, so the crop never leaves the image);
* pixel i spans [i, i + 1), centre i + 0.5, at every stage: a continuous coordinate y of the original
  image is ``y * resize_h / original_h - crop_top`` in crop pixels (:meth:`CropGeometry.original_to_crop`).

Example: 3056 x 2544 (H x W), R 512, C 480: resized 615 x 512, crop origin (67, 16) in resized pixels, i.e.
row 332.94 and column 79.5 of the original; the first original rows/columns whose centre is inside the
crop are 333 and 79 (:meth:`CropGeometry.crop_slices`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["CropGeometry", "centre_crop", "crop_start", "resize_shorter_side", "resized_shape"]


def resized_shape(height: int, width: int, resize: int) -> tuple[int, int]:
    """(H', W') after resizing the shorter side to ``resize``: the longer side is ``round(long * R / short)``."""
    h, w, r = int(height), int(width), int(resize)
    if h <= 0 or w <= 0 or r <= 0:
        raise ValueError(f"bad geometry: image {h} x {w}, resize {r}")
    s = r / min(h, w)
    return max(r, round(h * s)), max(r, round(w * s))


def crop_start(size: int, crop: int) -> int:
    """First resized pixel of a centred ``crop`` on an axis of ``size`` pixels: ``size // 2 - crop // 2``."""
    if not 0 < int(crop) <= int(size):
        raise ValueError(f"bad geometry: crop {crop} on an axis of {size} pixels (need 0 < crop <= size)")
    return int(size) // 2 - int(crop) // 2


def resize_shorter_side(image: torch.Tensor, resize: int) -> torch.Tensor:
    """C x H x W float tensor -> C x H' x W' (:func:`resized_shape`): area averaging when shrinking, bilinear
    (``align_corners=False``) when enlarging."""
    h, w = image.shape[-2:]
    size = resized_shape(h, w, resize)
    x = image[None].float()
    if int(resize) < min(h, w):
        return torch.nn.functional.interpolate(x, size=size, mode="area")[0]
    return torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)[0]


def centre_crop(image: torch.Tensor, crop: int) -> torch.Tensor:
    """The centred ``crop x crop`` window (:func:`crop_start`) of the last two axes."""
    c = int(crop)
    top, left = crop_start(image.shape[-2], c), crop_start(image.shape[-1], c)
    return image[..., top:top + c, left:left + c]


@dataclass(frozen=True)
class CropGeometry:
    """How the model input was cut from an ``original_h x original_w`` image: resized to ``resize_h x resize_w``,
    then the window at (``crop_top``, ``crop_left``) of size ``crop_h x crop_w``, in resized pixels, was taken.

    The model's score grid covers exactly that window. Build one with :meth:`from_resize_crop`."""

    original_h: int
    original_w: int
    resize_h: int
    resize_w: int
    crop_top: int
    crop_left: int
    crop_h: int
    crop_w: int

    def __post_init__(self) -> None:
        for name in ("original_h", "original_w", "resize_h", "resize_w", "crop_h", "crop_w"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"CropGeometry.{name} must be positive, got {getattr(self, name)}")

    @classmethod
    def from_resize_crop(cls, original_hw: tuple[int, int], resize: int, crop: int | None) -> CropGeometry:
        """The geometry of the rule (module docstring); ``crop=None`` keeps the whole resized image."""
        h, w = (int(v) for v in original_hw)
        rh, rw = resized_shape(h, w, resize)
        if crop is None:
            return cls(h, w, rh, rw, 0, 0, rh, rw)
        c = int(crop)
        return cls(h, w, rh, rw, crop_start(rh, c), crop_start(rw, c), c, c)

    @classmethod
    def identity(cls, original_hw: tuple[int, int]) -> CropGeometry:
        """The grid covers the whole image (no resize, no crop)."""
        h, w = (int(v) for v in original_hw)
        return cls(h, w, h, w, 0, 0, h, w)

    @property
    def height(self) -> int:
        return self.original_h

    @property
    def width(self) -> int:
        return self.original_w

    def resized(self, height: int, width: int) -> CropGeometry:
        """The same crop on a copy of the original image scaled to ``height x width`` (e.g. a display copy)."""
        return dataclasses.replace(self, original_h=int(height), original_w=int(width))

    # -- coordinates ---------------------------------------------------------------------------------
    def original_to_crop(self, y, x) -> tuple[np.ndarray, np.ndarray]:
        """Continuous original-image coordinates (row y, column x; pixel i spans [i, i + 1)) -> crop pixels."""
        sy, sx = self.resize_h / self.original_h, self.resize_w / self.original_w
        return np.asarray(y, np.float64) * sy - self.crop_top, np.asarray(x, np.float64) * sx - self.crop_left

    def crop_to_original(self, y, x) -> tuple[np.ndarray, np.ndarray]:
        """Inverse of :meth:`original_to_crop`."""
        sy, sx = self.resize_h / self.original_h, self.resize_w / self.original_w
        return (np.asarray(y, np.float64) + self.crop_top) / sy, (np.asarray(x, np.float64) + self.crop_left) / sx

    def boxes_to_crop(self, boxes_xywh) -> np.ndarray:
        """MS-CXR ``(x, y, w, h)`` boxes in original pixels -> ``(x1, y1, x2, y2)`` rows in crop pixels (unclipped)."""
        b = np.asarray(boxes_xywh, dtype=np.float64).reshape(-1, 4)
        y1, x1 = self.original_to_crop(b[:, 1], b[:, 0])
        y2, x2 = self.original_to_crop(b[:, 1] + b[:, 3], b[:, 0] + b[:, 2])
        return np.stack([x1, y1, x2, y2], axis=1)

    def _centres_in_crop(self, axis: int) -> np.ndarray:
        """Crop coordinate of every original pixel centre along ``axis`` (0 rows, 1 columns)."""
        n = self.original_h if axis == 0 else self.original_w
        centres = np.arange(n, dtype=np.float64) + 0.5
        return self.original_to_crop(centres, 0.0)[0] if axis == 0 else self.original_to_crop(0.0, centres)[1]

    def _inside(self, axis: int) -> np.ndarray:
        c = self._centres_in_crop(axis)
        return (c >= 0) & (c < (self.crop_h if axis == 0 else self.crop_w))

    def crop_slices(self) -> tuple[slice, slice]:
        """Rows and columns of the ORIGINAL image whose pixel centre lies inside the crop (the pixels a
        heatmap fills; all others are NaN)."""
        return _as_slice(self._inside(0)), _as_slice(self._inside(1))

    def box(self) -> tuple[int, int, int, int]:
        """(top, left, bottom, right) of :meth:`crop_slices` in original pixels (bottom/right exclusive)."""
        rows, cols = self.crop_slices()
        return rows.start, cols.start, rows.stop, cols.stop

    # -- heatmaps ------------------------------------------------------------------------------------
    def to_original(self, grid_map: np.ndarray, interpolation: str = "bilinear") -> np.ndarray:
        """An h x w map over the crop -> ``original_h x original_w`` float32, NaN outside the crop.

        Each original pixel centre is carried into grid coordinates (cell k centred at k, the
        ``align_corners=False`` convention) and sampled bilinearly with the edge clamped
        (``"bilinear"``), or takes the cell that contains it (``"nearest"``, torch's ``nearest-exact``).
        When the crop lands on whole original pixels this equals ``torch.nn.functional.interpolate``
        of the grid to the crop's size, NaN-padded."""
        g = np.asarray(grid_map, dtype=np.float64)
        if g.ndim != 2 or g.shape[0] == 0 or g.shape[1] == 0:
            raise ValueError(f"grid map must be a non-empty 2-D array, got shape {g.shape}")
        if interpolation not in ("bilinear", "nearest"):
            raise ValueError(f"interpolation must be 'bilinear' or 'nearest', got {interpolation!r}")
        out = np.full((self.original_h, self.original_w), np.nan, dtype=np.float32)
        rows, cols = self.crop_slices()
        if rows.stop <= rows.start or cols.stop <= cols.start:
            return out
        taps = []
        for axis, sl, n_crop, n_grid in ((0, rows, self.crop_h, g.shape[0]), (1, cols, self.crop_w, g.shape[1])):
            coords = self._centres_in_crop(axis)[sl] * (n_grid / n_crop) - 0.5
            taps.append(_taps(coords, n_grid, interpolation))
        out[rows, cols] = (taps[0] @ g @ taps[1].T).astype(np.float32)
        return out


def _as_slice(flags: np.ndarray) -> slice:
    idx = np.flatnonzero(flags)
    return slice(0, 0) if idx.size == 0 else slice(int(idx[0]), int(idx[-1]) + 1)


def _taps(coords: np.ndarray, n: int, interpolation: str) -> np.ndarray:
    """(len(coords), n) interpolation weights: bilinear with the edge clamped, or nearest (ties upward)."""
    w = np.zeros((coords.size, n), dtype=np.float64)
    rows = np.arange(coords.size)
    if interpolation == "nearest":
        w[rows, np.clip(np.floor(coords + 0.5), 0, n - 1).astype(np.int64)] = 1.0
        return w
    c = np.clip(coords, 0.0, n - 1.0)
    i0 = np.floor(c).astype(np.int64)
    i1 = np.minimum(i0 + 1, n - 1)
    frac = c - i0
    np.add.at(w, (rows, i0), 1.0 - frac)
    np.add.at(w, (rows, i1), frac)
    return w
