"""Issue 46, item 13: a DICOM header string that medclr writes anywhere is reduced to its VR's alphabet by one
function (``medclr.io.codes``): `medclr inspect`, `medclr score`'s view and UID columns, the app's facts line and a
MIMIC manifest's view. A value outside the alphabet (``<SCRIPT>X</SCRIPT>``, ``<b>CR</b>``) is written as "" and
counted or named, never echoed, pydicom's own "Invalid value for VR" lines included.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medclr.cli import main as medclr_main
from medclr.io.codes import code_string, left_blank, uid_string
from tests.conftest_app import app_assets, engine  # noqa: F401 - fixtures
from tests.dicom_factory import make_dicom

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PLANTED = {"Modality": "<b>CR</b>", "ViewPosition": "<SCRIPT>X</SCRIPT>", "BodyPartExamined": "[x](http://e.vil)",
           "StudyInstanceUID": "1.2.3<img>"}
MARKUP = ("<", ">", "SCRIPT", "script", "e.vil", "img")


def _film(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:96, 0:96] / 96
    img = 3000 - 1800 * np.exp(-((xx - 0.5) ** 2 / 0.05 + (yy - 0.5) ** 2 / 0.1)) + rng.normal(0, 40, (96, 96))
    return np.clip(img, 0, 4095).astype(np.uint16)


@pytest.fixture
def planted(tmp_path) -> Path:
    """A folder with a DICOM whose header strings carry markup, and a clean one."""
    folder = tmp_path / "in"
    folder.mkdir()
    make_dicom(folder / "planted.dcm", _film(0), bits_stored=12, **PLANTED)
    make_dicom(folder / "clean.dcm", _film(1), bits_stored=12, ViewPosition="pa", BodyPartExamined="CHEST",
               StudyInstanceUID="1.2.3.4")
    return folder


def test_the_reduction():
    assert [code_string(v) for v in ("PA", " pa ", "AP AXIAL", "LL_DECUB", None, "", "<b>CR</b>", "A" * 17,
                                      "P\\A")] == ["PA", "PA", "AP AXIAL", "LL_DECUB", "", "", "", "", ""]
    assert [uid_string(v) for v in ("1.2.840.10008.1.2.1", "1.2.3<x>", "1.2.3\0", None)] == [
        "1.2.840.10008.1.2.1", "", "1.2.3", ""]
    assert left_blank("<b>CR</b>", "") and not left_blank("", "") and not left_blank("CR", "CR")


def test_inspect_writes_no_planted_string(planted):
    done = subprocess.run([sys.executable, "-m", "medclr", "inspect", str(planted / "planted.dcm")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    header = json.loads(done.stdout)
    assert (header["modality"], header["view"], header["body_part"]) == ("", "", "")
    assert header["blanked"] == ["modality", "body_part", "view"]
    assert "a non-standard value" in header["caution"]
    for text in (done.stdout, done.stderr):
        assert not any(m in text for m in MARKUP), text
    assert done.stderr.strip().splitlines() == [
        "inspect: modality, body_part, view: the header's value is not a DICOM code string or UID; shown as \"\""]


def test_score_writes_no_planted_string_and_counts_the_files(planted, tmp_path, app_assets, caplog):  # noqa: F811
    out = tmp_path / "r.parquet"
    with caplog.at_level(logging.INFO):
        assert medclr_main(["score", "--checkpoint", str(app_assets["checkpoint"]), "--input", str(planted),
                            "--out", str(out), "--workers", "0", "--no-progress"]) == 0
    table = pd.read_parquet(out).set_index("path")
    assert table.loc["planted.dcm", "view"] == "" and table.loc["planted.dcm", "study_uid"] == ""
    assert table.loc["clean.dcm", "view"] == "PA" and table.loc["clean.dcm", "study_uid"] == "1.2.3.4"
    assert not any(m in str(v) for m in MARKUP for v in table.astype(str).to_numpy().ravel())
    assert any("score: 1 file(s) hold a view or UID in their DICOM header that is not" in r.getMessage()
               for r in caplog.records)
    assert not any(m in r.getMessage() for m in MARKUP for r in caplog.records)


def test_the_app_shows_no_planted_string(planted, engine, caplog):  # noqa: F811
    from medclr.app.service import AppService

    service = AppService(engine)
    with caplog.at_level(logging.INFO):
        _, facts = service.preview(str(planted / "planted.dcm"))
        _, clean = service.preview(str(planted / "clean.dcm"))
    assert not any(m in facts for m in MARKUP), facts
    assert "PA" in clean
    assert not any(m in r.getMessage() for m in MARKUP for r in caplog.records)


def test_prepare_mimic_writes_no_planted_view(tmp_path, caplog):
    from tests.test_eval_runner import write_tree

    root, _ = write_tree(tmp_path / "mimic", n_test=4, n_train=0, seed=4, n_categories=2)
    meta_path = root / "mimic-cxr-2.0.0-metadata.csv.gz"
    meta = pd.read_csv(meta_path, dtype=str)
    meta.loc[0, "ViewPosition"] = PLANTED["ViewPosition"]
    meta.loc[1, "ViewPosition"] = "ap"
    meta.to_csv(meta_path, index=False)
    with caplog.at_level(logging.INFO):
        assert medclr_main(["prepare", "--mimic", str(root), "--views", "all", "--out", str(tmp_path / "m.parquet"),
                            "--no-progress"]) == 0
    views = pd.read_parquet(tmp_path / "m.parquet").set_index("dicom_id")["view"]
    assert views[meta.loc[0, "dicom_id"]] == "" and views[meta.loc[1, "dicom_id"]] == "AP"
    assert any("1 ViewPosition value(s) in the metadata are not DICOM code strings" in r.getMessage()
               for r in caplog.records)
