"""`medclr eval` on a new corpus, as a hospital export brings it: a CSV of image path, report text and split under
its own column names, no labels, no boxes. A small CXR-Phantom is written out as such a CSV, `medclr prepare --csv`
reads it, and `medclr eval` reports study-level image <-> report retrieval and zero-shot AUC against the labels
the rule labeller reads from the reports (and says so); `medclr label --truth` scores those labels against the
phantom's truth. The checkpoint is random (tests/test_eval_runner.py's): the figures are checked for what they
are computed from, not for their size."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from medclr.data.labels import CHEX5
from tests.test_eval_runner import make_checkpoint, medclr_main

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def write_export(phantom, csv):
    """The phantom as a hospital export: one row per image with the report's full text, column names of its own,
    image paths relative to the CSV's folder."""
    split = pd.read_csv(phantom / "mimic-cxr-2.0.0-split.csv.gz", dtype=str).set_index("dicom_id")["split"]
    rows = [{"file": jpg.relative_to(csv.parent).as_posix(), "report_text": jpg.parent.with_suffix(".txt").read_text(),
             "partition": split[jpg.stem]} for jpg in sorted(phantom.glob("files/*/*/*/*.jpg"))]
    pd.DataFrame(rows).to_csv(csv, index=False)
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("csv_corpus")
    phantom = d / "phantom"
    assert medclr_main("phantom", "--out", phantom, "--n", 24, "--size", 64, "--seed", 3, "--eval-per-class", 4,
                       "--val-per-class", 0, "--workers", 1, "--quiet") == 0
    export = write_export(phantom, d / "export.csv")
    assert medclr_main("prepare", "--csv", d / "export.csv", "--image-col", "file", "--report-col", "report_text",
                       "--split-col", "partition", "--out", d / "corpus.parquet") == 0
    from medclr.data.manifest import read_manifest

    manifest = read_manifest(d / "corpus.parquet")
    ckpt = make_checkpoint(d / "ckpt", [s for sents in manifest["sentences"] for s in sents], head="cosine")
    return d, phantom, export, manifest, ckpt


def test_eval_on_a_csv_corpus_without_labels(corpus, capsys):
    from medclr.data.labeller import label_report
    from medclr.data.readers.common import text_fields

    d, _phantom, export, manifest, ckpt = corpus
    assert not any(c in manifest and manifest[c].notna().any() for c in CHEX5)  # the CSV brought no labels
    assert medclr_main("eval", "--checkpoint", ckpt, "--data", d / "corpus.parquet", "--out", d / "report",
                       "--n-boot", 20, "--no-figures") == 0
    capsys.readouterr()
    m = json.loads((d / "report" / "metrics.json").read_text())
    assert m["tasks"] == ["zeroshot", "reports", "probe"]
    test = export[export["partition"] == "test"]
    n = len(test)
    assert n == 23  # 4 single-positive studies per CheX5 class + 3 of the other MS-CXR categories

    rep = m["reports"]  # image <-> report retrieval over the test studies
    assert rep["n_studies"] == n
    for direction in ("i2t", "t2i"):
        recalls = [rep[f"{direction}/R@{k}"] for k in (1, 5, 10)]
        assert recalls == sorted(recalls) and all(r * n == pytest.approx(round(r * n)) for r in recalls)
        assert 1 <= rep[f"{direction}/MedR"] <= n
    assert rep["chance"] == {"R@1": 1 / n, "R@5": 5 / n, "R@10": 10 / n, "MedR": (n + 1) / 2}

    # zero-shot against the labels read from the report text: the usable (1/0) labels and positives per class
    # are those of the rules applied here to the CSV's own text
    rules = pd.DataFrame([label_report(text_fields(r)["sentences"]) for r in test["report_text"]])
    z = m["zeroshot"]
    assert z["n_images"] == n
    for c in CHEX5:
        pc = z["per_class"][c]
        assert (pc["n"], pc["n_pos"]) == (int(rules[c].isin([0.0, 1.0]).sum()), int((rules[c] == 1).sum())), c
        assert 0 < pc["n_pos"] < pc["n"] and 0 <= pc["AUC"] <= 1  # both kinds of label: an AUC
    assert z["macro"]["AUC"] == pytest.approx(np.mean([z["per_class"][c]["AUC"] for c in CHEX5]))

    notes = m["notes"]
    assert any("no CheX5 labels in the manifest" in t and "rule labeller" in t for t in notes)
    assert any(t.startswith("task grounding skipped: ") for t in notes)  # and why: no boxes
    assert any(t.startswith("task retrieval skipped: ") for t in notes)
    report = (d / "report" / "report.md").read_text()
    assert "Study-level retrieval" in report and "Zero-shot classification" in report and "rule labeller" in report


def test_label_agreement_with_the_phantoms_truth(corpus, capsys):
    """`medclr label --truth`: per class, the positive-call agreement and Cohen's kappa equal their float64
    formulas on the phantom's own CheXpert table, joined here by hand."""
    d, phantom, _export, manifest, _ckpt = corpus
    assert medclr_main("prepare", "--mimic", phantom, "--views", "all", "--out", d / "truth.parquet") == 0
    capsys.readouterr()
    assert medclr_main("label", "--manifest", d / "corpus.parquet", "--out", d / "labelled.parquet",
                       "--truth", d / "truth.parquet") == 0
    got = json.loads(capsys.readouterr().out)["agreement"]
    assert got["n_matched"] == len(manifest) and got["n_unmatched"] == 0

    from medclr.data.manifest import read_manifest

    labelled = read_manifest(d / "labelled.parquet").set_index("dicom_id")
    split = pd.read_csv(phantom / "mimic-cxr-2.0.0-split.csv.gz", dtype=str)
    chexpert = pd.read_csv(phantom / "mimic-cxr-2.0.0-chexpert.csv.gz", dtype={"study_id": str, "subject_id": str})
    truth = split.merge(chexpert, on=["subject_id", "study_id"]).set_index("dicom_id").loc[labelled.index]
    for c in CHEX5:
        t, r = (truth[c] == 1).to_numpy(np.float64), (labelled[c] == 1).to_numpy(np.float64)
        p_o = np.mean(t == r)
        p_e = t.mean() * r.mean() + (1 - t.mean()) * (1 - r.mean())
        g = got["classes"][c]
        assert g["agreement"] == pytest.approx(p_o, abs=1e-12) and g["kappa"] == pytest.approx((p_o - p_e) / (1 - p_e))
        assert (g["n_pos_truth"], g["n_pos_rules"]) == (int(t.sum()), int(r.sum()))
        assert sum(g["truth_pos_called"].values()) == g["n_pos_truth"] and g["truth_pos_called"]["1"] == int((t * r).sum())
        assert g["agreement"] >= 0.9, (c, g)  # a wrong join would land near the positives' base rate

    capsys.readouterr()  # a truth without labels, or of another data set, is one line
    assert medclr_main("label", "--manifest", d / "corpus.parquet", "--out", d / "x.parquet",
                       "--truth", d / "corpus.parquet") == 1
    assert "no CheX5 labels to compare with" in capsys.readouterr().err
