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


# Views where the patient's right is not image left: a lateral shows one side over the other, not side by side.
LATERAL_VIEWS = frozenset({"LL", "RL", "LAT", "LATERAL"})
BAND_BG, BAND_TEXT = (60, 60, 60), (255, 255, 255)  # white on this grey: 10:1


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def mark_sides(image: np.ndarray, view: str | None) -> np.ndarray:
    """An H x W (x 3) uint8 film with "R" in its top-left and "L" in its top-right corner: the patient's right is
    image left on a frontal film shown as radiographs are read (PA or AP alike). A lateral view (:data:`LATERAL_VIEWS`)
    is returned unmarked; a film whose header gives no view (PNG, JPEG) is taken to be frontal."""
    rgb = np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image
    if str(view or "").strip().upper() in LATERAL_VIEWS:
        return rgb
    out = Image.fromarray(np.ascontiguousarray(rgb))
    draw = ImageDraw.Draw(out)
    size = max(12, round(min(out.size) * 0.045))
    font, pad = _font(size), max(3, size // 4)
    for text, left in (("R", True), ("L", False)):
        x0, y0, x1, y1 = draw.textbbox((0, 0), text, font=font)
        w, h = x1 - x0 + 2 * pad, y1 - y0 + 2 * pad
        x = pad if left else out.size[0] - w - pad
        draw.rectangle((x, pad, x + w, pad + h), fill=(0, 0, 0))
        draw.text((x + pad - x0, pad + pad - y0), text, font=font, fill=(255, 255, 255))
    return np.asarray(out)


def colour_bar(width: int, info: dict, scale: str) -> np.ndarray:
    """A band to put under a heatmap, ``width`` pixels wide: the map's colours from low to high, each contour's
    level marked in its own colour (``medclr.inference.overlay.CONTOUR_COLOURS``) and named: 25/50/75% of this
    map's range (``relative``) or the cosine (``absolute``)."""
    from medclr.inference.overlay import CONTOUR_COLOURS, colour_lut

    size = max(11, min(16, width // 48))
    font, pad = _font(size), size // 2
    bar_h = size
    title = ("Phrase match, blue low to red high over this map's own range; contours white, gold, black at:"
             if scale == "relative" else "Phrase match, cosine -1 (blue) to +1 (red); contours white, gold, black at:")
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    lines = _wrap(probe, title, font, width - 2 * pad)
    top = pad + len(lines) * (size + 3) + 2
    height = top + bar_h + 6 + size + pad
    band = Image.new("RGB", (width, height), BAND_BG)
    draw = ImageDraw.Draw(band)
    for i, line in enumerate(lines):
        draw.text((pad, pad + i * (size + 3)), line, font=font, fill=BAND_TEXT)
    x0, x1 = pad, width - pad
    y0 = top
    lut = colour_lut().astype(np.uint8)
    ramp = lut[np.linspace(0, 255, max(2, x1 - x0)).astype(int)]
    band.paste(Image.fromarray(np.repeat(ramp[None], bar_h, axis=0)), (x0, y0))
    lo, hi = float(info["lo"]), float(info["hi"])
    y_text = y0 + bar_h + 6
    for k, level in enumerate(info["levels"]):
        f = (float(level) - lo) / (hi - lo) if hi > lo else 0.5
        x = round(x0 + f * (x1 - x0))
        colour = CONTOUR_COLOURS[k % len(CONTOUR_COLOURS)]
        edge = (0, 0, 0) if sum(colour) > 380 else (255, 255, 255)
        draw.rectangle((x - 2, y0 - 3, x + 2, y0 + bar_h + 3), fill=colour, outline=edge)
        name = f"{round(100 * f)}%" if scale == "relative" else f"{float(level):.2f}"
        tw = draw.textlength(name, font=font)
        draw.text((min(max(x0, x - tw / 2), x1 - tw), y_text), name, font=font, fill=BAND_TEXT)
    return np.asarray(band)


def with_colour_bar(image: np.ndarray, info: dict, scale: str) -> np.ndarray:
    """``image`` (H x W x 3) with :func:`colour_bar` under it."""
    return np.concatenate([image, colour_bar(image.shape[1], info, scale)], axis=0)


def _wrap(draw, text: str, font, width: float) -> list[str]:
    """``text`` broken at spaces into lines no wider than ``width`` pixels (a word wider than that keeps its line)."""
    lines: list[str] = []
    for word in text.split():
        if lines and draw.textlength(lines[-1] + " " + word, font=font) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines
