"""Pictures for the app: display copies, gallery thumbnails, PNG files handed to the browser.

The heatmap overlay itself is :func:`medclr.inference.overlay.overlay`, the picture the Python API draws too.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


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
