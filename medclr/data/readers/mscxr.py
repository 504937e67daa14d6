"""MS-CXR phrase-grounding boxes (MS_CXR_Local_Alignment_v1.1.0.csv): one row per box."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from medclr.data.labels import MSCXR_CATEGORIES
from medclr.data.readers.tables import read_csv_checked
from medclr.errors import MedclrError

MSCXR_COLUMNS = ("dicom_id", "category_name", "label_text", "path", "x", "y", "w", "h", "image_width", "image_height")


def read_mscxr(path: str | os.PathLike) -> pd.DataFrame:
    """Validated MS-CXR rows plus ``phrase_id`` (one id per (dicom_id, label_text): a phrase's boxes share it).

    v1.0.0 files (no ``split`` column) get ``split = "test"``.
    """
    path = Path(path)
    df = read_csv_checked(path, MSCXR_COLUMNS, "MS-CXR box file", dtype={"dicom_id": str, "path": str})
    if "split" not in df:
        df["split"] = "test"
    df["split"] = df["split"].fillna("test").replace({"val": "validate"})
    for col in ("x", "y", "w", "h", "image_width", "image_height"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
        if df[col].isna().any():
            row = int(np.flatnonzero(df[col].isna().to_numpy())[0]) + 2
            raise MedclrError(f"{path}: row {row}: column {col!r} is not a number")
    outside = (df.x < 0) | (df.y < 0) | (df.w <= 0) | (df.h <= 0) | (df.x + df.w > df.image_width + 1) | (
        df.y + df.h > df.image_height + 1
    )
    if outside.any():
        row = int(np.flatnonzero(outside.to_numpy())[0]) + 2
        raise MedclrError(f"{path}: row {row}: box lies outside its image ({int(outside.sum())} such rows)")
    unknown = sorted(set(df["category_name"]) - set(MSCXR_CATEGORIES))
    if unknown:
        raise MedclrError(f"{path}: unknown category_name {unknown}; expected one of {list(MSCXR_CATEGORIES)}")
    df["phrase_id"] = df.groupby(["dicom_id", "label_text"], sort=False).ngroup().astype(np.int64)
    return df.reset_index(drop=True)
