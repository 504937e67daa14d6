"""Streamed writers for the public formats: the MIMIC-CXR-JPG CSVs, MS-CXR boxes, the ground truth.

Rows are written as studies finish (gzip CSVs with a fixed header time, parquet
in row groups), so memory does not grow with the number of studies and the
same inputs give the same bytes.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from medclr.data.groundtruth import GROUND_TRUTH_FILE  # read back by medclr.data
from medclr.data.labels import CHEXPERT_LABELS
from medclr.files import write_text

METADATA_COLUMNS = ("dicom_id", "subject_id", "study_id", "PerformedProcedureStepDescription", "ViewPosition", "Rows",
                    "Columns", "StudyDate", "StudyTime", "ProcedureCodeSequence_CodeMeaning",
                    "ViewCodeSequence_CodeMeaning", "PatientOrientationCodeSequence_CodeMeaning")
SPLIT_COLUMNS = ("dicom_id", "study_id", "subject_id", "split")
CHEXPERT_COLUMNS = ("subject_id", "study_id", *CHEXPERT_LABELS)
MSCXR_COLUMNS = ("dicom_id", "category_name", "label_text", "path", "x", "y", "w", "h", "image_width", "image_height",
                 "split")
MSCXR_FILE = "MS_CXR_Local_Alignment_v1.1.0.csv"

FINDING_TYPE = pa.struct([
    ("name", pa.string()), ("side", pa.string()), ("side_stated", pa.bool_()), ("size", pa.string()),
    ("severity", pa.string()), ("zone", pa.string()), ("kind", pa.string()), ("count", pa.int32()),
    ("rendered", pa.bool_()), ("sentence", pa.string()), ("chexpert", pa.string()), ("mscxr_category", pa.string()),
    ("boxes", pa.list_(pa.list_(pa.int32()))),
])
GROUND_TRUTH_SCHEMA = pa.schema([
    ("dicom_id", pa.string()), ("study_id", pa.string()), ("subject_id", pa.string()), ("split", pa.string()),
    ("source", pa.string()), ("eval_target", pa.string()), ("openi_uid", pa.string()), ("view", pa.string()),
    ("image_path", pa.string()),
    ("report_path", pa.string()), ("latent_class", pa.string()), ("latent_class_prob", pa.float64()),
    ("latent_class_model_prob", pa.float64()), ("latent_class_count", pa.int64()), ("n_findings", pa.int32()),
    ("findings", pa.list_(FINDING_TYPE)), ("ctr", pa.float64()), ("lung_mask", pa.int32()),
    ("acquisition", pa.string()), ("report", pa.string()),
])


class GzipCsv:
    """A CSV written through gzip with mtime 0 and no file name in the header (reproducible bytes)."""

    def __init__(self, path: Path, header):
        self._raw = open(path, "wb")
        self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0, compresslevel=6)
        self._text = io.TextIOWrapper(self._gz, encoding="utf-8", newline="")
        self.writer = csv.writer(self._text, lineterminator="\n")
        self.writer.writerow(header)

    def close(self) -> None:
        self._text.close()
        self._raw.close()


def _label(v: float) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.1f}"


class DatasetWriter:
    """All tabular outputs of one phantom run; ``add(row)`` per study, ``close()`` at the end."""

    def __init__(self, out: Path, row_group: int = 2048):
        self.out = Path(out)
        self.meta = GzipCsv(self.out / "mimic-cxr-2.0.0-metadata.csv.gz", METADATA_COLUMNS)
        self.split = GzipCsv(self.out / "mimic-cxr-2.0.0-split.csv.gz", SPLIT_COLUMNS)
        self.chex = GzipCsv(self.out / "mimic-cxr-2.0.0-chexpert.csv.gz", CHEXPERT_COLUMNS)
        self._mscxr_fh = open(self.out / MSCXR_FILE, "w", encoding="utf-8", newline="")
        self.mscxr = csv.writer(self._mscxr_fh, lineterminator="\n")
        self.mscxr.writerow(MSCXR_COLUMNS)
        self._gt = pq.ParquetWriter(self.out / GROUND_TRUTH_FILE, GROUND_TRUTH_SCHEMA, compression="zstd")
        self._buf: list[dict] = []
        self._row_group = row_group
        self.n = 0
        self.n_boxes = 0

    def add(self, row: dict) -> None:
        m = row["meta"]
        self.meta.writer.writerow([m[c] for c in METADATA_COLUMNS])
        self.split.writer.writerow([row["dicom_id"], row["study_id"], row["subject_id"], row["split"]])
        self.chex.writer.writerow([row["subject_id"], row["study_id"]] + [_label(row["labels"][c]) for c in CHEXPERT_LABELS])
        for r in row["mscxr"]:
            self.mscxr.writerow([r[c] for c in MSCXR_COLUMNS])
            self.n_boxes += 1
        self._buf.append(row["gt"])
        self.n += 1
        if len(self._buf) >= self._row_group:
            self._flush()

    def _flush(self) -> None:
        if self._buf:
            self._gt.write_table(pa.Table.from_pylist(self._buf, schema=GROUND_TRUTH_SCHEMA))
            self._buf = []

    def close(self) -> None:
        self._flush()
        self._gt.close()
        for f in (self.meta, self.split, self.chex):
            f.close()
        self._mscxr_fh.close()


def write_json(path: Path, doc: dict) -> None:
    write_text(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def write_dicom(path: Path, image01, row: dict, seed: int, k: int) -> None:
    """A CR radiograph as real archives hold it: MONOCHROME1, 12 bits stored, synthetic ids only."""
    import numpy as np
    import pydicom
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    cr = "1.2.840.10008.5.1.4.1.1.1"
    uid = lambda tag: generate_uid(entropy_srcs=[str(seed), str(k), row["dicom_id"], tag])  # noqa: E731
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = cr
    meta.MediaStorageSOPInstanceUID = uid("sop")
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.ImplementationClassUID = "1.2.826.0.1.3680043.8.498.1"
    ds = pydicom.Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = cr
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID = uid("study")
    ds.SeriesInstanceUID = uid("series")
    m = row["meta"]
    ds.PatientName = f"PHANTOM^{row['subject_id']}"
    ds.PatientID = row["subject_id"]
    ds.StudyID = row["study_id"][:16]
    ds.AccessionNumber = ""
    ds.StudyDate = str(m["StudyDate"])
    ds.StudyTime = f"{float(m['StudyTime']):013.6f}"
    ds.Modality = "CR"
    ds.BodyPartExamined = "CHEST"
    ds.ViewPosition = m["ViewPosition"]
    ds.PatientOrientation = ["L", "F"] if m["ViewPosition"] == "AP" else ["R", "F"]
    ds.Manufacturer = "medclr CXR-Phantom"
    ds.SeriesDescription = m["PerformedProcedureStepDescription"]
    ds.InstanceNumber = 1
    ds.Rows, ds.Columns = image01.shape
    spacing = round(350.0 / image01.shape[1], 4)
    ds.ImagerPixelSpacing = [spacing, spacing]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME1"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.WindowCenter, ds.WindowWidth = 2048, 4096
    stored = (4095 - np.round(np.clip(image01, 0, 1) * 4095)).astype("<u2")
    ds.PixelData = stored.tobytes()
    ds.save_as(path, enforce_file_format=True)
