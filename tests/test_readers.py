"""Readers -> manifest: a MIMIC-CXR-JPG-layout tree built here, a CSV corpus, MS-CXR boxes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from medclr.data.labels import CHEXPERT_LABELS
from medclr.data.manifest import read_manifest, sentence_table, write_manifest
from medclr.data.readers.csv_corpus import read_csv_corpus
from medclr.data.readers.mimic import METADATA_COLUMNS, read_mimic_cxr_jpg
from medclr.data.readers.mscxr import read_mscxr
from medclr.errors import MedclrError

# subject, study, dicom, view, split, Cardiomegaly, Pleural Effusion
STUDIES = [
    ("10000032", "50414267", "02aa804e-bde0afdd-112c0b34-7bc16630-4e384014", "PA", "train", 1.0, None),
    ("10000032", "50414267", "174413ec-4ec4c1f7-34ea26b7-c5f994f8-79ef1962", "LATERAL", "train", 1.0, None),
    ("10000764", "57375967", "096052b7-d256dc40-453a102b-fa7d01c6-1b22c6b4", "AP", "validate", 0.0, -1.0),
    ("10000898", "50771383", "2a280266-c8bae121-54d75383-cac046f4-ca37aa16", "PA", "test", None, 1.0),
]


def write_mimic_tree(root, reports: dict | None = None):
    meta, split, labels = [], [], {}
    for subject, study, dicom, view, sp, cardio, effusion in STUDIES:
        folder = root / "files" / f"p{subject[:2]}" / f"p{subject}" / f"s{study}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((32, 32), 128, np.uint8)).save(folder / f"{dicom}.jpg")
        text = (reports or {}).get(study, f" FINDINGS: Study {study} heart is enlarged.\n IMPRESSION: No effusion.\n")
        (folder.parent / f"s{study}.txt").write_text(text)
        meta.append({c: "" for c in METADATA_COLUMNS} | {"dicom_id": dicom, "subject_id": subject, "study_id": study,
                                                         "ViewPosition": view, "Rows": 32, "Columns": 32})
        split.append({"dicom_id": dicom, "study_id": study, "subject_id": subject, "split": sp})
        labels[(subject, study)] = {"subject_id": subject, "study_id": study, "Cardiomegaly": cardio,
                                    "Pleural Effusion": effusion}
    pd.DataFrame(meta).to_csv(root / "mimic-cxr-2.0.0-metadata.csv.gz", index=False)
    pd.DataFrame(split).to_csv(root / "mimic-cxr-2.0.0-split.csv.gz", index=False)
    pd.DataFrame(list(labels.values()), columns=["subject_id", "study_id", *CHEXPERT_LABELS]).to_csv(
        root / "mimic-cxr-2.0.0-chexpert.csv.gz", index=False)
    return root


def test_mimic_tree_reads_with_splits_labels_and_text(tmp_path):
    root = write_mimic_tree(tmp_path)
    df = read_mimic_cxr_jpg(root)  # frontal views by default
    assert list(df["view"]) == ["PA", "AP", "PA"]
    assert list(df["split"]) == ["train", "validate", "test"]
    assert list(df["index"]) == [0, 1, 2]
    assert df["Cardiomegaly"].tolist()[:2] == [1.0, 0.0] and np.isnan(df["Cardiomegaly"].iat[2])
    assert df["Pleural Effusion"].iat[1] == -1.0 and df["Pleural Effusion"].iat[2] == 1.0
    assert df["sentences"].iat[0] == ["Study 50414267 heart is enlarged.", "No effusion."]
    assert all((root / p).is_file() for p in df["image_path"])
    assert len(read_mimic_cxr_jpg(root, views=None)) == 4

    out = write_manifest(df, tmp_path / "m.parquet", root)
    back = read_manifest(out)
    assert back.attrs["root"] == str(root.resolve())
    pd.testing.assert_frame_equal(back.drop(columns="sentences"), df.drop(columns="sentences"), check_dtype=False)
    table = sentence_table(back, split="train")
    assert list(table["index"]) == [0, 0] and list(table["position"]) == [0, 1]


def test_mimic_empty_report_is_one_clear_error(tmp_path):
    root = write_mimic_tree(tmp_path, reports={"57375967": " FINAL REPORT\n"})
    with pytest.raises(MedclrError, match="s57375967.txt: empty report"):
        read_mimic_cxr_jpg(root)
    assert len(read_mimic_cxr_jpg(root, drop_empty=True)) == 2


def test_mimic_bad_split_value(tmp_path):
    root = write_mimic_tree(tmp_path)
    split = pd.read_csv(root / "mimic-cxr-2.0.0-split.csv.gz")
    split.loc[0, "split"] = "val"
    split.to_csv(root / "mimic-cxr-2.0.0-split.csv.gz", index=False)
    with pytest.raises(MedclrError, match="'val'"):
        read_mimic_cxr_jpg(root)


def test_csv_corpus(tmp_path):
    pd.DataFrame({"image_path": ["a.png", "b.png", "c.png"], "report": ["Heart is big. No effusion.", "Clear lungs.", ""],
                  "Cardiomegaly": [1, 0, 0], "site": ["x", "y", "z"]}).to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(MedclrError, match="row 4 has an empty report"):
        read_csv_corpus(tmp_path / "c.csv")
    df = read_csv_corpus(tmp_path / "c.csv", drop_empty=True)
    assert len(df) == 2 and df["sentences"].iat[0] == ["Heart is big.", "No effusion."]
    assert df["Cardiomegaly"].tolist() == [1.0, 0.0] and "site" not in df
    assert set(df["split"]) <= {"train", "validate", "test"}


def test_csv_corpus_with_its_own_column_names(tmp_path, capsys):
    """--image-col / --report-col / --split-col map a CSV's own names; a missing one is named in one line."""
    from medclr.cli import main
    from medclr.data.manifest import read_manifest

    pd.DataFrame({"file": ["a.png", "b.png"], "findings_text": ["Small left effusion.", "Clear lungs."],
                  "fold": ["train", "TEST"]}).to_csv(tmp_path / "export.csv", index=False)
    argv = ["prepare", "--csv", str(tmp_path / "export.csv"), "--out", str(tmp_path / "m.parquet")]
    assert main(argv) == 1 and "lacks column(s) ['image_path', 'report']" in capsys.readouterr().err
    assert main([*argv, "--image-col", "file", "--report-col", "findings_text", "--split-col", "fold"]) == 0
    df = read_manifest(tmp_path / "m.parquet")
    assert df["image_path"].tolist() == ["a.png", "b.png"] and df["split"].tolist() == ["train", "test"]
    assert df["sentences"].iat[0] == ["Small left effusion."]
    assert main([*argv, "--image-col", "nope"]) == 1 and "'nope'" in capsys.readouterr().err


def test_csv_corpus_studies_and_subjects(tmp_path, capsys, caplog):
    """--study-col / --subject-col (default study_id / subject_id when present) through `medclr prepare --csv`;
    without them each row is a study and a subject of its own (ids from its image path, one log line), so the
    data-quality summary finds no "study with two reports" and every hashed split keeps subjects apart."""
    import hashlib
    import logging

    from medclr.cli import main
    from medclr.data.quality import data_quality
    from medclr.data.readers.common import hash_split
    from medclr.data.readers.csv_corpus import row_id

    reports = ["Small left effusion.", "Clear lungs.", "Heart is enlarged.", "No pneumothorax."]
    paths = [f"img/{k:02d}.png" for k in range(40)]
    plain = pd.DataFrame({"image_path": paths, "report": [reports[k % 4] for k in range(40)]})
    plain.to_csv(tmp_path / "plain.csv", index=False)
    out = tmp_path / "m.parquet"
    with caplog.at_level(logging.INFO, logger="medclr.data.readers.csv_corpus"):
        assert main(["prepare", "--csv", str(tmp_path / "plain.csv"), "--out", str(out)]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "medclr.data.readers.csv_corpus"]
    assert len(said) == 1 and "no study_id or subject_id column" in said[0] and "of its own" in said[0]
    df = read_manifest(out)
    assert df["study_id"].tolist() == [row_id(p) for p in paths] == df["subject_id"].tolist()
    assert df["study_id"].nunique() == 40 and df["study_id"].iat[0] == "img-" + hashlib.sha1(b"img/00.png").hexdigest()[:12]
    assert df["split"].tolist() == [hash_split(p) for p in paths]  # the split of a CSV without ids is unchanged
    assert data_quality(df)["study_with_two_reports"] == 0
    assert main(["prepare", "--csv", str(tmp_path / "plain.csv"), "--out", str(tmp_path / "again.parquet")]) == 0
    assert read_manifest(tmp_path / "again.parquet")["study_id"].tolist() == df["study_id"].tolist()  # deterministic

    # a hospital export's own names: 8 patients, 20 studies, 40 images (two per study), no split column
    own = plain.assign(accession=[f"A{k // 2:03d}" for k in range(40)], patient=[f"P{k // 5}" for k in range(40)])
    own.loc[3, "accession"] = None  # a blank study id: the row's own
    own.to_csv(tmp_path / "own.csv", index=False)
    caplog.clear()
    argv = ["prepare", "--csv", str(tmp_path / "own.csv"), "--out", str(out)]
    with caplog.at_level(logging.INFO, logger="medclr.data.readers.csv_corpus"):
        assert main([*argv, "--study-col", "accession", "--subject-col", "patient"]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "medclr.data.readers.csv_corpus"]
    assert len(said) == 1 and "1 rows with a blank study or subject id" in said[0]
    df = read_manifest(out)
    assert df["study_id"].tolist() == [row_id(p) if k == 3 else f"A{k // 2:03d}" for k, p in enumerate(paths)]
    assert df["subject_id"].tolist() == [f"P{k // 5}" for k in range(40)]
    assert df.groupby("subject_id")["split"].nunique().max() == 1  # no patient in two splits
    assert df["split"].tolist() == [hash_split(f"P{k // 5}") for k in range(40)]
    capsys.readouterr()
    assert main([*argv, "--study-col", "nope"]) == 1 and "'nope'" in capsys.readouterr().err
    own.assign(fold=["train"] * 3 + ["test"] * 37).to_csv(tmp_path / "folds.csv", index=False)  # P0 in two splits
    caplog.clear()
    assert main(["prepare", "--csv", str(tmp_path / "folds.csv"), "--out", str(out), "--split-col", "fold",
                 "--subject-col", "patient"]) == 0
    assert any("1 subjects have rows in more than one split (first: 'P0')" in r.getMessage() for r in caplog.records)

    # columns named study_id (and no subject column): read by default; each study is its own subject
    plain.assign(study_id=[f"{k // 2}" for k in range(40)]).to_csv(tmp_path / "studies.csv", index=False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="medclr.data.readers.csv_corpus"):
        assert main(["prepare", "--csv", str(tmp_path / "studies.csv"), "--out", str(out)]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "medclr.data.readers.csv_corpus"]
    assert len(said) == 1 and "no subject_id column (--subject-col): each study is a subject of its own" in said[0]
    df = read_manifest(out)
    assert df["study_id"].tolist() == [f"{k // 2}" for k in range(40)] == df["subject_id"].tolist()
    assert df.groupby("study_id")["split"].nunique().max() == 1  # a study's two images stay together


def test_mscxr(tmp_path):
    rows = pd.DataFrame({"dicom_id": ["a", "a", "b"], "category_name": ["Pneumonia", "Pneumonia", "Cardiomegaly"],
                         "label_text": ["left opacity", "left opacity", "big heart"], "path": ["files/p1/a.jpg"] * 3,
                         "x": [1, 10, 5], "y": [1, 10, 5], "w": [5, 5, 20], "h": [5, 5, 20], "image_width": 32,
                         "image_height": 32, "split": "test"})
    rows.to_csv(tmp_path / "ms.csv", index=False)
    df = read_mscxr(tmp_path / "ms.csv")
    assert df["phrase_id"].tolist() == [0, 0, 1]
    rows.loc[2, "w"] = 40
    rows.to_csv(tmp_path / "ms.csv", index=False)
    with pytest.raises(MedclrError, match="row 4: box lies outside"):
        read_mscxr(tmp_path / "ms.csv")
