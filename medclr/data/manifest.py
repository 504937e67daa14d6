"""The manifest: one row per image-report pair, the file every later step reads.

Columns (docs/ARCHITECTURE.md section 2): ``index`` (int64, dense 0..n-1), ``subject_id``,
``study_id``, ``dicom_id``, ``image_path`` (relative to the root stored in the
parquet metadata, empty when the row has no image), ``view``, ``split``
(train/validate/test), ``report`` (full text), ``text`` (the section(s) used),
``sentences`` (list of str) and the 14 CheXpert label columns (1/0/-1/NaN).
A phantom manifest adds ``latent_class`` and ``latent_class_prob``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from medclr.data.labels import CHEXPERT_LABELS
from medclr.errors import MedclrError
from medclr.files import atomic_path

BASE_COLUMNS: tuple[str, ...] = (
    "index",
    "subject_id",
    "study_id",
    "dicom_id",
    "image_path",
    "view",
    "split",
    "report",
    "text",
    "sentences",
)
SPLITS = ("train", "validate", "test")
_META_KEY = b"medclr"


def normalise(df: pd.DataFrame) -> pd.DataFrame:
    """Return ``df`` with every manifest column present, typed, and a dense ``index``."""
    out = df.copy()
    for col in ("subject_id", "study_id", "dicom_id", "image_path", "view", "split", "report", "text"):
        if col not in out:
            out[col] = ""
        out[col] = out[col].fillna("").astype(str)
    if "sentences" not in out:
        out["sentences"] = [[] for _ in range(len(out))]
    out["sentences"] = [list(s) if s is not None else [] for s in out["sentences"]]
    for label in CHEXPERT_LABELS:
        if label not in out:
            out[label] = np.nan
        out[label] = pd.to_numeric(out[label], errors="coerce").astype("float32")
    bad = sorted(set(out["split"]) - set(SPLITS) - {""})
    if bad:
        raise MedclrError(f"manifest column 'split' has values {bad}; expected one of {list(SPLITS)}")
    out = out.reset_index(drop=True)
    out["index"] = np.arange(len(out), dtype=np.int64)
    extra = [c for c in out.columns if c not in BASE_COLUMNS and c not in CHEXPERT_LABELS]
    return out[list(BASE_COLUMNS) + list(CHEXPERT_LABELS) + extra]


def write_manifest(df: pd.DataFrame, path: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """Write a manifest atomically; ``root`` (the directory image paths are relative to) goes into the metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(normalise(df), preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[_META_KEY] = json.dumps({"root": str(Path(root).resolve()) if root else "", "version": 1}).encode()
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def read_manifest(path: str | os.PathLike) -> pd.DataFrame:
    """Read a manifest; ``df.attrs["root"]`` holds the image root ('' when none)."""
    path = Path(path)
    if not path.is_file():
        raise MedclrError(f"{path}: manifest not found (make one with `medclr prepare` or `medclr phantom`)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise MedclrError(f"{path}: not a parquet manifest ({exc})") from None
    missing = [c for c in BASE_COLUMNS if c not in table.column_names]
    if missing:
        raise MedclrError(f"{path}: manifest lacks columns {missing}")
    meta = json.loads((table.schema.metadata or {}).get(_META_KEY, b"{}"))
    df = table.to_pandas()
    df["sentences"] = [list(s) if s is not None else [] for s in df["sentences"]]
    df.attrs["root"] = meta.get("root", "")
    return df


def image_abspath(df: pd.DataFrame, row_index: int) -> Path:
    """Absolute path of the image of row ``row_index`` (image paths are relative to the manifest root)."""
    return Path(df.attrs.get("root", "")) / df["image_path"].iat[row_index]


def sentence_table(df: pd.DataFrame, split: str | None = None) -> pd.DataFrame:
    """One row per (manifest row, sentence): ``index``, ``position``, ``sentence``, ``hash``."""
    from medclr.data.text import sentence_hash

    rows = df if split is None else df[df["split"] == split]
    records = [
        (int(i), pos, s, sentence_hash(s)) for i, sents in zip(rows["index"], rows["sentences"]) for pos, s in enumerate(sents)
    ]
    return pd.DataFrame(records, columns=["index", "position", "sentence", "hash"])
