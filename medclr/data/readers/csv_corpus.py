"""A researcher's own corpus: a CSV with ``image_path,report[,split,study_id,subject_id,<CheXpert labels>...]``.

Image paths are relative to the CSV's folder (or absolute). ``columns`` maps the CSV's own names onto these
(``{"image_path": "file", "report": "findings_text"}``: `medclr prepare --image-col/--report-col/--split-col/
--study-col/--subject-col`). Studies and subjects: a CSV without a study column gives each row (each image
path) a study of its own, and one without a subject column a subject of its own (the study's, when it has
studies), ids derived from the image path (:func:`row_id`), said in one log line; a blank cell gets the row's
own id too. Without a ``split`` column, subjects are assigned 80/10/10 by a seeded hash (of the subject column
when there is one, else of the image path), so no subject spans two splits.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pandas as pd

from medclr.data.labels import CHEXPERT_LABELS
from medclr.data.manifest import normalise
from medclr.data.readers.common import hash_split, text_fields
from medclr.data.readers.tables import read_csv_checked
from medclr.errors import MedclrError

log = logging.getLogger(__name__)

OPTIONAL = ("split", "study_id", "subject_id")  # read when the CSV has them under these names or is told theirs


def row_id(image_path: str) -> str:
    """The study and subject id of a row whose CSV gives none: ``img-`` and 12 hex digits of the SHA-1 of its
    image path as the CSV writes it (the same row always gets the same id; the same image twice, one id)."""
    return "img-" + hashlib.sha1(str(image_path).encode()).hexdigest()[:12]


def read_csv_corpus(path: str | os.PathLike, drop_empty: bool = False, split_seed: int = 0,
                    columns: dict[str, str] | None = None) -> pd.DataFrame:
    path = Path(path)
    names = {"image_path": "image_path", "report": "report", **(columns or {})}  # ours -> the CSV's
    required = tuple(names[k] for k in ("image_path", "report", *OPTIONAL) if k in names)
    text = {names.get(k, k): str for k in ("image_path", "report", "study_id", "subject_id")}
    df = read_csv_checked(path, required, "corpus", dtype=text)
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
    grouped = _own_ids(df, path)
    if "split" in df:
        df["split"] = df["split"].fillna("train").astype(str).str.lower().replace({"val": "validate", "valid": "validate"})
        spans = df.groupby("subject_id")["split"].nunique()
        if grouped and (spans > 1).any():
            log.warning("%s: %d subjects have rows in more than one split (first: %r): their images are not held out",
                        path, int((spans > 1).sum()), spans.index[spans > 1][0])
    else:  # by subject; a CSV without subjects or studies by image path (each row its own subject)
        df["split"] = [hash_split(k, split_seed) for k in (df["subject_id"] if grouped else df["image_path"])]
    if "dicom_id" not in df:
        df["dicom_id"] = [Path(p).stem for p in df["image_path"]]
    unknown = [c for c in df.columns if c not in CHEXPERT_LABELS and c not in
               ("image_path", "report", "text", "sentences", "split", "subject_id", "study_id", "dicom_id", "view")]
    return normalise(df.drop(columns=unknown))


def _own_ids(df: pd.DataFrame, path: Path) -> bool:
    """Fill ``study_id`` and ``subject_id`` where the CSV gives none (module docstring), said in one log line;
    whether the CSV had either column."""
    own = pd.Series([row_id(p) for p in df["image_path"]], index=df.index)
    had = [c for c in ("study_id", "subject_id") if c in df]
    blank = pd.Series(False, index=df.index)
    for c in had:  # a blank subject takes its study's id (a study is one subject's)
        where = df[c].isna() | (df[c].astype(str).str.strip() == "")
        df[c] = df[c].where(~where, df["study_id"] if c == "subject_id" and "study_id" in had else own)
        blank |= where
    if "study_id" not in df:
        df["study_id"] = own
    if "subject_id" not in df:
        df["subject_id"] = df["study_id"] if "study_id" in had else own
    said = {(): "no study_id or subject_id column (--study-col, --subject-col): each row is a study and a subject "
                "of its own, ids from its image path",
            ("study_id",): "no subject_id column (--subject-col): each study is a subject of its own",
            ("subject_id",): "no study_id column (--study-col): each row is a study of its own, ids from its image "
                             "path"}.get(tuple(had))
    if blank.any():
        said = "; ".join(filter(None, [said, f"{int(blank.sum())} rows with a blank study or subject id get ids of "
                                             "their own"]))
    if said:
        log.info("%s: %s", path, said)
    return bool(had)
