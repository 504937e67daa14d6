"""Phrase heatmaps: the one path from a checkpoint's region–phrase score grid to a map over an image.

The app (``Inference.ground``), the scorer and ``medclr eval``'s grounding metrics all place maps with
:func:`upsample_map`, so one image and phrase give the same array everywhere:

* :func:`smooth_map`: BioViL's Gaussian smoothing of the grid, σ = :data:`SMOOTH_SIGMA` cells, float64;
* :func:`upsample_map`: smoothing, then ``medclr.geometry.CropGeometry.to_original`` (the resize/centre-crop
  rule of training and inference), NaN outside the crop; for a display copy, pass the geometry
  ``resized`` to its size;
* :func:`has_localised_signal`: the flat-map rule: a smoothed grid spanning less than :data:`MIN_MAP_RANGE`
  cosine is not painted (calibrated on the phantom, docs/evaluation.md "Flat maps": an untrained LSE+NL head
  spans ~0.006, trained heads 0.05-0.35).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from medclr.geometry import CropGeometry

SMOOTH_SIGMA = 1.5  # BioViL's smoothing of the patch grid, in grid cells
MIN_MAP_RANGE = 0.03


def map_range(grid: np.ndarray) -> float:
    """Spread of a (smoothed) region-score grid; NaN cells ignored."""
    return float(np.nanmax(grid) - np.nanmin(grid)) if np.isfinite(grid).any() else 0.0


def has_localised_signal(grid: np.ndarray) -> bool:
    return map_range(grid) >= MIN_MAP_RANGE


def smooth_map(region_scores: np.ndarray, sigma: float = SMOOTH_SIGMA) -> np.ndarray:
    """BioViL's Gaussian smoothing of the score grid (``scipy.ndimage.gaussian_filter``,
    "reflect" border, truncate 4.0), sigma in grid cells. ``sigma <= 0`` returns a copy."""
    g = np.asarray(region_scores, dtype=np.float64)
    if sigma <= 0:
        return g.copy()
    return ndimage.gaussian_filter(g, sigma=float(sigma), mode="reflect", truncate=4.0)


def upsample_map(
    region_scores: np.ndarray,
    crop_geometry: CropGeometry,
    original_hw: tuple[int, int] | None = None,
    *,
    mode: str = "bilinear",
    smooth_sigma: float | None = SMOOTH_SIGMA,
) -> np.ndarray:
    """Map an h×w region–sentence score grid back to the original image, NaN outside the crop.

    The placement is :meth:`medclr.geometry.CropGeometry.to_original` (the geometry training and
    inference use): each original pixel centre is carried through the resize (scale ``resize/original``
    per axis) and the crop (minus the offset) into grid coordinates, where cell k is centred at k (the
    ``align_corners=False`` convention). Pixels whose centre falls outside the crop window are NaN; the
    others are sampled bilinearly, edge-clamped (``mode="bilinear"``) or take the containing cell
    (``mode="nearest"``). When the crop window lands on whole original pixels the result equals
    ``torch.nn.functional.interpolate`` (bilinear, align_corners=False) of the grid to the crop's size,
    padded with NaN.

    ``smooth_sigma`` (grid cells) applies :func:`smooth_map` to the grid first; the default
    is BioViL's 1.5, the pinned protocol; pass 0 or None for pure geometry. ``original_hw``,
    when given, must match the geometry. Returns float32 (H, W).
    """
    g = np.asarray(region_scores, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] == 0 or g.shape[1] == 0:
        raise ValueError(f"region_scores must be a non-empty 2-D grid, got shape {g.shape}")
    geo = crop_geometry
    orig = (geo.original_h, geo.original_w)
    if original_hw is not None and tuple(int(v) for v in original_hw) != orig:
        raise ValueError(
            f"original_hw {tuple(original_hw)} does not match the geometry's "
            f"({geo.original_h}, {geo.original_w})"
        )
    if mode not in ("bilinear", "nearest"):
        raise ValueError(f"mode must be 'bilinear' or 'nearest', got {mode!r}")
    if smooth_sigma:
        g = smooth_map(g, smooth_sigma)
    return geo.to_original(g, mode)
