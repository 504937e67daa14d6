"""Size guards shared by every image reader (decompression bombs, absurd headers)."""

from __future__ import annotations

import numpy as np

from medclr.errors import ImageReadError

# A large detector is ~4300x3500 (15 Mpx); 50 Mpx leaves room and stops bombs.
MAX_PIXELS = 50_000_000
MAX_SIDE = 16_384


def check_size(path, height: int, width: int, max_pixels: int = MAX_PIXELS) -> None:
    if height <= 0 or width <= 0:
        raise ImageReadError(f"{path}: image has no pixels ({height}x{width})")
    if height > MAX_SIDE or width > MAX_SIDE or height * width > max_pixels:
        raise ImageReadError(
            f"{path}: image is {width}x{height} pixels, over the limit of {max_pixels:,} pixels "
            f"(side <= {MAX_SIDE}); downsample it first"
        )


# The smallest side an input may have: below it an "image" (1x1, 2x500, 16384x3) carries no anatomy,
# and resizing it up would give the model a smear to score with confident-looking percentages.
MIN_SIDE = 32
# Chest films and detectors are at most ~1.3:1 (35 x 43 cm, 14 x 17 in); a strip of 4:1 or more (a
# panoramic, a stitched spine, a banner) would be scored on its middle quarter only.
MAX_ASPECT = 4.0


def image_problem(arr: np.ndarray, shape: tuple[int, int] | None = None) -> str | None:
    """Why a decoded H x W image cannot be a radiograph (one line, no file name), or None: a side under
    MIN_SIDE, a side MAX_ASPECT times the other or more, NaN or infinite pixels, one value in every pixel
    (:func:`blank_problem`). ``shape``: the original (H, W) when ``arr`` was decoded at a reduced size
    (``medclr.io.reduced``). Every path that reads images checks it: the app, ``medclr inspect``, ``medclr
    score``, ``medclr index build`` and evaluation (through ``medclr.inference.preprocess_image``)."""
    height, width = arr.shape if shape is None else shape
    if min(height, width) < MIN_SIDE:
        return (f"{width}x{height} pixels is not a radiograph (each side must be at least "
                f"{MIN_SIDE} px)")
    if max(height, width) >= MAX_ASPECT * min(height, width):
        return (f"{width}x{height} pixels is not a radiograph of the chest (one side is "
                f"{max(height, width) / min(height, width):.1f} times the other; at most {MAX_ASPECT:g} is read)")
    if not np.isfinite(arr).all():
        return "it holds NaN or infinite pixel values (a float image without a valid range?)"
    return blank_problem(arr)


def blank_problem(arr: np.ndarray) -> str | None:
    """Why an image is blank (one line), or None: one value fills every pixel (all black, all white, one grey:
    an empty export, a failed acquisition, a placeholder). A model scores such an image with
    confident-looking numbers that mean nothing; training (which cannot refuse one) logs it instead.

    A grid of about 64 x 64 pixels is compared first: any real image differs there, so only the blank ones
    pay for the comparison of every pixel."""
    if arr.size == 0:
        return None
    first = arr.flat[0]
    step_rows, step_cols = max(1, arr.shape[0] // 64), max(1, arr.shape[-1] // 64)
    if (arr[::step_rows, ::step_cols] != first).any() or (arr != first).any():
        return None
    return f"every pixel has the value {float(first):.3g} (a blank image: nothing to read)"
