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
from tests.conftest_app import (  # noqa: F401 - fixtures
    app_assets,
    engine,
    findings_record as _record,
    index_dir,
    rg1_path,
    served_app,
)

os.environ["HF_HUB_OFFLINE"] = "1"


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
    # plain text for API clients: a quoted line (the page greys it), no HTML
    assert "> Pneumothorax: this model does not reliably read pneumothorax" in note and "<" not in note
    rows = {r[0]: r for r in table["data"]}
    assert rows["Pneumothorax"][1] is None and rows["Pneumothorax"][2] is None and rows["Pneumothorax"][3] == 0.31
    # each finding it reads: its whole-percent probability against its operating point (threshold -10: far below)
    assert rows["Cardiomegaly"][2] == 0 and "- Cardiomegaly " in note and "at or above its operating point of 0%" in note
    unread = [line for line in note.splitlines() if "Pneumothorax" in line]
    assert len(unread) == 1 and "%" not in unread[0]  # no percentage for a finding the model does not read


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


def _grey(image) -> bool:
    """No map on the picture: every pixel grey (the film, and the R/L markers in black and white)."""
    arr = np.asarray(image).astype(int)
    return arr.ndim == 3 and bool((arr[..., 0] == arr[..., 1]).all() and (arr[..., 1] == arr[..., 2]).all())


def test_a_phrase_the_model_does_not_find_gets_no_colours(engine, index_dir):  # noqa: F811
    """A phrase that states none of the CheX5 findings is compared with its negation: where the negation outscores
    it, the film comes back without colours and the legend says why; where the phrase wins, colours are painted.
    The phrases are many, so that this fixed (seeded) model finds at least one absent and the gate is exercised."""
    from medclr.app.service import AppService

    service = AppService(engine, None)
    phrases = ["consolidation", "atelectasis", "a nodule", "opacity", "a pacemaker", "a hernia", "scoliosis",
               "a rib fracture", "a mass", "emphysema", "calcified granuloma", "a central line", "an endotracheal tube",
               "hyperinflation", "a fissure"]
    seen = set()
    for phrase in phrases:
        evidence = engine.phrase_evidence(rg1_path(), phrase)
        assert evidence["how"] == "negation", phrase
        image, legend = service.ground(rg1_path(), phrase)
        if evidence["present"] is False:
            assert _grey(image) and legend.startswith(f"No heatmap for “{phrase}”: the model scores")
            assert "states none of the five CheX5 findings" in legend
            seen.add(False)
        elif "no localised signal" not in legend:
            assert not _grey(image) and legend.startswith(f"Map of “{phrase}”: the model scores the phrase above")
            seen.add(True)
    assert False in seen, "no phrase was found absent: the gate was not exercised"


def test_a_finding_is_painted_only_above_its_validation_operating_point(validated_engine, tmp_path):
    """A phrase that states a CheX5 finding is judged by the checkpoint's record: not read -> no map and the reason;
    margin below the finding's operating point -> no map; above it -> the map, with the probability said."""
    from medclr.app.service import AppService
    from medclr.prompts import CHEX5

    service = AppService(validated_engine, None)
    image, legend = service.ground(rg1_path(), "small right pneumothorax")
    assert _grey(image) and legend.startswith(
        "No heatmap for “small right pneumothorax”: this model does not reliably read pneumothorax")
    image, legend = service.ground(rg1_path(), "cardiomegaly")  # operating point -10: every margin is above it
    assert "the model finds cardiomegaly on this image" in legend
    record = _record(CHEX5)
    record["classes"]["Cardiomegaly"]["threshold"] = 10.0  # no cosine margin reaches it
    strict = AppService(_validated(validated_engine.checkpoint_dir, tmp_path, record), None)
    image, legend = strict.ground(rg1_path(), "The heart is enlarged.")
    assert _grey(image) and legend.startswith("No heatmap for “The heart is enlarged.”: the model does not find "
                                              "cardiomegaly on this image")


def test_youden_threshold_against_brute_force():
    from medclr.findings import youden_threshold

    rng = np.random.default_rng(3)
    y = (rng.random(300) < 0.3).astype(float)
    x = rng.normal(size=300) + 1.2 * y
    best = max(np.unique(x), key=lambda t: ((x >= t) & (y == 1)).sum() / y.sum() - ((x >= t) & (y == 0)).sum() / (1 - y).sum())
    assert youden_threshold(x, y) == pytest.approx(best)
