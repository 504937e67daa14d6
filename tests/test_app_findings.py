"""Which findings a checkpoint reads, as the app and the scorer show them: a finding whose validation record
says flipped is greyed out with its reason and no percentage (the real server, through gradio_client), NaN
with a reason column in `medclr score`; a checkpoint without the record carries the "not validated" notice;
a phrase the model does not find on a film gets no hot colours."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from medclr.findings import NOT_VALIDATED
from tests.conftest_app import app_assets, engine, index_dir, rg1_path, served_app  # noqa: F401 - fixtures

os.environ["HF_HUB_OFFLINE"] = "1"


def _record(classes):
    """A record in medclr.findings' shape: every class read with a steep Platt map, Pneumothorax flipped."""
    per = {c: {"n": 200, "n_pos": 40, "auc": 0.9, "auc_ci": [0.85, 0.95], "prevalence": 0.2, "direction": "positive",
               "platt": {"a": 40.0, "b": -1.0}, "threshold": -10.0, "reads": True, "reason": None} for c in classes}
    per["Pneumothorax"].update(auc=0.31, auc_ci=[0.22, 0.4], direction="flipped", reads=False,
                               reason="this model does not reliably read pneumothorax: validation AUC 0.31 "
                                      "(it ranks these images opposite to the finding)")
    return {"min_auc": 0.7, "split": "validate", "prompts": "paper", "n_boot": 100, "classes": per}


def _validated(source, where, record):
    import dataclasses

    import torch

    from medclr.inference import load_checkpoint, read_metadata, write_metadata

    ckpt = where / "checkpoint"
    shutil.copytree(source, ckpt)
    write_metadata(ckpt, dataclasses.replace(read_metadata(ckpt), findings=record))
    torch.set_num_threads(1)
    return load_checkpoint(ckpt)


@pytest.fixture(scope="module")
def validated_engine(app_assets, tmp_path_factory):  # noqa: F811
    from medclr.prompts import CHEX5

    return _validated(app_assets["checkpoint"], tmp_path_factory.mktemp("validated"), _record(CHEX5))


def test_engine_shows_calibrated_read_findings_and_nan_for_a_flipped_one(validated_engine):
    details = {d["class"]: d for d in validated_engine.zero_shot_details(rg1_path())}
    ptx = details["Pneumothorax"]
    assert np.isnan(ptx["probability"]) and "validation AUC 0.31" in ptx["note"] and ptx["reads"] is False
    card = details["Cardiomegaly"]
    margin = card["score_positive"] - card["score_negative"]
    assert card["note"] is None and card["probability"] == pytest.approx(1 / (1 + np.exp(-(40 * margin - 1))), abs=1e-6)
    assert card["raw_probability"] == pytest.approx(1 / (1 + np.exp(-margin / validated_engine.tau)), abs=1e-6)


def test_app_greys_out_the_flipped_finding(validated_engine, index_dir):  # noqa: F811
    from gradio_client import Client, handle_file

    with served_app(validated_engine, index_dir) as (url, _service):
        client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
        label, table, note = client.predict(handle_file(rg1_path()), api_name="/zero_shot")
    shown = {c["label"] for c in label["confidences"]}
    assert "Pneumothorax" not in shown and "Cardiomegaly" in shown
    assert 'class="unread"' in note and "Pneumothorax: this model does not reliably read pneumothorax" in note
    rows = {r[0]: r for r in table["data"]}
    assert rows["Pneumothorax"][1] is None and rows["Pneumothorax"][2] == 0.31
    assert "%" not in note  # no percentage for a finding the model does not read


def test_app_marks_a_checkpoint_without_the_record_not_validated(engine, index_dir):  # noqa: F811
    from gradio_client import Client, handle_file

    with served_app(engine, index_dir) as (url, _service):
        client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
        label, _table, note = client.predict(handle_file(rg1_path()), api_name="/zero_shot")
    assert "Not validated" in note and len(label["confidences"]) == 5


def test_scorer_writes_nan_and_a_reason_for_the_flipped_finding(validated_engine, tmp_path):
    from medclr.jobs import scoring

    root = tmp_path / "archive"
    root.mkdir()
    shutil.copy(rg1_path(), root / "rg1.dcm")
    out = tmp_path / "scores.parquet"
    scoring.score_tree(validated_engine, root, out, scoring.ScoreOptions(progress=False, workers=0, full_decode=True))
    df = pq.read_table(out).to_pandas()
    assert np.isnan(df["Pneumothorax"].iloc[0]) and "validation AUC 0.31" in df["Pneumothorax reason"].iloc[0]
    assert np.isfinite(df["Cardiomegaly"].iloc[0]) and df["Cardiomegaly reason"].isna().all()
    assert df["Cardiomegaly"].iloc[0] == pytest.approx(validated_engine.zero_shot(rg1_path())["Cardiomegaly"], abs=1e-5)


def test_scorer_notes_an_unvalidated_checkpoint(engine, tmp_path):  # noqa: F811
    from medclr.jobs import scoring

    root = tmp_path / "archive"
    root.mkdir()
    shutil.copy(rg1_path(), root / "rg1.dcm")
    out = tmp_path / "scores.parquet"
    scoring.score_tree(engine, root, out, scoring.ScoreOptions(progress=False, workers=0))
    df = pq.read_table(out).to_pandas()
    assert (df["Edema reason"] == NOT_VALIDATED).all() and np.isfinite(df["Edema"]).all()


def test_a_phrase_the_model_does_not_find_gets_no_colours(engine, index_dir):  # noqa: F811
    """Whatever this (random) model says, the rule holds: where the phrase's negation outscores it, the film is
    returned as it was read (no overlay) and the legend says why; where the phrase wins, colours are painted.
    Each phrase is asked with its negation too: of "X" and "No X" the model finds exactly one, so the absent
    branch is exercised whichever way a random model's scores fall."""
    from medclr.app import render
    from medclr.app.service import AppService
    from medclr.data.hard_negatives import negate

    service = AppService(engine, None)
    plain = render.to_uint8(service.upload(rg1_path()).display)
    phrases = ["pleural effusion", "pneumothorax", "cardiomegaly", "pulmonary edema", "pneumonia", "consolidation",
               "atelectasis", "a nodule", "opacity", "large left pleural effusion"]
    phrases += [negate(p) for p in phrases]
    seen = set()
    for phrase in phrases:
        evidence = engine.phrase_evidence(rg1_path(), phrase)
        image, legend = service.ground(rg1_path(), phrase)
        if evidence["present"] is False:
            assert np.array_equal(image, plain) and legend.startswith("The model does not see this on the image")
            seen.add(False)
        elif "no localised signal" not in legend:
            assert not np.array_equal(image, plain) and "scores the phrase above" in legend
            seen.add(True)
    assert False in seen, "no phrase was found absent: the gate was not exercised"


def test_a_finding_is_painted_only_above_its_validation_operating_point(validated_engine, tmp_path):
    """A phrase that states a CheX5 finding is judged by the checkpoint's record: not read -> no map and the reason;
    margin below the finding's operating point -> no map; above it -> the map, with the probability said."""
    from medclr.app import render
    from medclr.app.service import AppService
    from medclr.prompts import CHEX5

    service = AppService(validated_engine, None)
    plain = render.to_uint8(service.upload(rg1_path()).display)
    image, legend = service.ground(rg1_path(), "small right pneumothorax")
    assert np.array_equal(image, plain) and legend.startswith("No heatmap: this model does not reliably read pneumothorax")
    image, legend = service.ground(rg1_path(), "cardiomegaly")  # operating point -10: every margin is above it
    assert legend.startswith("the model finds cardiomegaly on this image") or "no localised signal" in legend
    record = _record(CHEX5)
    record["classes"]["Cardiomegaly"]["threshold"] = 10.0  # no cosine margin reaches it
    strict = AppService(_validated(validated_engine.checkpoint_dir, tmp_path, record), None)
    image, legend = strict.ground(rg1_path(), "The heart is enlarged.")
    assert np.array_equal(image, plain) and legend.startswith("The model does not find cardiomegaly on this image")


def test_youden_threshold_against_brute_force():
    from medclr.findings import youden_threshold

    rng = np.random.default_rng(3)
    y = (rng.random(300) < 0.3).astype(float)
    x = rng.normal(size=300) + 1.2 * y
    best = max(np.unique(x), key=lambda t: ((x >= t) & (y == 1)).sum() / y.sum() - ((x >= t) & (y == 0)).sum() / (1 - y).sum())
    assert youden_threshold(x, y) == pytest.approx(best)
