"""One join of a phantom's ground truth (medclr.data.groundtruth.attach_ground_truth) behind its three
callers: `medclr prepare` (defaults), `medclr lm calibrate` and `medclr eval` (issue 16)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medclr.data.groundtruth import GROUND_TRUTH_FILE, attach_ground_truth
from medclr.errors import MedclrError


@pytest.fixture
def phantom_dir(tmp_path):
    gt = pd.DataFrame({"dicom_id": ["d0", "d1", "d2"], "study_id": ["s0", "s1", "s2"], "latent_class": [3, 1, 2],
                       "latent_class_prob": [0.5, 0.25, 0.25], "latent_class_model_prob": [0.4, 0.3, 0.3]})
    gt.to_parquet(tmp_path / GROUND_TRUTH_FILE)
    return tmp_path


def _manifest(ids, studies=None) -> pd.DataFrame:
    df = pd.DataFrame({"dicom_id": ids, "study_id": studies or [""] * len(ids), "latent_class": -1},
                      index=[10 + i for i in range(len(ids))])
    df.attrs["root"] = "/data"
    return df


def test_defaults_join_every_row_and_keep_order_index_attrs(phantom_dir):
    out = attach_ground_truth(_manifest(["d2", "d0"]), phantom_dir)  # the folder or the table itself
    assert out.equals(attach_ground_truth(_manifest(["d2", "d0"]), phantom_dir / GROUND_TRUTH_FILE))
    assert list(out.index) == [10, 11] and out.attrs == {"root": "/data"}
    assert out["latent_class"].tolist() == [2, 3] and out["latent_class"].dtype == np.int64  # replaced
    assert list(out.columns) == ["dicom_id", "study_id", "latent_class", "latent_class_prob", "latent_class_model_prob"]
    with pytest.raises(MedclrError, match="1 manifest rows have a dicom_id"):
        attach_ground_truth(_manifest(["d0", "zz"]), phantom_dir)
    with pytest.raises(MedclrError, match="not found"):
        attach_ground_truth(_manifest(["d0"]), phantom_dir / "missing")
    with pytest.raises(MedclrError, match="lacks columns"):
        attach_ground_truth(_manifest(["d0"]), phantom_dir, columns=("latent_class", "rho"))
    (phantom_dir / "bad.parquet").write_text("not parquet")
    with pytest.raises(MedclrError, match="not a parquet table"):
        attach_ground_truth(_manifest(["d0"]), phantom_dir / "bad.parquet")


def test_lm_calibrate_keys_and_partial_matches(phantom_dir):
    from medclr.lm.calibrate import GROUND_TRUTH_JOIN

    def calibrate_join(manifest, path):
        return attach_ground_truth(manifest, path, **GROUND_TRUTH_JOIN)

    # dicom_id empty in the manifest: study_id is the key; an unmatched row gets NaN
    out = calibrate_join(_manifest(["", ""], ["s1", "s9"]), phantom_dir / GROUND_TRUTH_FILE)
    assert out["latent_class_prob"].tolist()[0] == 0.25 and np.isnan(out["latent_class_prob"].iat[1])
    assert "latent_class_model_prob" not in out
    with pytest.raises(MedclrError, match="no manifest row matched"):
        calibrate_join(_manifest(["x", "y"]), phantom_dir / GROUND_TRUTH_FILE)


def test_eval_joins_when_absent_and_notes_a_broken_table(phantom_dir):
    from medclr.evaluation.data import EvalData, add_latent_classes as eval_join

    df = _manifest(["d1", "zz"]).drop(columns=["latent_class"])
    df.attrs["root"] = str(phantom_dir)
    data = eval_join(EvalData(df, None, "m"))
    assert data.manifest["latent_class"].tolist()[0] == 1 and np.isnan(data.manifest["latent_class"].iat[1])
    assert "latent_class_model_prob" not in data.manifest and "read from" in data.notes[-1]
    assert eval_join(EvalData(data.manifest, None, "m")).notes == []  # already there: untouched
    (phantom_dir / GROUND_TRUTH_FILE).write_text("broken")
    broken = eval_join(EvalData(df, None, "m"))
    assert "latent_class" not in broken.manifest and "no latent-class probe" in broken.notes[-1]
