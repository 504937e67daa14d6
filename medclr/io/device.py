"""What a file hands over when the model's device finishes its decode (``medclr score`` on a GPU).

Three kinds of file leave most of their per-pixel work to the device (``medclr.inference.device_decode``):

* an uncompressed greyscale DICOM of 8- or 16-bit integers: its stored values as they are in the file
  (:class:`StoredImage`), with the display pipeline as a table over every possible value
  (``medclr.io.dicom.display_table``: Modality LUT, VOI LUT or window, MONOCHROME1 / INVERSE inversion), so
  the device looks every pixel up in the table, the exact numbers ``read_image`` gives;
* a baseline or progressive greyscale JPEG file (:class:`JpegBytes`): the file's bytes, decoded there (nvJPEG
  through ``torchvision.io.decode_jpeg``);
* a JPEG 2000 greyscale DICOM of unsigned 8- or 16-bit values with a VOI (window or VOI LUT)
  (:class:`Jpeg2000Frame`): its codestream, decoded there (nvImageCodec: nvJPEG2000 on a GPU), with the display
  table, which a VOI makes independent of the pixels (without one the range is the image's own min-max).

The checks (size limits, modality, the header's caution) are the ones of the CPU readers, made here on the
header; anything else (PNG, other compressed or colour DICOM, a JPEG Pillow reads as colour or with an
EXIF rotation) decodes on the CPU as before.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from medclr.io.limits import MAX_PIXELS, check_size

# An EXIF orientation other than 1 rotates the image (the CPU reader applies it; the device decoder does not).
_EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class StoredImage:
    """A DICOM's stored values as unsigned codes (H x W uint8/uint16) and the float32 display value of every
    code: ``table[codes]`` is ``read_image``'s image."""

    codes: np.ndarray
    table: np.ndarray
    bits: int = 16
    fields: dict = field(default_factory=dict, compare=False)

    @property
    def height(self) -> int:
        return int(self.codes.shape[0])

    @property
    def width(self) -> int:
        return int(self.codes.shape[1])


@dataclass(frozen=True)
class JpegBytes:
    """A greyscale JPEG file's bytes and its size from the header."""

    data: np.ndarray  # uint8
    height: int
    width: int
    bits: int = 8
    fields: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Jpeg2000Frame:
    """A JPEG 2000 DICOM's first-frame codestream and the float32 display value of every code its decode gives:
    ``table[decode(data)]`` is ``read_image``'s image."""

    data: np.ndarray  # uint8
    table: np.ndarray
    height: int
    width: int
    bits: int = 16
    fields: dict = field(default_factory=dict, compare=False)


def jpeg_for_device(path: str | Path, max_pixels: int = MAX_PIXELS) -> JpegBytes | None:
    """The file as :class:`JpegBytes` when it is a greyscale 8-bit JPEG without an EXIF rotation and within
    the size limits; None for anything the CPU reader should decode (a damaged or oversized file included,
    so that its error is the CPU reader's)."""
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path, formats=["JPEG"]) as img:
                if img.mode != "L" or img.getexif().get(_EXIF_ORIENTATION, 1) != 1:
                    return None
                check_size(path, img.height, img.width, max_pixels)
                height, width = img.height, img.width
        return JpegBytes(np.fromfile(path, dtype=np.uint8), height, width)
    except Exception:  # noqa: BLE001 - the CPU reader reads it again and says what is wrong in its own words
        return None
