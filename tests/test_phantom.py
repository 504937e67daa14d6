"""CXR-Phantom: formats round-trip through the foundation readers, boxes sit on lesions, bytes are reproducible."""

from __future__ import annotations

import csv
import gzip
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pydicom
import pytest

from medclr.cli import main as cli_main
from medclr.data.labels import CHEX5, CHEXPERT_LABELS
from medclr.data.readers.mimic import read_mimic_cxr_jpg
from medclr.data.readers.mscxr import read_mscxr
from medclr.io import read_image
from medclr.phantom import attach_ground_truth, generate, load_material, read_ground_truth, render, vocab as V
from medclr.phantom.groundtruth import false_negative_rates
from medclr.phantom.plan import class_model_prob, plan_study
from medclr.phantom.textmatch import mention_state, sentence_side
from medclr.phantom.writer import CHEXPERT_COLUMNS, METADATA_COLUMNS, MSCXR_COLUMNS, SPLIT_COLUMNS

N, SIZE, EVAL_K, VAL_K = 24, 128, 3, 2
N_ALL = N + 5 * EVAL_K + 3 + 1 + 5 * VAL_K  # the pool, EVAL_K per CheX5 class, 1 per other grounding category and
#                                             1 normal study, VAL_K balanced validation studies per CheX5 class


@pytest.fixture(scope="module")
def material():
    return load_material()


@pytest.fixture(scope="module")
def phantom(tmp_path_factory, material):
    out = tmp_path_factory.mktemp("phantom")
    generate(out, N, seed=5, source="both", size=SIZE, dicom=True, workers=2, fractions=(0.5, 0.2), progress=False,
             eval_per_class=EVAL_K, val_per_class=VAL_K)
    return out


def _header(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return next(csv.reader(fh))


def test_format_round_trip(phantom):
    for name, cols in (("mimic-cxr-2.0.0-metadata.csv.gz", METADATA_COLUMNS), ("mimic-cxr-2.0.0-split.csv.gz",
                       SPLIT_COLUMNS), ("mimic-cxr-2.0.0-chexpert.csv.gz", CHEXPERT_COLUMNS),
                       ("MS_CXR_Local_Alignment_v1.1.0.csv", MSCXR_COLUMNS)):
        assert _header(phantom / name) == list(cols), name
    df = read_mimic_cxr_jpg(phantom, views=None)
    assert len(df) == N_ALL and set(df["view"]) <= {"PA", "AP"}
    assert set(df["split"]) <= {"train", "validate", "test"}
    assert df.groupby("subject_id")["split"].nunique().max() == 1  # split by subject
    assert all(len(s) > 0 for s in df["sentences"])
    for rel in df["image_path"][:4]:
        jpg = read_image(phantom / rel)
        assert jpg.shape == (SIZE, SIZE) and jpg.dtype == np.float32
        dcm_path = (phantom / rel).with_suffix(".dcm")
        ds = pydicom.dcmread(dcm_path)
        assert ds.Modality == "CR" and ds.PhotometricInterpretation == "MONOCHROME1"
        assert str(ds.PatientName).startswith("PHANTOM^") and ds.PatientID.isdigit()
        dcm = read_image(dcm_path)  # MONOCHROME1 inverted back: same picture as the JPG
        assert np.corrcoef(jpg.ravel(), dcm.ravel())[0, 1] > 0.99 and np.abs(jpg - dcm).mean() < 0.02
    gt = read_ground_truth(phantom)
    assert len(gt) == N_ALL and gt["dicom_id"].is_unique
    joined = attach_ground_truth(df, phantom)
    assert joined["latent_class"].notna().all() and list(joined["dicom_id"]) == list(df["dicom_id"])
    counts = gt.loc[gt["eval_target"] == "", "latent_class"].value_counts()  # the pool's distribution
    assert np.allclose(gt["latent_class_prob"], gt["latent_class"].map(counts).fillna(0) / N)
    assert (gt["latent_class_model_prob"] > 0).all() and (gt["latent_class_model_prob"] <= 1).all()
    ms = read_mscxr(phantom / "MS_CXR_Local_Alignment_v1.1.0.csv")
    test_ids = set(gt.loc[gt["split"] == "test", "dicom_id"])
    assert len(ms) > 0 and set(ms["dicom_id"]) <= test_ids and set(ms["split"]) == {"test"}
    assert ((ms.image_width == SIZE) & (ms.image_height == SIZE)).all()


def test_eval_sets_are_class_balanced_and_subject_disjoint(phantom):
    gt = read_ground_truth(phantom)
    df = read_mimic_cxr_jpg(phantom, views=None).merge(gt[["dicom_id", "eval_target"]], on="dicom_id")
    ev = df[(df["eval_target"] != "") & (df["split"] == "test")]
    assert len(ev) == 5 * EVAL_K + 3 + 1 and (ev["split"] == "test").all()
    assert not set(ev["subject_id"]) & set(df.loc[df["eval_target"] == "", "subject_id"])
    for label in CHEX5:
        pos = ev[label] == 1.0
        assert pos.sum() == EVAL_K  # single-positive: only the studies drawn for this class
        assert (ev[label] == 0.0).sum() >= 4 * EVAL_K - 3  # others are negated (pneumonia may stay unmentioned)
    summary = __import__("json").loads((phantom / "phantom.json").read_text())
    assert summary["test_chex5"]["Edema"]["positive"] >= EVAL_K and summary["eval_studies"] == 5 * EVAL_K + 3 + 1
    normal = ev[ev["eval_target"] == "normal"]
    assert len(normal) == summary["eval_normal"] == 1 and (normal["No Finding"] == 1.0).all()
    assert not (normal[list(CHEX5)] == 1.0).any(axis=None)
    assert (gt.loc[gt["eval_target"] == "normal", "n_findings"] == 0).all()
    ms = read_mscxr(phantom / "MS_CXR_Local_Alignment_v1.1.0.csv")
    assert set(ms["category_name"]) == set(V.MSCXR_OF.values())  # all 8 grounding categories


def test_balanced_validation_studies_are_subject_disjoint_from_the_evaluation_sets(phantom):
    """The validate split's class-balanced studies (what training calibrates each finding on) share no subject
    with the test split (the evaluation sets) nor with training, and hold VAL_K positives per CheX5 class."""
    gt = read_ground_truth(phantom)
    df = read_mimic_cxr_jpg(phantom, views=None).merge(gt[["dicom_id", "eval_target"]], on="dicom_id")
    val = df[(df["eval_target"] != "") & (df["split"] == "validate")]
    assert len(val) == 5 * VAL_K
    for label in CHEX5:
        assert (val[label] == 1.0).sum() == VAL_K
    by_split = {s: set(df.loc[df["split"] == s, "subject_id"]) for s in ("train", "validate", "test")}
    assert not by_split["validate"] & by_split["test"] and not by_split["validate"] & by_split["train"]
    assert not by_split["train"] & by_split["test"]
    summary = __import__("json").loads((phantom / "phantom.json").read_text())
    assert summary["val_studies"] == 5 * VAL_K and summary["splits"]["validate"] >= 5 * VAL_K


def test_eval_plan_at_full_size(material):
    """The default 250 per class, planned (not rendered): each CheX5 study holds its class and no other."""
    from medclr.phantom.plan import CHEX5_TARGETS, eval_targets, plan_eval_study

    targets = eval_targets(250)
    assert len(targets) == 5 * 250 + 3 * 50
    seen = {name: 0 for name in V.CHEX5_OF}
    for j, target in enumerate(targets):
        spec = plan_eval_study(material, 0, j, target)
        chex5 = {f["name"] for f in spec["findings"] if f["name"] in V.CHEX5_OF}
        assert chex5 == ({target} if target in CHEX5_TARGETS else set()), (j, target, chex5)
        assert any(f["name"] == target and f["sentence_text"] for f in spec["findings"])
        for name in chex5:
            seen[name] += 1
    assert seen == {name: 250 for name in V.CHEX5_OF}


def test_boxes_inside_images(phantom):
    gt = read_ground_truth(phantom)
    n_boxes = 0
    for fs in gt["findings"]:
        for f in fs:
            for x, y, w, h in f["boxes"]:
                n_boxes += 1
                assert 0 <= x and 0 <= y and w > 0 and h > 0 and x + w <= SIZE and y + h <= SIZE
    assert n_boxes > N // 2


LESIONS = [
    V.finding("pleural_effusion", side="right", size="moderate"),
    V.finding("pleural_effusion", side="left", size="small"),
    V.finding("pneumothorax", side="left", size="moderate", zone="apex"),
    V.finding("nodule", side="right", zone="upper", kind="nodule"),
    V.finding("nodule", side="left", zone="lower", kind="mass"),
    V.finding("pneumonia", side="right", zone="lower"),
    V.finding("consolidation", side="left", zone="upper"),
    V.finding("opacity", side="right", zone="mid"),
    V.finding("atelectasis", side="left", zone="base", kind="plate"),
    V.finding("edema", severity="moderate"),
    V.finding("pacemaker", side="left"),
]


@pytest.mark.parametrize("lesion", LESIONS, ids=lambda f: f"{f['name']}-{f['side'] or 'x'}-{f['kind'] or f['size']}")
def test_box_is_on_the_drawn_lesion(material, lesion):
    """Leaving the finding out changes the image inside its box, not outside (everything else is the same)."""
    spec = {"seed": 11, "k": 3, "view": "PA", "findings": [V.finding("central_line", side="right"), dict(lesion)]}
    with_f = render(material, spec, 192)
    without = render(material, spec, 192, drop=1)
    diff = np.abs(with_f["image"].astype(np.float32) - without["image"].astype(np.float32))
    boxes = with_f["boxes"][1]
    assert boxes, "no box for a drawn finding"
    inside = np.zeros(diff.shape, bool)
    for x, y, w, h in boxes:
        inside[y:y + h, x:x + w] = True
    assert diff[inside].mean() > 2.0  # the lesion is visible (grey levels)
    assert diff[inside].mean() > 5 * max(diff[~inside].mean(), 0.05)
    assert diff[~inside].sum() < 0.25 * diff.sum()  # the change lies in the boxes
    assert with_f["boxes"][0] == without["boxes"][0]  # the other finding did not move


def test_cardiomegaly_and_heart_box(material):
    for k, sev in enumerate(("borderline", "mild", "moderate", "severe")):
        spec = {"seed": 2, "k": k, "view": "PA", "findings": [V.finding("cardiomegaly", severity=sev)]}
        big, normal = render(material, spec, 128), render(material, spec, 128, drop=0)
        assert big["ctr"] > 0.5 > normal["ctr"]
        ((_, _, w, _),) = big["boxes"][0]
        assert w > 0.3 * 128


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_deterministic_and_independent_of_workers(tmp_path, material):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate(a, 8, seed=9, source="both", size=96, dicom=True, workers=1, progress=False, eval_per_class=1)
    generate(b, 8, seed=9, source="both", size=96, dicom=True, workers=2, progress=False, eval_per_class=1)
    generate(c, 8, seed=10, source="both", size=96, dicom=False, workers=2, progress=False, eval_per_class=1)
    da, db = _tree_digest(a), _tree_digest(b)
    assert da == db and len(da) > (8 + 8) * 3
    dc = _tree_digest(c)
    assert da["mimic-cxr-2.0.0-metadata.csv.gz"] != dc["mimic-cxr-2.0.0-metadata.csv.gz"]


def test_normal_test_studies_leave_every_other_study_as_it_was(tmp_path):
    """Normal studies are written after every other study: the same phantom without them has the same files for
    every other study, so test splits measured before they existed are made again with --eval-normal 0."""
    a, b = tmp_path / "a", tmp_path / "b"
    generate(a, 8, seed=9, size=64, workers=1, progress=False, eval_per_class=1, val_per_class=1, eval_normal=0)
    generate(b, 8, seed=9, size=64, workers=1, progress=False, eval_per_class=1, val_per_class=1, eval_normal=2)
    images = {name: digest for name, digest in _tree_digest(a).items() if name.endswith((".jpg", ".txt"))}
    with_normals = _tree_digest(b)
    assert images and all(with_normals.get(name) == digest for name, digest in images.items())
    gt = read_ground_truth(b)
    assert len(gt) == len(read_ground_truth(a)) + 2
    assert list(gt["eval_target"].tail(2)) == ["normal", "normal"] and (gt["split"].tail(2) == "test").all()


def test_every_chex5_positive_has_sentence_and_box(phantom):
    df = read_mimic_cxr_jpg(phantom, views=None).set_index("dicom_id")
    gt = read_ground_truth(phantom).set_index("dicom_id")
    labels = pd.read_csv(phantom / "mimic-cxr-2.0.0-chexpert.csv.gz", dtype={"subject_id": str, "study_id": str})
    labels = labels.set_index("study_id")
    checked = 0
    for dicom_id, row in gt.iterrows():
        lab = labels.loc[row["study_id"]]
        for name in CHEX5:
            findings = [f for f in row["findings"] if f["chexpert"] == name]
            if lab[name] == 1.0:
                checked += 1
                assert findings, (dicom_id, name)
                for f in findings:
                    assert f["sentence"] and f["sentence"] in df.loc[dicom_id, "sentences"], (name, f["sentence"])
                    assert len(f["boxes"]) >= 1, (dicom_id, name)
            else:
                assert not findings  # image and labels agree: nothing drawn that the labels deny
    assert checked >= 3
    assert set(labels.columns) == {"subject_id", *CHEXPERT_LABELS}


def test_latent_classes_and_probabilities(material):
    specs = [plan_study(material, "composed", 1, k) for k in range(300)]
    classes = {s["latent_class"] for s in specs}
    probs = [class_model_prob(material, "composed", c) for c in classes]
    assert all(0 < p <= 1 for p in probs) and sum(probs) <= 1 + 1e-9
    normal = class_model_prob(material, "composed", "normal")
    assert 0.05 < normal < 0.2  # CheXpert rows with no positive label
    assert class_model_prob(material, "both", "normal") > normal  # Open-i is ~39 % normal
    assert any("pneumothorax" in c for c in classes)  # rare in Open-i, common enough here
    fn = false_negative_rates(np.array([0.0, 0.01, 0.5]), batch=64)
    assert fn["p_any"][0] == 0 and abs(fn["p_any"][1] - (1 - 0.99 ** 63)) < 1e-12 and fn["expected"][2] == 31.5


def test_vocabulary_and_text_rules():
    (f,) = V.parse_mesh("Pleural Effusion/right/small")
    assert (f["name"], f["side"], f["size"]) == ("pleural_effusion", "right", "small")
    assert V.parse_mesh("normal") == []
    both = V.merge_findings(V.parse_mesh("Opacity/lung/base/left") + V.parse_mesh("Opacity/lung/base/right"))
    assert V.latent_class(both) == "opacity:bilateral"
    assert V.latent_class([V.finding("cardiomegaly"), V.finding("pneumothorax", side="left", side_stated=True)]) == \
        "cardiomegaly|pneumothorax:left"
    assert mention_state("No pleural effusion or pneumothorax.", "pneumothorax") == "neg"
    assert mention_state("Small left pleural effusion.", "pleural_effusion") == "pos"
    assert mention_state("The heart size is normal.", "cardiomegaly") == "neg"
    assert sentence_side("Bibasilar atelectasis.") == "bilateral"


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert cli_main(["phantom", "--out", str(tmp_path / "x"), "--n", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--n" in err[0]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    assert cli_main(["phantom", "--out", str(tmp_path / "full"), "--n", "2", "--quiet"]) == 1
    assert "not empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli_main(["phantom", "--help"])
    assert exc.value.code == 0
    assert "examples:" in capsys.readouterr().out
