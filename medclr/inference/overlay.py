"""A phrase heatmap drawn over its radiograph: the picture the app shows and ``Inference.overlay`` returns.

It follows BioViL's visualisation (hi-ml-multimodal's phrase-grounding plots, docs/evaluation.md section 5):
diverging ``RdBu_r`` colours, alpha 0.5, iso-contours. ``scale="absolute"`` fixes the colour range to cosine
[-1, 1] (comparable across images and phrases; contours at 0.25 / 0.5 / 0.75); ``scale="relative"`` stretches
the colours to this map's own range (contours at 25 / 50 / 75 % of it), useful for weakly trained models whose
cosines are close.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

_LUT: np.ndarray | None = None
ABS_LEVELS = (0.25, 0.5, 0.75)
CONTOUR_COLOURS = ((255, 255, 255), (255, 215, 0), (0, 0, 0))


def colour_lut() -> np.ndarray:
    """256 x 3 float32 RGB of the map's colours (``RdBu_r``), low to high: what a colour bar draws."""
    return _lut()


def _lut() -> np.ndarray:
    global _LUT
    if _LUT is None:
        from matplotlib import colormaps

        _LUT = (colormaps["RdBu_r"](np.linspace(0.0, 1.0, 256))[:, :3] * 255).astype(np.float32)
    return _LUT


def _contours(heat: np.ndarray, levels, fill: float) -> list[tuple[int, np.ndarray]]:
    from skimage.measure import find_contours

    filled = np.where(np.isnan(heat), fill, heat)
    out = []
    for k, level in enumerate(levels):
        if not (np.nanmin(heat) < level < np.nanmax(heat)):
            continue
        for c in find_contours(filled, level):
            if len(c) >= 3:
                out.append((k, c))
    return out


def overlay(image: np.ndarray, heat: np.ndarray, scale: str = "absolute", alpha: float = 0.5) -> tuple[np.ndarray, dict]:
    """Blend ``heat`` (same H x W as ``image``, NaN = no value) over the grey image; draw contours.

    Returns (H x W x 3 uint8, {"lo", "hi", "levels", "min", "max"})."""
    if heat.shape != image.shape:
        raise ValueError(f"heatmap {heat.shape} and image {image.shape} differ")
    valid = ~np.isnan(heat)
    vmin = float(np.nanmin(heat)) if valid.any() else 0.0
    vmax = float(np.nanmax(heat)) if valid.any() else 0.0
    if scale == "relative" and vmax > vmin:
        lo, hi = vmin, vmax
        levels = tuple(lo + f * (hi - lo) for f in ABS_LEVELS)
    else:
        lo, hi, levels = -1.0, 1.0, ABS_LEVELS
    grey = np.repeat(image[..., None].astype(np.float32) * 255.0, 3, axis=2)
    idx = np.clip(((np.nan_to_num(heat, nan=lo) - lo) / max(hi - lo, 1e-12) * 255.0), 0, 255).astype(np.uint8)
    colour = _lut()[idx]
    a = np.where(valid, alpha, 0.0).astype(np.float32)[..., None]
    out = Image.fromarray(((1.0 - a) * grey + a * colour).clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(out)
    width = max(1, round(max(image.shape) / 400))
    for k, c in _contours(heat, levels, fill=lo - 1.0):
        draw.line([(float(x), float(y)) for y, x in c], fill=CONTOUR_COLOURS[k % len(CONTOUR_COLOURS)], width=width)
    return np.asarray(out), {"lo": lo, "hi": hi, "levels": list(levels), "min": vmin, "max": vmax}


