"""Reading radiographs into one convention: float32 H x W in [0, 1], air dark, bone bright.

``read_image`` decides the format from the bytes (the DICM magic) or a .dcm
extension, so a PNG named .dcm or a DICOM without extension still reads, and a
text file named .dcm gets a clear "not a DICOM file".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from medclr.errors import ImageReadError
from medclr.io.device import Jpeg2000Frame, JpegBytes, StoredImage, jpeg_for_device
from medclr.io.dicom import (
    is_dicom,
    read_dicom_header,
    read_dicom_radiograph,
    read_dicom_reduced,
    read_dicom_stored,
    read_dicom_with_caution,
)
from medclr.io.limits import MAX_PIXELS
from medclr.io.raster import read_raster, read_raster_reduced, read_raster_size
from medclr.io.reduced import DecodedImage

DICOM_SUFFIXES = {".dcm", ".dicom", ".dic"}
RASTER_SUFFIXES = {".png", ".jpg", ".jpeg"}
IMAGE_SUFFIXES = DICOM_SUFFIXES | RASTER_SUFFIXES

__all__ = ["read_image", "read_image_reduced", "read_image_for_device", "Jpeg2000Frame", "JpegBytes", "StoredImage",
           "read_header", "read_radiograph", "DecodedImage", "ImageReadError",
           "IMAGE_SUFFIXES", "MAX_PIXELS"]


def _is_dicom_path(path: Path) -> bool:
    return is_dicom(path) or path.suffix.lower() in DICOM_SUFFIXES


def read_image(path: str | Path, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Read a DICOM, PNG or JPEG radiograph as float32 H x W in [0, 1] (air dark, bone bright).

    Raises ``ImageReadError`` (one line naming the file) for missing, corrupt,
    truncated, non-image or oversized files.
    """
    return read_image_with_caution(path, max_pixels)[0]


def read_image_with_caution(path: str | Path, max_pixels: int = MAX_PIXELS) -> tuple[np.ndarray, str]:
    """``read_image`` and the header's one-line caution ("" for rasters, which carry no header), from one
    read of the file: the batch scorer keeps both for every file."""
    path = Path(path)
    if not path.is_file():
        raise ImageReadError(f"{path}: file not found")
    return read_dicom_with_caution(path, max_pixels) if _is_dicom_path(path) else (read_raster(path, max_pixels), "")


def read_image_reduced(path: str | Path, min_side: int | None,
                       max_pixels: int = MAX_PIXELS) -> tuple[DecodedImage, str]:
    """``read_image_with_caution`` decoded at 1/2, 1/4 or 1/8 of the size where the format allows it (JPEG
    files and JPEG DICOM: DCT scaling; JPEG 2000 DICOM: resolution levels) with ``min_side`` pixels or more
    left on the shorter side, else at full size: a :class:`DecodedImage` that knows the original size and
    where its pixels lie (``medclr.io.reduced``). The batch scorer's read: the model needs no more."""
    path = Path(path)
    if not path.is_file():
        raise ImageReadError(f"{path}: file not found")
    if _is_dicom_path(path):
        return read_dicom_reduced(path, min_side, max_pixels)
    return read_raster_reduced(path, min_side, max_pixels), ""


def read_image_for_device(path: str | Path, min_side: int | None, max_pixels: int = MAX_PIXELS,
                          formats: frozenset[str] = frozenset({"dicom", "jpeg"})
                          ) -> tuple[DecodedImage | StoredImage | Jpeg2000Frame | JpegBytes, str]:
    """``read_image_reduced``, except that the kinds of file in ``formats`` that the model's device can finish
    come back undecoded (``medclr.io.device``): "dicom", an uncompressed greyscale integer DICOM as its stored
    values and display table; "jpeg2000", a JPEG 2000 greyscale DICOM with a VOI as its codestream and display
    table; "jpeg", a greyscale JPEG file as its bytes."""
    path = Path(path)
    if not path.is_file():
        raise ImageReadError(f"{path}: file not found")
    if _is_dicom_path(path):
        return read_dicom_stored(path, min_side, max_pixels, formats) if formats & {"dicom", "jpeg2000"} else \
            read_dicom_reduced(path, min_side, max_pixels)
    jpeg = jpeg_for_device(path, max_pixels) if "jpeg" in formats else None
    return (jpeg, "") if jpeg is not None else (read_raster_reduced(path, min_side, max_pixels), "")


def read_header(path: str | Path) -> dict:
    """Format, view, size, pixel spacing (mm, None if absent or invalid); never patient identifiers."""
    path = Path(path)
    if not path.is_file():
        raise ImageReadError(f"{path}: file not found")
    if _is_dicom_path(path):
        return read_dicom_header(path)
    return _raster_header(path, *read_raster_size(path))


def read_radiograph(path: str | Path, max_pixels: int = MAX_PIXELS) -> tuple[np.ndarray, dict]:
    """``read_image`` and ``read_header`` from one read of the file (the app's upload: decoded once)."""
    path = Path(path)
    if not path.is_file():
        raise ImageReadError(f"{path}: file not found")
    if _is_dicom_path(path):
        return read_dicom_radiograph(path, max_pixels)
    image = read_raster(path, max_pixels)
    return image, _raster_header(path, *image.shape)


def _raster_header(path: Path, height: int, width: int) -> dict:
    return {"format": path.suffix.lower().lstrip(".") or "raster", "modality": "", "view": "", "rows": int(height),
            "columns": int(width), "pixel_spacing_mm": None, "photometric": "", "bits_stored": 0, "frames": 1,
            "transfer_syntax": "", "body_part": "", "caution": "", "blanked": []}
