"""MIMIC-CXR-JPG (and its DICOM twin): the files/pXX/pSUBJECT/sSTUDY/ tree plus the three v2.0.0 CSVs.

Reports live beside the study folders as ``sSTUDY.txt`` (from mimic-cxr-reports.zip);
they may sit under another root (``reports_root``). One manifest row per image.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

from medclr.data.labels import CHEXPERT_LABELS
from medclr.data.manifest import normalise
from medclr.data.readers.common import text_fields
from medclr.data.readers.tables import read_csv_checked
from medclr.errors import MedclrError
from medclr.io.codes import code_string, left_blank
from medclr.progress import progress_bar

log = logging.getLogger(__name__)

METADATA_COLUMNS = (
    "dicom_id",
    "subject_id",
    "study_id",
    "PerformedProcedureStepDescription",
    "ViewPosition",
    "Rows",
    "Columns",
    "StudyDate",
    "StudyTime",
    "ProcedureCodeSequence_CodeMeaning",
    "ViewCodeSequence_CodeMeaning",
    "PatientOrientationCodeSequence_CodeMeaning",
)
SPLIT_COLUMNS = ("dicom_id", "study_id", "subject_id", "split")
CHEXPERT_COLUMNS = ("subject_id", "study_id", *CHEXPERT_LABELS)
FRONTAL = ("PA", "AP")


def study_dir(subject_id: str, study_id: str) -> str:
    """files/pXX/pSUBJECT/sSTUDY, relative to the dataset root."""
    return f"files/p{subject_id[:2]}/p{subject_id}/s{study_id}"


def _csv(root: Path, kind: str, required: tuple[str, ...]) -> pd.DataFrame:
    for name in (f"mimic-cxr-2.0.0-{kind}.csv.gz", f"mimic-cxr-2.0.0-{kind}.csv"):
        if (root / name).is_file():
            return read_csv_checked(root / name, required, f"MIMIC-CXR {kind} file", dtype=str)
    raise MedclrError(f"{root}: mimic-cxr-2.0.0-{kind}.csv.gz not found (expected at the dataset root)")


def read_report(path: Path, drop_empty: bool) -> dict | None:
    try:
        report = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise MedclrError(f"{path}: report not found (pass --reports ROOT where files/pXX/.../sSTUDY.txt live)") from None
    fields = text_fields(report)
    if not fields["sentences"]:
        if drop_empty:
            return None
        raise MedclrError(f"{path}: empty report (no findings/impression text); pass --drop-empty to skip such studies")
    return fields


def read_mimic_cxr_jpg(
    root: str | os.PathLike,
    reports_root: str | os.PathLike | None = None,
    views: tuple[str, ...] | None = FRONTAL,
    image_ext: str = "jpg",
    drop_empty: bool = False,
    check_images: bool = True,
    progress: bool | str = "auto",
) -> pd.DataFrame:
    """Read a MIMIC-CXR-JPG root into a manifest (``views=None`` keeps every view; ``progress``: the reports'
    bar, ``medclr.progress``)."""
    root = Path(root)
    if not (root / "files").is_dir():
        raise MedclrError(f"{root}: not a MIMIC-CXR-JPG root (no files/ folder)")
    reports_root = Path(reports_root) if reports_root else root
    meta = _csv(root, "metadata", METADATA_COLUMNS)
    split = _csv(root, "split", SPLIT_COLUMNS)
    labels = _csv(root, "chexpert", CHEXPERT_COLUMNS)
    bad = sorted(set(split["split"]) - {"train", "validate", "test"})
    if bad:
        raise MedclrError(f"{root}: split file has values {bad}; expected train/validate/test")
    df = meta.merge(split[["dicom_id", "split"]], on="dicom_id", how="left")
    df["split"] = df["split"].fillna("train")
    df = df.merge(labels, on=["subject_id", "study_id"], how="left")
    # the DICOM header's ViewPosition, as medclr writes header strings anywhere (medclr.io.codes)
    raw_view = df["ViewPosition"].fillna("")
    df["view"] = raw_view.map(code_string)
    blanked = int(sum(left_blank(r, v) for r, v in zip(raw_view, df["view"])))
    if blanked:
        log.warning("%s: %d ViewPosition value(s) in the metadata are not DICOM code strings; their view is left "
                    "blank", root, blanked)
    if views is not None:
        df = df[df["view"].isin([v.upper() for v in views])]
    df["image_path"] = [f"{study_dir(s, t)}/{d}.{image_ext}" for s, t, d in zip(df.subject_id, df.study_id, df.dicom_id)]
    if check_images:
        exists = [(root / p).is_file() for p in df["image_path"]]
        missing = len(exists) - sum(exists)
        if missing:
            log.warning("%s: %d of %d images listed in the metadata are missing; skipped", root, missing, len(exists))
        df = df[exists]
    texts: dict[tuple[str, str], dict | None] = {}
    for subject, study in progress_bar(sorted(set(zip(df.subject_id, df.study_id))), desc="reports", unit="study",
                                       leave=False, enabled=progress):
        texts[(subject, study)] = read_report(reports_root / f"{study_dir(subject, study)}.txt", drop_empty)
    keep = [texts[(s, t)] is not None for s, t in zip(df.subject_id, df.study_id)]
    df = df[keep].copy()
    for key in ("report", "text", "sentences"):
        df[key] = [texts[(s, t)][key] for s, t in zip(df.subject_id, df.study_id)]
    if df.empty:
        raise MedclrError(f"{root}: no image with a report matched the filters (views={views})")
    df = df.sort_values(["subject_id", "study_id", "dicom_id"], kind="stable")
    columns = ["subject_id", "study_id", "dicom_id", "image_path", "view", "split", "report", "text", "sentences",
               *CHEXPERT_LABELS]
    return normalise(df[columns])
