"""PNG / JPEG (8 and 16 bit, grey or colour) -> float32 in [0, 1]."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from medclr.errors import ImageReadError
from medclr.io.limits import MAX_PIXELS, check_size
from medclr.io.reduced import DecodedImage, draft_jpeg


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


def luminance(rgb: np.ndarray) -> np.ndarray:
    """Grey of a float H x W x 3 RGB array: Rec. 709 luma weights (skimage's ``rgb2gray``, in ``rgb``'s dtype)."""
    return rgb @ np.array([0.2125, 0.7154, 0.0721], dtype=rgb.dtype)


def read_raster(path: str | Path, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    return read_raster_reduced(path, None, max_pixels).pixels


def read_raster_reduced(path: str | Path, min_side: int | None, max_pixels: int = MAX_PIXELS) -> DecodedImage:
    """A PNG/JPEG as float32 in [0, 1]; a JPEG decoded at a reduced scale (DCT scaling, ``medclr.io.reduced``)
    when ``min_side`` pixels remain on the shorter side, anything else at full size."""
    path = Path(path)
    try:
        with warnings.catch_warnings():
            # our own size check below replaces PIL's bomb warning with a clear error
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                check_size(path, img.height, img.width, max_pixels)
                height, width = img.height, img.width
                scale = draft_jpeg(img, min_side)
                img.load()
                img = ImageOps.exif_transpose(img)
                if scale == 1:
                    height, width = img.height, img.width
                arr, bits = _grey(path, img)
    except ImageReadError:
        raise
    except FileNotFoundError:
        raise ImageReadError(f"{path}: file not found") from None
    except Image.DecompressionBombError as exc:
        raise ImageReadError(f"{path}: refused as a decompression bomb ({exc})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ImageReadError(f"{path}: not a readable PNG/JPEG image ({exc})") from None
    return DecodedImage(np.clip(arr, 0.0, 1.0), height, width, scale, 0.0, bits)


def _grey(path: Path, img: Image.Image) -> tuple[np.ndarray, int]:
    """(float32 grey in [0, 1] by the file's own scale, bits per sample) of a loaded image."""
    mode = img.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        return np.asarray(img, dtype=np.uint16).astype(np.float32) / 65535.0, 16
    if mode == "I":
        raw = np.asarray(img).astype(np.float32)
        return raw / (65535.0 if raw.max() <= 65535 else float(raw.max())), 32
    if mode == "F":
        raw = np.asarray(img, dtype=np.float32)
        if not np.isfinite(raw).all():  # min/max would be NaN, and the image silently all zero
            raise ImageReadError(f"{path}: it holds NaN or infinite pixel values (a float image "
                                 "without a valid range?)")
        lo, hi = float(raw.min()), float(raw.max())
        return ((raw - lo) / (hi - lo) if hi > lo else np.zeros_like(raw)), 32
    if mode in ("L", "1"):
        return np.asarray(img.convert("L"), dtype=np.float32) / 255.0, 8
    # RGB, RGBA, P, LA, CMYK, YCbCr: grey = luminance
    return luminance(np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0).astype(np.float32), 8
