"""A researcher's own corpus: a CSV with ``image_path,report[,split,<CheXpert labels>...]``.

Image paths are relative to the CSV's folder (or absolute). Without a ``split``
column, subjects (``subject_id`` if present, else the image path) are assigned
80/10/10 by a seeded hash.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from medclr.data.labels import CHEXPERT_LABELS
from medclr.data.manifest import normalise
from medclr.data.readers.common import hash_split, text_fields
from medclr.data.readers.tables import read_csv_checked
from medclr.errors import MedclrError


def read_csv_corpus(path: str | os.PathLike, drop_empty: bool = False, split_seed: int = 0) -> pd.DataFrame:
    path = Path(path)
    df = read_csv_checked(path, ("image_path", "report"), "corpus", dtype={"image_path": str, "report": str})
    df["report"] = df["report"].fillna("")
    fields = [text_fields(r) for r in df["report"]]
    empty = [i for i, f in enumerate(fields) if not f["sentences"]]
    if empty and not drop_empty:
        raise MedclrError(
            f"{path}: row {empty[0] + 2} has an empty report ({len(empty)} such rows); pass --drop-empty to skip them"
        )
    for key in ("report", "text", "sentences"):
        df[key] = [f[key] for f in fields]
    df = df.drop(index=df.index[empty])
    if "split" in df:
        df["split"] = df["split"].fillna("train").astype(str).str.lower().replace({"val": "validate", "valid": "validate"})
    else:
        keys = df["subject_id"].astype(str) if "subject_id" in df else df["image_path"]
        df["split"] = [hash_split(k, split_seed) for k in keys]
    if "dicom_id" not in df:
        df["dicom_id"] = [Path(p).stem for p in df["image_path"]]
    unknown = [c for c in df.columns if c not in CHEXPERT_LABELS and c not in
               ("image_path", "report", "text", "sentences", "split", "subject_id", "study_id", "dicom_id", "view")]
    return normalise(df.drop(columns=unknown))
