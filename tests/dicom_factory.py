"""Build small DICOM files with pydicom for tests (real Part 10 bytes, written by pydicom)."""

from __future__ import annotations

import secrets

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import PYDICOM_ROOT_UID, ExplicitVRLittleEndian, SecondaryCaptureImageStorage


def fixed_length_uid() -> str:
    """A unique UID of one length: generate_uid()'s length varies by a digit or two, and the tests that
    rewrite a file in place with the same byte size need every file's size to depend on its pixels only."""
    return f"{PYDICOM_ROOT_UID}1{secrets.randbelow(10**29):029d}"


def make_dicom(path, pixels: np.ndarray, photometric: str = "MONOCHROME2", bits_stored: int | None = None, **tags):
    """Write ``pixels`` (H x W, F x H x W or H x W x 3) as an uncompressed DICOM file."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = fixed_length_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = "CR"
    colour = photometric == "RGB"
    frames = pixels.shape[0] if (pixels.ndim == 3 and not colour) else 1
    ds.Rows, ds.Columns = (pixels.shape[1:3] if frames > 1 else pixels.shape[:2])
    if frames > 1:
        ds.NumberOfFrames = frames
    ds.SamplesPerPixel = 3 if colour else 1
    if colour:
        ds.PlanarConfiguration = 0
    ds.PhotometricInterpretation = photometric
    bits = 8 if pixels.dtype == np.uint8 else 16
    ds.BitsAllocated = bits
    ds.BitsStored = bits_stored or bits
    ds.HighBit = ds.BitsStored - 1
    ds.PixelRepresentation = 1 if np.issubdtype(pixels.dtype, np.signedinteger) else 0
    for key, value in tags.items():
        setattr(ds, key, value)
    ds.PixelData = np.ascontiguousarray(pixels).tobytes()
    ds.save_as(path, enforce_file_format=True)
    return path
