"""A CXR-Phantom ground-truth table read back and joined to a manifest.

`medclr phantom` writes ``phantom_ground_truth.parquet`` beside its MIMIC-CXR-JPG tree (one row per
study: latent class, its probability, the findings); reading that file is a data concern, so it lives
here, and medclr.phantom (which writes it) imports the name from here, never the reverse.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from medclr.errors import MedclrError

GROUND_TRUTH_FILE = "phantom_ground_truth.parquet"


def read_ground_truth(phantom_dir: str | os.PathLike, columns: list[str] | None = None) -> pd.DataFrame:
    """The ground-truth table of a phantom (one row per study); ``columns`` limits what is read."""
    path = Path(phantom_dir) / GROUND_TRUTH_FILE
    if not path.is_file():
        raise MedclrError(f"{path}: not found (is {phantom_dir} a folder written by `medclr phantom`?)")
    return pq.read_table(path, columns=columns).to_pandas()


#: The latent-class columns a phantom's ground truth gives a manifest.
GROUND_TRUTH_COLUMNS = ("latent_class", "latent_class_prob", "latent_class_model_prob")


def attach_ground_truth(manifest: pd.DataFrame, source: str | os.PathLike, *,
                        columns: Sequence[str] = GROUND_TRUTH_COLUMNS, keys: Sequence[str] = ("dicom_id",),
                        require: str = "all") -> pd.DataFrame:
    """``manifest`` (e.g. from read_mimic_cxr_jpg on the phantom) plus the ground-truth ``columns``.

    The one join of a phantom's ground truth, used by ``medclr prepare`` (the defaults), ``medclr lm
    calibrate`` (``medclr.lm.calibrate.attach_ground_truth``) and ``medclr eval``
    (``medclr.evaluation.data.attach_ground_truth``); their differences are the parameters:

    * ``source``: a folder written by ``medclr phantom`` (its ``phantom_ground_truth.parquet``) or
      that table itself;
    * ``columns``: the ground-truth columns to add (all must be in the table); the manifest's own
      columns of those names are replaced;
    * ``keys``: join keys in order of preference; the first one in both tables and non-empty in every
      manifest row is used (compared as strings; a key repeated in the table counts once);
    * ``require``: manifest rows that must find their ground truth: ``"all"`` (else MedclrError),
      ``"any"`` (the others get NaN; MedclrError when none matches) or ``"none"`` (NaN, no check).

    Row order, index and ``attrs`` are kept. Every failure is one MedclrError line."""
    if require not in ("all", "any", "none"):
        raise ValueError(f"require must be 'all', 'any' or 'none', got {require!r}")
    path = Path(source)
    path = path / GROUND_TRUTH_FILE if path.is_dir() else path
    if not path.is_file():
        raise MedclrError(f"{path}: ground-truth table not found (expected a folder written by `medclr phantom` "
                          f"or its {GROUND_TRUTH_FILE})")
    try:
        names = pq.read_schema(path).names
        missing = [c for c in columns if c not in names]
        key = next((k for k in keys if k in names and k in manifest and
                    manifest[k].astype(str).str.len().gt(0).all()), None)
        if missing or key is None:
            gt = None
        else:
            gt = pq.read_table(path, columns=[key, *columns]).to_pandas()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise MedclrError(f"{path}: not a parquet table ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                          ) from None
    if missing:
        raise MedclrError(f"{path}: lacks columns {missing}")
    if key is None:
        raise MedclrError(f"{path}: no {' or '.join(keys)} to join on with the manifest")
    lookup = gt.assign(**{key: gt[key].astype(str)}).drop_duplicates(key).set_index(key)
    ids = manifest[key].astype(str)
    found = ids.isin(lookup.index)
    if require == "all" and not found.all():
        raise MedclrError(f"{int((~found).sum())} manifest rows have a {key} that is not in {path}")
    if require == "any" and not found.any():
        raise MedclrError(f"{path}: no manifest row matched on {key}")
    out = manifest.drop(columns=[c for c in columns if c in manifest])
    for c in columns:
        out[c] = ids.map(lookup[c])
    out.attrs = dict(manifest.attrs)
    return out
