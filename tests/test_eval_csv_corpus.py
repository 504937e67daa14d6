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
                       "--val-per-class", 3, "--workers", 1, "--quiet") == 0
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
    assert n == 24  # 4 single-positive studies per CheX5 class, 3 of the other MS-CXR categories, 1 normal

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


def test_training_on_a_csv_corpus_without_labels_validates_on_the_rule_labels(corpus, tmp_path, capsys, caplog):
    """`medclr train` on the label-free corpus: its end-of-training validation labels the validation reports with
    the rules `medclr eval` uses (one log line), so the findings record counts positives and negatives per finding
    (the rules' own counts on those reports, not 0 and 0) and says ``labels: rules``; val/chex5_auc is a number.
    Then `medclr eval` and `medclr export --format hf --report`: the model card shows those counts, says where the
    labels came from, and shows the study-level retrieval that eval computed (not a dash)."""
    import logging
    import math

    from medclr.data.labeller import label_report
    from medclr.eval_report import fmt
    from medclr.inference import read_metadata
    from tests.test_training import _cli, _metrics, _train_cmd, write_tiny_bert

    d, _phantom, _export, manifest, _ckpt = corpus
    lm = write_tiny_bert(tmp_path / "lm", sorted({s for sents in manifest["sentences"] for s in sents}))
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="medclr.training.hooks"):
        assert _cli(_train_cmd("infonce", d / "corpus.parquet", lm, out, "train.batch_size=8", "train.max_steps=2",
                               "ckpt.every=100", "val.every=0", "model.head=cosine")[3:]) == 0
    said = [r.getMessage() for r in caplog.records if "no CheX5 labels" in r.getMessage()]
    assert len(said) == 1 and "validate split" in said[0] and "rule labeller" in said[0]

    val = manifest[(manifest["split"] == "validate") & manifest["sentences"].map(len).astype(bool)]
    rules = pd.DataFrame([label_report(list(s)) for s in val["sentences"]])
    rec = read_metadata(out).findings
    assert rec["labels"] == "rules" and rec["split"] == "validate"
    for c in CHEX5:
        e = rec["classes"][c]
        assert (e["n"], e["n_pos"]) == (int(rules[c].isin([0.0, 1.0]).sum()), int((rules[c] == 1).sum())), c
        assert 0 < e["n_pos"] < e["n"] and e["auc"] is not None and e["platt"] is not None, (c, e)
    last = _metrics(out)[-1]
    assert math.isfinite(last["val/chex5_auc"]) and all(math.isfinite(last[f"val/auc/{c}"]) for c in CHEX5)

    assert _cli(["eval", "--checkpoint", str(out), "--data", str(d / "corpus.parquet"), "--out", str(tmp_path / "ev"),
                 "--n-boot", "20", "--no-figures"]) == 0
    assert _cli(["export", "--checkpoint", str(out), "--format", "hf", "--out", str(tmp_path / "hf"),
                 "--report", str(tmp_path / "ev")]) == 0
    capsys.readouterr()
    m = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    card = (tmp_path / "hf" / "README.md").read_text()
    validation = card.split("## Validation at the end of training")[1].split("## Intended use")[0]
    assert "read from each report by medclr's rule labeller" in validation
    for c in CHEX5:
        e = rec["classes"][c]
        assert f"| {c} | " in validation and f" | {e['n']} | {e['n_pos']} | " in validation, c
    assert "0 positive and 0 negative" not in card
    rep = m["reports"]
    assert "retrieval" not in m and rep["n_studies"] == 24
    chance = np.mean([rep["chance"][f"R@{k}"] for k in (1, 5, 10)])
    row = next(line for line in card.splitlines() if line.startswith("| study-level retrieval recall"))
    assert f"| {fmt(rep['Recall'])} |" in row and f"| {fmt(float(chance))} (chance) |" in row
    row = next(line for line in card.splitlines() if line.startswith("| study-level retrieval median rank"))
    assert f"| {fmt(rep['MedR'], 1)} |" in row and f"| {fmt(rep['chance']['MedR'], 1)} (chance) |" in row
    assert "| retrieval recall (mean R@10/50/100)" not in card  # the phrase-box task did not run: no row of dashes
