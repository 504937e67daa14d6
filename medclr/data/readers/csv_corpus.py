"""A researcher's own corpus: a CSV with ``image_path,report[,split,<CheXpert labels>...]``.

Image paths are relative to the CSV's folder (or absolute). Without a ``split``
column, subjects (``subject_id`` if present, else the image path) are assigned
80/10/10 by a seeded hash. ``columns`` maps the CSV's own names onto these
(``{"image_path": "file", "report": "findings_text"}``: `medclr prepare --image-col/--report-col/--split-col`).
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


def read_csv_corpus(path: str | os.PathLike, drop_empty: bool = False, split_seed: int = 0,
                    columns: dict[str, str] | None = None) -> pd.DataFrame:
    path = Path(path)
    names = {"image_path": "image_path", "report": "report", **(columns or {})}  # ours -> the CSV's
    required = (names["image_path"], names["report"]) + ((names["split"],) if "split" in names else ())
    df = read_csv_checked(path, required, "corpus", dtype={names["image_path"]: str, names["report"]: str})
    taken = [ours for ours, theirs in names.items() if theirs != ours and ours in df.columns]
    if taken:
        raise MedclrError(f"{path}: column {taken[0]!r} exists and another column is mapped onto it; map that one too "
                          "or rename it")
    df = df.rename(columns={theirs: ours for ours, theirs in names.items()})
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
