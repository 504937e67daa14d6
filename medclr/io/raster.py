"""PNG / JPEG (8 and 16 bit, grey or colour) -> float32 in [0, 1]."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from skimage.color import rgb2gray

from medclr.errors import ImageReadError
from medclr.io.limits import MAX_PIXELS, check_size


def read_raster_size(path: str | Path) -> tuple[int, int]:
    """(height, width) from the header alone."""
    path = Path(path)
    try:
        with warnings.catch_warnings():
            # a size is all we want here: PIL's bomb warning would be a second line on stderr
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                return img.height, img.width
    except FileNotFoundError:
        raise ImageReadError(f"{path}: file not found") from None
    except Image.DecompressionBombError as exc:  # over twice PIL's limit: PIL refuses to open it at all
        raise ImageReadError(f"{path}: refused as a decompression bomb ({exc})") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise ImageReadError(f"{path}: not a readable PNG/JPEG image ({exc})") from None


def read_raster(path: str | Path, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    path = Path(path)
    try:
        with warnings.catch_warnings():
            # our own size check below replaces PIL's bomb warning with a clear error
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                check_size(path, img.height, img.width, max_pixels)
                img.load()
                img = ImageOps.exif_transpose(img)
                mode = img.mode
                if mode in ("I;16", "I;16B", "I;16L", "I;16N"):
                    arr = np.asarray(img, dtype=np.uint16).astype(np.float32) / 65535.0
                elif mode == "I":
                    raw = np.asarray(img).astype(np.float32)
                    arr = raw / (65535.0 if raw.max() <= 65535 else float(raw.max()))
                elif mode == "F":
                    raw = np.asarray(img, dtype=np.float32)
                    if not np.isfinite(raw).all():  # min/max would be NaN, and the image silently all zero
                        raise ImageReadError(f"{path}: it holds NaN or infinite pixel values (a float image "
                                             "without a valid range?)")
                    lo, hi = float(raw.min()), float(raw.max())
                    arr = (raw - lo) / (hi - lo) if hi > lo else np.zeros_like(raw)
                elif mode in ("L", "1"):
                    arr = np.asarray(img.convert("L"), dtype=np.float32) / 255.0
                else:  # RGB, RGBA, P, LA, CMYK, YCbCr: grey = luminance
                    arr = rgb2gray(np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0).astype(np.float32)
    except ImageReadError:
        raise
    except FileNotFoundError:
        raise ImageReadError(f"{path}: file not found") from None
    except Image.DecompressionBombError as exc:
        raise ImageReadError(f"{path}: refused as a decompression bomb ({exc})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ImageReadError(f"{path}: not a readable PNG/JPEG image ({exc})") from None
    return np.clip(arr, 0.0, 1.0)
