"""Decoding at a reduced size, and where each decoded pixel lies in the original image.

A model reads a chest radiograph at a 224-512 px shorter side; detectors write 2000-3000 px. Two
formats can decode straight to 1/2, 1/4 or 1/8 of the size for a fraction of the work, and
``medclr score`` uses them (``medclr.io.read_image_reduced``):

* **JPEG** (files, and 8-bit greyscale JPEG DICOM): DCT scaling (libjpeg's scaled IDCT, Pillow's
  ``Image.draft``). Decoded pixel k is the mean of original pixels [s k, s (k + 1)) (an 8 x 8 block's DC
  term at 1/8): its footprint starts at 0.
* **JPEG 2000** (DICOM): the codestream's lower resolution levels (OpenJPEG ``reduce``, through Pillow;
  pylibjpeg-openjpeg 2.6 has no such option). Level r holds the wavelet low-pass band, whose sample k
  is centred on original sample s k (s = 2^r; the lifting steps keep the even samples), i.e. on
  coordinate s k + 0.5: a footprint of width s starting at 0.5 - s / 2, half an original pixel
  earlier than a box average for s = 2, 3.5 pixels for s = 8.

The scale is the largest of 8, 4, 2 that leaves at least ``min_side`` decoded pixels on the shorter
side (:func:`reduction`). :class:`DecodedImage` records the original size, the scale and the
footprint's origin, and :meth:`DecodedImage.resample` carries the decoded pixels onto any grid over
the original image by exact box overlap, so the geometry of ``medclr.geometry`` (sizes, crop origin)
is the original image's whatever the scale. Everything else (PNG, uncompressed, RLE, JPEG-LS, JPEG
Lossless, 12-bit JPEG, signed or colour data) decodes at full size (scale 1).
"""

from __future__ import annotations

import struct
import warnings
from dataclasses import dataclass, field
from io import BytesIO

import numpy as np

SCALES = (8, 4, 2)


@dataclass(frozen=True)
class DecodedImage:
    """A radiograph as float32 ``pixels`` in [0, 1] (air dark), decoded at 1/``scale`` of its ``height`` x
    ``width``; decoded pixel k covers original coordinates [origin + s k, origin + s (k + 1)) on each axis
    (pixel i of the original spans [i, i + 1)). ``bits``: the precision of the source samples (8 for
    8-bit JPEG/PNG/DICOM: the input holds no more than 256 levels)."""

    pixels: np.ndarray
    height: int
    width: int
    scale: int = 1
    origin: float = 0.0
    bits: int = 16
    # what a DICOM header says about where the image belongs (``medclr.io.dicom.ARCHIVE_FIELDS``): view position
    # and the study / series / instance UIDs; empty for rasters, which carry no header
    fields: dict = field(default_factory=dict, compare=False)

    @classmethod
    def full(cls, pixels: np.ndarray, bits: int = 16) -> DecodedImage:
        return cls(pixels, int(pixels.shape[0]), int(pixels.shape[1]), 1, 0.0, int(bits))

    def resample(self, height: int, width: int) -> np.ndarray:
        """height x width float32: the mean of the decoded image over each cell of a height x width grid laid
        on the original image (``medclr.geometry.resized_shape`` gives the grid of the resize)."""
        rows = _box_matrix(self._edges(0), height, self.height)
        cols = _box_matrix(self._edges(1), width, self.width)
        return np.ascontiguousarray((cols @ (rows @ self.pixels).T).T, dtype=np.float32)

    def _edges(self, axis: int) -> np.ndarray:
        """Where each decoded pixel's footprint starts and ends along ``axis``, clipped to the image; the first
        and last reach the image's edges (a J2K low-pass sample centred 0.5 px in leaves up to s / 2 - 0.5
        px of the far edge outside every footprint: the last sample stands for it)."""
        n, length = self.pixels.shape[axis], (self.height, self.width)[axis]
        edges = np.clip(self.origin + self.scale * np.arange(n + 1, dtype=np.float64), 0.0, length)
        edges[0], edges[-1] = 0.0, length
        return edges


def _box_matrix(edges: np.ndarray, n_out: int, length: int):
    """Sparse (n_out, n_in) weights: cell j of ``n_out`` equal cells over [0, length) takes footprint k (from
    ``edges[k]`` to ``edges[k + 1]``) in proportion to their overlap. A cell overlaps a handful of footprints,
    so the two products of :meth:`DecodedImage.resample` cost about a millisecond."""
    from scipy.sparse import csr_matrix

    n_in = len(edges) - 1
    cells = np.arange(n_out + 1, dtype=np.float64) * (length / n_out)
    first = np.clip(np.searchsorted(edges, cells[:-1], side="right") - 1, 0, n_in - 1)
    last = np.clip(np.searchsorted(edges, cells[1:], side="left") - 1, first, n_in - 1)
    counts = last - first + 1
    rows = np.repeat(np.arange(n_out), counts)
    cols = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
    overlap = np.minimum(cells[rows + 1], edges[cols + 1]) - np.maximum(cells[rows], edges[cols])
    weights = np.clip(overlap, 0.0, None) / (cells[rows + 1] - cells[rows])
    return csr_matrix((weights.astype(np.float32), (rows, cols)), shape=(n_out, n_in))


def reduction(height: int, width: int, min_side: int | None, max_scale: int = 8) -> int:
    """The largest scale of :data:`SCALES` (at most ``max_scale``) that keeps ``min_side`` decoded pixels on
    the shorter side; 1 when none does or ``min_side`` is None."""
    if not min_side:
        return 1
    return next((s for s in SCALES if s <= max_scale and min(height, width) // s >= min_side), 1)


# ------------------------------------------------------------------------------------------ JPEG
def draft_jpeg(img, min_side: int | None) -> int:
    """Ask Pillow to decode an opened JPEG at the :func:`reduction` scale (before ``load``); returns it.

    An EXIF orientation other than 1 keeps the full size: after the transposition the padded edge of
    the last block would sit at the start of an axis."""
    if img.format != "JPEG" or img.getexif().get(0x0112, 1) not in (None, 1):
        return 1
    width, height = img.size
    scale = reduction(height, width, min_side)
    if scale == 1:
        return 1
    img.draft(img.mode, (width // scale, height // scale))  # Pillow picks the largest scale <= size // request
    if img.size == (width, height):  # Pillow declined (a JPEG of several tiles): decoded whole
        return 1
    if img.size != (-(-width // scale), -(-height // scale)):
        raise ValueError(f"JPEG draft to 1/{scale} of {width} x {height} gave {img.size[0]} x {img.size[1]}")
    return scale


# ------------------------------------------------------------------------------------ JPEG 2000
@dataclass(frozen=True)
class J2KHeader:
    width: int
    height: int
    x0: int
    y0: int
    components: int
    precision: int
    signed: bool
    levels: int


def j2k_header(stream: bytes) -> J2KHeader | None:
    """The SIZ and COD facts of a raw JPEG 2000 codestream (None for anything else, e.g. a JP2 box file)."""
    if stream[:4] != b"\xff\x4f\xff\x51" or len(stream) < 48:
        return None
    xsiz, ysiz, x0, y0 = struct.unpack(">4I", stream[8:24])
    (components,) = struct.unpack(">H", stream[40:42])
    ssiz = stream[42]
    cod = stream.find(b"\xff\x52", 42 + 3 * components)
    if cod < 0 or cod + 10 > len(stream):
        return None
    return J2KHeader(width=xsiz - x0, height=ysiz - y0, x0=x0, y0=y0, components=components,
                     precision=(ssiz & 0x7F) + 1, signed=bool(ssiz & 0x80), levels=stream[cod + 9])


def decode_j2k(stream: bytes, level: int, dtype: np.dtype) -> np.ndarray:
    """Resolution ``level`` (0 = full) of a greyscale unsigned JPEG 2000 codestream as stored values in ``dtype``
    (the container pydicom gives). Pillow widens N-bit samples to 8 or 16 bits; the shift undoes it, as
    pydicom's Pillow plugin does."""
    from PIL import Image

    head = j2k_header(stream)
    with Image.open(BytesIO(stream), formats=["JPEG2000"]) as img:
        if level:
            # OpenJPEG decodes ceil(size / 2^r) pixels; Pillow 12 sizes the image round(size / 2^r), one
            # short when size mod 2^r < 2^(r-1). Give it the size whose rounding is the ceiling.
            p = 1 << level
            img._size = tuple(-(-n // p) * p - p // 2 for n in img.size)
            img.reduce = level
        img.load()
        arr = np.asarray(img)
    container = 8 * arr.dtype.itemsize
    return (arr >> (container - head.precision)).astype(dtype, copy=False)


def j2k_reduced(stream: bytes, rows: int, columns: int, bits_stored: int, dtype: np.dtype,
                min_side: int | None) -> tuple[np.ndarray, int] | None:
    """(stored values, scale) of a greyscale unsigned JPEG 2000 frame decoded at the :func:`reduction` scale,
    or None when this path does not apply (the caller decodes the full frame as before)."""
    head = j2k_header(stream)
    if (head is None or (head.width, head.height, head.x0, head.y0) != (columns, rows, 0, 0)
            or head.components != 1 or head.signed or head.precision != bits_stored or head.precision > 16):
        return None
    scale = reduction(rows, columns, min_side, max_scale=1 << head.levels)
    if scale == 1:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        arr = decode_j2k(stream, scale.bit_length() - 1, dtype)
    if arr.shape != (-(-rows // scale), -(-columns // scale)):
        raise ValueError(f"JPEG 2000 level gave {arr.shape}")
    return arr, scale


def j2k_origin(scale: int) -> float:
    """Where the footprint of low-pass sample 0 starts (module docstring)."""
    return 0.5 - scale / 2
