"""A pydicom decoding plugin for 12-bit JPEG Extended (1.2.840.10008.1.2.4.51) through imagecodecs.

pydicom's own plugins leave 12-bit lossy JPEG to pylibjpeg-libjpeg (GPL-3) alone: Pillow and GDCM
refuse 12-bit precision. imagecodecs (BSD-3-Clause) bundles libjpeg-turbo 3, which decodes 12-bit
JPEG, so medclr registers this module with pydicom's public plugin interface
(``Decoder.add_plugin``; ``medclr.io.dicom`` does it on import). imagecodecs is a dependency; without
it (or with an imagecodecs older than libjpeg-turbo 3) 12-bit files are refused with one line.
Greyscale only: 12-bit colour JPEG has no use in radiographs and is refused with one line.
"""

from __future__ import annotations

from pydicom import uid

LABEL = "medclr-imagecodecs"
# pydicom shows these when the plugin is not available.
DECODER_DEPENDENCIES = {uid.JPEGExtended12Bit: ("imagecodecs>=2024.1.1",)}


def is_available(tsyntax: str) -> bool:
    if tsyntax != uid.JPEGExtended12Bit:
        return False
    try:
        import imagecodecs

        version = imagecodecs.jpeg8_version()  # e.g. "libjpeg_turbo 3.1.3/8.0"
    except (ImportError, AttributeError):
        return False
    name, _, number = version.partition(" ")
    # libjpeg-turbo decodes 12-bit precision from 3.0 on
    return name == "libjpeg_turbo" and number.split(".")[0].isdigit() and int(number.split(".")[0]) >= 3


def decode_frame(src: bytes, runner) -> bytes:
    """One encoded frame -> its samples as little-endian bytes (pydicom's plugin contract)."""
    import imagecodecs

    if runner.samples_per_pixel != 1:
        raise NotImplementedError("12-bit colour JPEG is not supported (greyscale only)")
    arr = imagecodecs.jpeg8_decode(src)
    if arr.shape != (runner.rows, runner.columns):
        raise ValueError(f"the JPEG stream is {arr.shape}, the header says {(runner.rows, runner.columns)}")
    # libjpeg-turbo gives uint8 for 8-bit and uint16 for 12-bit precision: the container follows it.
    runner.set_option("bits_allocated", 8 * arr.dtype.itemsize)
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
