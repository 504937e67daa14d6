"""Pictures for the app: display copies, heatmap overlays with iso-contours, gallery thumbnails.

Heatmaps follow BioViL's visualisation (hi-ml-multimodal's phrase-grounding plots, docs/evaluation.md
section 5): diverging ``RdBu_r`` colours, alpha 0.5, iso-contours. ``scale="absolute"`` fixes the colour
range to cosine [-1, 1] (comparable across images and phrases; contours at 0.25 / 0.5 / 0.75);
``scale="relative"`` stretches the colours to this map's own range (contours at 25 / 50 / 75 % of it),
useful for weakly trained models whose cosines are close.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

_LUT: np.ndarray | None = None
ABS_LEVELS = (0.25, 0.5, 0.75)
CONTOUR_COLOURS = ((255, 255, 255), (255, 215, 0), (0, 0, 0))


def _lut() -> np.ndarray:
    global _LUT
    if _LUT is None:
        from matplotlib import colormaps

        _LUT = (colormaps["RdBu_r"](np.linspace(0.0, 1.0, 256))[:, :3] * 255).astype(np.float32)
    return _LUT


def display_copy(image: np.ndarray, max_side: int = 768) -> np.ndarray:
    """float32 H x W in [0, 1] -> a smaller copy (area-averaged) with the longer side <= max_side."""
    h, w = image.shape
    scale = max_side / max(h, w)
    if scale >= 1.0:
        return image.astype(np.float32, copy=False)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(Image.fromarray(image.astype(np.float32)).resize(size, Image.Resampling.BOX),
                      dtype=np.float32)


def to_uint8(image: np.ndarray) -> np.ndarray:
    return (np.clip(image, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def thumbnail(image: np.ndarray, max_side: int = 256) -> np.ndarray:
    return to_uint8(display_copy(image, max_side))


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


def save_png(image: np.ndarray, folder: str | Path, stem: str) -> str:
    """Write an H x W (grey) or H x W x 3 uint8 image to a new file ``folder/<stem>-<96 random bits>.png``
    and return its path.

    The file is written under a hidden temporary name and renamed into place complete, and every call
    makes a new name: a file once handed out is never written again, so a client still downloading an
    earlier result (the same picture, for an identical request) never sees it truncated or half written.
    ``folder`` must exist (it is not re-created after the app has removed it on exit)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".part-", suffix=".png")
    try:
        with os.fdopen(fd, "wb") as fh:
            Image.fromarray(np.ascontiguousarray(image)).save(fh, format="PNG")
        final = Path(folder) / f"{stem}-{secrets.token_hex(12)}.png"
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return str(final)


def placeholder(side: int = 256, text: str = "image unavailable") -> np.ndarray:
    img = Image.new("RGB", (side, side), (60, 60, 60))
    ImageDraw.Draw(img).text((10, side // 2 - 6), text, fill=(230, 230, 230))
    return np.asarray(img)
