"""Reading a phantom's ground truth back, joining it to manifests, and the false-negative rates it implies."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from medclr.errors import MedclrError
from medclr.phantom.writer import GROUND_TRUTH_FILE


def read_ground_truth(phantom_dir: str | os.PathLike, columns: list[str] | None = None) -> pd.DataFrame:
    """The ground-truth table of a phantom (one row per study); ``columns`` limits what is read."""
    path = Path(phantom_dir) / GROUND_TRUTH_FILE
    if not path.is_file():
        raise MedclrError(f"{path}: not found (is {phantom_dir} a folder written by `medclr phantom`?)")
    return pq.read_table(path, columns=columns).to_pandas()


def attach_ground_truth(manifest: pd.DataFrame, phantom_dir: str | os.PathLike) -> pd.DataFrame:
    """``manifest`` (e.g. from read_mimic_cxr_jpg on the phantom) plus ``latent_class`` and
    ``latent_class_prob`` (and ``latent_class_model_prob``), joined on ``dicom_id``; order and attrs kept."""
    gt = read_ground_truth(phantom_dir, ["dicom_id", "latent_class", "latent_class_prob", "latent_class_model_prob"])
    if "dicom_id" not in manifest:
        raise MedclrError("manifest has no 'dicom_id' column to join the phantom ground truth on")
    base = manifest.drop(columns=[c for c in gt.columns if c != "dicom_id" and c in manifest], errors="ignore")
    out = base.merge(gt, on="dicom_id", how="left", validate="many_to_one")
    missing = int(out["latent_class"].isna().sum())
    if missing:
        raise MedclrError(f"{missing} manifest rows have a dicom_id that is not in {phantom_dir}'s ground truth")
    out.index = manifest.index
    out.attrs = dict(manifest.attrs)
    return out


def false_negative_rates(prob: np.ndarray, batch: int = 64) -> dict[str, np.ndarray]:
    """False negatives a random batch brings to a sample whose class has probability ``prob``.

    With the other B-1 batch members drawn independently from the data set:
    ``p_any`` = P(at least one of them shares the sample's latent class) = 1 - (1 - p)^(B-1);
    ``fraction`` = expected fraction of the B-1 negatives that share it = p;
    ``expected`` = expected number of such false negatives = (B-1) p.
    """
    p = np.clip(np.asarray(prob, dtype=np.float64), 0.0, 1.0)
    return {"p_any": 1.0 - (1.0 - p) ** (batch - 1), "fraction": p, "expected": (batch - 1) * p}
