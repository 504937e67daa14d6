"""A corpus of bad (and a few good) radiograph files, generated at test time (issue 17): every class of
file a real archive or a careless export hands to medclr. ``write_corpus(folder)`` writes them and returns
one ``Case`` per file saying what medclr must do with it:

* ``refused``: not scored anywhere; one clear line (containing one of ``needles``) from the app, `medclr
  inspect` and `medclr score` (its errors table);
* ``read``: scored (controls, a multi-frame file: first frame);
* ``caution``: scored, with a one-line caution (OT, a header value that is no valid code string).

Some files carry a fake patient: ``PHI_FILE`` is named after them and holds their name, id and birth date
in its header (and has two frames, so the reader warns naming the file); ``PHI_BROKEN`` is named after
them and cannot be read. ``PHI_STRINGS`` are what must never appear in a reply, log line, output or temp
file (where a command line echoes a path the user gave it, the path itself is the user's).
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from tests.dicom_factory import make_dicom

PATIENT_NAME, PATIENT_ID, BIRTH_DATE = "Quaglino^Ermenegilda", "PID-5550199", "19370412"
PHI_STRINGS = ("Quaglino", "Ermenegilda", "5550199", BIRTH_DATE)
PHI_FILE = "Quaglino_Ermenegilda_PID-5550199_chest.dcm"
PHI_BROKEN = "Quaglino_Ermenegilda_PID-5550199_export.dcm"

NOT_READABLE = ("not a readable", "cannot decode", "not a DICOM", "truncated", "could not be read", "empty",
                "no pixel", "image has no pixels", "cannot read")
TOO_SMALL = ("is not a radiograph (each side must be at least 32 px)",)


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "refused" | "read" | "caution"
    needles: tuple[str, ...] = ()  # a refusal line contains one of these
    what: str = ""

    @property
    def scored_by_walk(self) -> bool:
        """`medclr score` walks DICOM/PNG/JPEG files only (a .tif is never picked up, so never scored)."""
        return not self.name.endswith(".tif")


def _chest(size: int = 256, seed: int = 0) -> np.ndarray:
    """A chest-like 12-bit image: two dark lungs, a brighter mediastinum, noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = 3000 - 1800 * (np.exp(-((xx - 0.3) ** 2 / 0.02 + (yy - 0.5) ** 2 / 0.08))
                         + np.exp(-((xx - 0.7) ** 2 / 0.02 + (yy - 0.5) ** 2 / 0.08)))
    return np.clip(img + rng.normal(0, 40, img.shape), 0, 4095).astype(np.uint16)


def _png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _png_bomb(path: Path, side: int = 10_000, rows: int | None = None) -> None:
    """A greyscale PNG of side x side zero pixels, streamed (≈100 kB on disk, 100 Mpx decoded); with
    ``rows``, only that many rows of data follow the header (a bomb that only its header describes)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    comp, row = zlib.compressobj(9), b"\0" * (side + 1)
    body = b"".join(comp.compress(row) for _ in range(side if rows is None else rows)) + comp.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", body) + chunk(b"IEND", b""))


def _float_tiff(path: Path, bad: float) -> None:
    arr = np.linspace(0, 1000, 64 * 64, dtype=np.float32).reshape(64, 64)
    arr[10:20, 10:20] = bad
    Image.fromarray(arr, mode="F").save(path, format="TIFF")


def write_corpus(folder: Path) -> list[Case]:
    """Write every corpus file into ``folder`` (made if missing); returns the cases, one per file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cases: list[Case] = []

    def add(name: str, kind: str, needles=(), what: str = "") -> Path:
        cases.append(Case(name, kind, tuple(needles), what))
        return folder / name

    # controls: real images medclr must score
    chest = _chest()
    add("control.png", "read", what="an 8-bit chest-like PNG").write_bytes(_png_bytes((chest >> 4).astype(np.uint8)))
    make_dicom(add("control.dcm", "read", what="a 12-bit CR DICOM"), chest, bits_stored=12)
    # empty, truncated, corrupt, not an image
    add("empty.dcm", "refused", NOT_READABLE, "0 bytes").write_bytes(b"")
    add("empty.png", "refused", NOT_READABLE, "0 bytes").write_bytes(b"")
    full = make_dicom(folder / "_full.dcm", chest, bits_stored=12).read_bytes()
    (folder / "_full.dcm").unlink()
    add("truncated.dcm", "refused", NOT_READABLE, "a DICOM cut in half").write_bytes(full[: len(full) // 2])
    png = _png_bytes(np.random.default_rng(1).integers(0, 255, (256, 256), dtype=np.uint8))
    add("truncated.png", "refused", NOT_READABLE, "a PNG cut in half").write_bytes(png[: len(png) // 2])
    jpg = io.BytesIO()
    Image.fromarray((chest >> 4).astype(np.uint8)).save(jpg, format="JPEG", quality=90)
    add("truncated.jpg", "refused", NOT_READABLE, "a JPEG cut in half").write_bytes(jpg.getvalue()[: 600])
    add("corrupt.dcm", "refused", NOT_READABLE, "DICM magic, then garbage").write_bytes(
        b"\0" * 128 + b"DICM" + np.random.default_rng(2).bytes(4000))
    add("corrupt.png", "refused", NOT_READABLE, "PNG signature, then garbage").write_bytes(
        b"\x89PNG\r\n\x1a\n" + np.random.default_rng(3).bytes(4000))
    add("notes.png", "refused", NOT_READABLE, "a text file named .png").write_text("Findings: none.\n" * 20)
    add("notes.dcm", "refused", NOT_READABLE, "a text file named .dcm").write_text("Findings: none.\n" * 20)
    add("document.jpg", "refused", NOT_READABLE, "a PDF named .jpg").write_bytes(
        b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj << /Type /Catalog >> endobj\ntrailer << >>\n%%EOF\n")
    # pixel values without a valid range
    _float_tiff(add("nan_float.tif", "refused", ("NaN or infinite",), "a float32 TIFF holding NaN"), np.nan)
    _float_tiff(add("inf_float_tiff.png", "refused", ("NaN or infinite",), "a float32 TIFF holding inf, named .png"),
                np.inf)
    # absurd sizes
    for w, h in ((1, 1), (2, 2), (1, 500), (16384, 3)):
        tiny = np.full((h, w), 128, np.uint8)
        add(f"{w}x{h}.png", "refused", TOO_SMALL, f"{w} x {h} px").write_bytes(_png_bytes(tiny))
    _png_bomb(add("bomb.png", "refused", ("over the limit",), "10,000 x 10,000 zero PNG (~100 kB, 100 Mpx)"))
    _png_bomb(add("bomb_header.png", "refused", ("over the limit", "decompression bomb"),
                  "a PNG whose header claims 60,000 x 60,000 px (3.6 Gpx; PIL refuses to open it)"), 60_000, rows=8)
    # DICOM that is no chest radiograph, or odd
    make_dicom(add("ultrasound.dcm", "refused", ("modality US",), "Modality US"), chest, bits_stored=12, Modality="US")
    make_dicom(add("secondary_capture.dcm", "caution", ("modality OT",), "Modality OT"), chest, bits_stored=12,
               Modality="OT")
    make_dicom(add("multiframe.dcm", "read", what="two frames (the first is read)"), np.stack([chest, chest[::-1]]),
               bits_stored=12)
    make_dicom(add("no_pixels.dcm", "refused", NOT_READABLE, "a DICOM without Pixel Data"), chest, bits_stored=12)
    _drop_pixel_data(folder / "no_pixels.dcm")
    # a crafted header: HTML and a Markdown link where code strings belong
    crafted = add("crafted_header.dcm", "caution", ("non-standard value",), "HTML / Markdown in Modality, ViewPosition")
    make_dicom(crafted, chest, bits_stored=12)
    _craft(crafted)
    # a fake patient: named after them, their name, id and birth date in the header, two frames (the
    # reader warns naming the file); and a broken file named after them
    make_dicom(add(PHI_FILE, "read", what="fake patient in file name and header, two frames"),
               np.stack([chest, chest]), bits_stored=12, PatientName=PATIENT_NAME, PatientID=PATIENT_ID,
               PatientBirthDate=BIRTH_DATE, InstitutionName="Ermenegilda Quaglino Clinic")
    add(PHI_BROKEN, "refused", NOT_READABLE, "fake patient's name on a truncated file").write_bytes(
        (folder / PHI_FILE).read_bytes()[:3000])
    return cases


def _drop_pixel_data(path: Path) -> None:
    import pydicom

    ds = pydicom.dcmread(path)
    del ds.PixelData
    ds.save_as(path)


def _craft(path: Path) -> None:
    import warnings

    import pydicom

    ds = pydicom.dcmread(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom warns that these are not valid code strings: that is the point
        ds.Modality = 'CR <img src="http://host/x.png">'
        ds.ViewPosition = "[PA](http://host/)"
        ds.BodyPartExamined = "<script>alert(1)</script>"
    ds.save_as(path)
