"""Phrase-grounding metrics on similarity maps: CNR, mIoU, map upsampling, per-category averages.

Pure functions on arrays; no model is imported. The pinned protocol is written down in
``docs/evaluation.md`` (section "Grounding"). In short:

* a map is an H×W array of region–sentence scores at the ORIGINAL image resolution, NaN where
  the model saw nothing (outside the centre crop); NaN (and ±inf) pixels are ignored everywhere;
* the interior of a phrase is the union of all its boxes (``boxes_to_mask``), the exterior is
  every other non-NaN pixel;
* CNR = |μ_in − μ_out| / sqrt(σ²_in + σ²_out), population variances (ddof = 0), float64;
* mIoU = mean over 41 thresholds −1.00, −0.95, …, 1.00 of IoU(map ≥ t, interior);
* maps come from the model's score grid through :func:`upsample_map` (``medclr.inference.heatmap``, the
  path the app's heatmaps take too): Gaussian smoothing σ = 1.5 cells (BioViL), bilinear, the
  resize/centre-crop geometry of ``medclr.geometry`` (the crop the model saw in training and inference),
  NaN outside the crop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from medclr.geometry import CropGeometry
from medclr.inference.heatmap import SMOOTH_SIGMA, smooth_map, upsample_map  # the one map path (app, scorer, eval)

__all__ = [
    "BIOVIL_SMOOTH_SIGMA",
    "DEFAULT_THRESHOLDS",
    "CropGeometry",
    "boxes_to_mask",
    "category_macro_average",
    "cnr",
    "grounding_scores",
    "iou_per_threshold",
    "miou",
    "smooth_map",
    "upsample_map",
]

#: The paper's thresholds: [-1, 1] in 0.05 steps, both ends included (41 values). Rounded to
#: 2 decimals so that e.g. 0.15 is the double nearest 0.15, not 0.15000000000000002.
DEFAULT_THRESHOLDS: np.ndarray = np.round(np.linspace(-1.0, 1.0, 41), 2)
DEFAULT_THRESHOLDS.setflags(write=False)

#: BioViL's Gaussian smoothing of the patch grid, in grid cells (docs/evaluation.md section 1.1, step 1): the
#: core's one constant, as the app and the scorer use it.
BIOVIL_SMOOTH_SIGMA: float = SMOOTH_SIGMA


# --------------------------------------------------------------------------- masks


def boxes_to_mask(boxes_xywh: Iterable[Sequence[float]], height: int, width: int) -> np.ndarray:
    """Union of boxes as a boolean H×W mask.

    Boxes are MS-CXR style ``(x, y, w, h)``: top-left corner, width and height, in pixels of
    the original image. An integer box covers rows ``y … y+h−1`` and columns ``x … x+w−1``
    (half-open slice). Fractional boxes cover every pixel they overlap
    (``floor(x) … ceil(x+w)−1``), which is the same slice for integer boxes. Parts outside the
    image are clipped; a box of zero width/height covers nothing; a negative size is an error.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"mask size must be positive, got height={height}, width={width}")
    mask = np.zeros((int(height), int(width)), dtype=bool)
    arr = np.asarray(list(boxes_xywh), dtype=np.float64)
    if arr.size == 0:
        return mask
    arr = np.atleast_2d(arr)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(f"boxes must be (x, y, w, h) rows, got array of shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("boxes contain NaN or inf")
    if np.any(arr[:, 2:] < 0):
        raise ValueError("box width/height must be >= 0")
    for x, y, w, h in arr:
        r0, r1 = max(0, math.floor(y)), min(height, math.ceil(y + h))
        c0, c1 = max(0, math.floor(x)), min(width, math.ceil(x + w))
        if r1 > r0 and c1 > c0:
            mask[r0:r1, c0:c1] = True
    return mask


def _split(sim_map: np.ndarray, box_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finite interior and exterior values (float64)."""
    m = np.asarray(sim_map, dtype=np.float64)
    b = np.asarray(box_mask)
    if m.ndim != 2:
        raise ValueError(f"sim_map must be 2-D (H, W), got shape {m.shape}")
    if b.shape != m.shape:
        raise ValueError(f"box_mask shape {b.shape} does not match sim_map shape {m.shape}")
    b = b.astype(bool, copy=False)
    valid = np.isfinite(m)
    return m[b & valid], m[~b & valid]


# --------------------------------------------------------------------------- CNR


def cnr(sim_map: np.ndarray, box_mask: np.ndarray) -> float:
    """Contrast-to-noise ratio |μ_in − μ_out| / sqrt(σ²_in + σ²_out).

    ``box_mask`` (bool, same shape) marks the interior, i.e. the union of the phrase's boxes.
    NaN/inf pixels of ``sim_map`` belong to neither region. Means and population variances
    (ddof = 0) are taken in float64, after subtracting one map value (shift-invariant, and it
    makes a constant map exactly 0 instead of a roundoff ratio).

    Degenerate cases (no division by zero, no warnings):

    * both variances 0 and equal means (e.g. a constant map): 0.0;
    * both variances 0 and different means (a perfect two-valued map): ``math.inf``;
    * interior or exterior empty after removing NaN pixels: ``math.nan`` (undefined; the
      aggregation in :func:`category_macro_average` skips NaN and counts it).
    """
    inside, outside = _split(sim_map, box_mask)
    if inside.size == 0 or outside.size == 0:
        return math.nan
    # CNR is shift-invariant; centring on one of the values first removes the roundoff that
    # would otherwise give a constant map (e.g. all 0.3) unequal means and a spurious CNR ~ 1.
    ref = inside[0]
    inside, outside = inside - ref, outside - ref
    diff = abs(float(inside.mean()) - float(outside.mean()))
    denom = math.sqrt(float(inside.var()) + float(outside.var()))
    if denom == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / denom


# --------------------------------------------------------------------------- IoU


def iou_per_threshold(
    sim_map: np.ndarray, box_mask: np.ndarray, thresholds: Sequence[float] | np.ndarray | None = None
) -> np.ndarray:
    """IoU of the binarised map ``sim_map >= t`` with the interior, for every threshold ``t``.

    NaN/inf pixels are excluded from both the prediction and the mask. Returns a float64 array
    of the thresholds' length; all NaN when the interior has no finite pixel (IoU undefined).
    With a non-empty interior the union is never empty, so every entry is in [0, 1].
    Computed by sorting once (O(n log n)), not by thresholding the map 41 times.
    """
    t = DEFAULT_THRESHOLDS if thresholds is None else np.asarray(thresholds, dtype=np.float64).ravel()
    inside, outside = _split(sim_map, box_mask)
    if inside.size == 0:
        return np.full(t.shape, np.nan)
    inside.sort()
    outside.sort()
    # number of values >= t = n - (number of values < t)
    tp = inside.size - np.searchsorted(inside, t, side="left")
    fp = outside.size - np.searchsorted(outside, t, side="left")
    return tp / (inside.size + fp)


def miou(
    sim_map: np.ndarray,
    box_mask: np.ndarray,
    thresholds: Sequence[float] | np.ndarray | None = None,
    *,
    return_per_threshold: bool = False,
) -> float | tuple[float, np.ndarray]:
    """Mean over thresholds of IoU(``sim_map >= t``, interior) for one phrase.

    ``thresholds`` defaults to :data:`DEFAULT_THRESHOLDS` (the paper's 41 values spanning
    [−1, 1] in 0.05 steps). NaN pixels are ignored. Returns NaN when the interior is empty
    after NaN removal. With ``return_per_threshold=True`` returns ``(miou, iou_array)``.
    The dataset figure is this per-phrase value averaged per category, then over categories
    (:func:`category_macro_average`).
    """
    ious = iou_per_threshold(sim_map, box_mask, thresholds)
    value = math.nan if ious.size == 0 or np.isnan(ious).all() else float(ious.mean())
    return (value, ious) if return_per_threshold else value


def grounding_scores(
    sim_map: np.ndarray,
    boxes_xywh: Iterable[Sequence[float]],
    thresholds: Sequence[float] | np.ndarray | None = None,
) -> dict[str, float]:
    """CNR and mIoU of one phrase from its map and its boxes (union interior)."""
    m = np.asarray(sim_map)
    if m.ndim != 2:
        raise ValueError(f"sim_map must be 2-D (H, W), got shape {m.shape}")
    mask = boxes_to_mask(boxes_xywh, m.shape[0], m.shape[1])
    return {"CNR": cnr(m, mask), "mIoU": miou(m, mask, thresholds)}


# --------------------------------------------------------------------------- aggregation


def category_macro_average(
    values: Sequence[float] | np.ndarray, categories: Sequence[str]
) -> dict[str, object]:
    """Average per category, then macro-average over categories (MS-CXR convention).

    NaN values (undefined metric, e.g. a box entirely outside the crop) are skipped and
    counted in ``n_nan``; an inf value makes its category mean (and the macro) inf, which is
    deliberate: it flags a degenerate map rather than hiding it. Categories with no finite
    value get NaN and are left out of the macro average. Returns
    ``{"per_category": {cat: mean}, "count": {cat: n_used}, "n_nan": {cat: n}, "macro": float,
    "micro": float}`` where ``micro`` is the plain mean over all used phrases.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    cats = np.asarray([str(c) for c in categories], dtype=object)
    if cats.shape != v.shape:
        raise ValueError(f"{v.size} values but {cats.size} categories")
    per: dict[str, float] = {}
    count: dict[str, int] = {}
    n_nan: dict[str, int] = {}
    for cat in sorted(set(cats.tolist())):
        sel = v[cats == cat]
        used = sel[~np.isnan(sel)]
        count[cat] = int(used.size)
        n_nan[cat] = int(sel.size - used.size)
        per[cat] = float(used.mean()) if used.size else math.nan
    defined = [x for x in per.values() if not math.isnan(x)]
    used_all = v[~np.isnan(v)]
    return {
        "per_category": per,
        "count": count,
        "n_nan": n_nan,
        "macro": float(np.mean(defined)) if defined else math.nan,
        "micro": float(used_all.mean()) if used_all.size else math.nan,
    }


# --------------------------------------------------------------------------- geometry


# CropGeometry (re-exported above) is medclr.geometry's: the resize/centre-crop rule of training and
# inference, and the one map from original pixels to crop pixels.


