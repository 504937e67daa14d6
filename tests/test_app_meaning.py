"""Issue 45: a map means what the phrase says, phrases are read like their finding, retrieval says what it cannot
find, and the findings box and the API say things plainly. Through gradio_client on the real server, with the
tests' small checkpoint given a validation record (``findings_record``: every finding read with its operating
point below every margin, Pneumothorax not read).

The small checkpoint is untrained, so which side it prefers is whatever its weights say; the side test fixes
the one number the rule depends on instead, the checkpoint's temperature tau (a preference needs a score gap of
tau·ln 2): tiny, the model always prefers one of two different sentences; huge, it never does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from tests.conftest_app import (  # noqa: F401 - fixtures
    app_assets,
    build_wide_index,
    findings_record,
    index_dir,
    rg1_path,
    served_app,
)

os.environ["HF_HUB_OFFLINE"] = "1"  # gradio_client's own telemetry (docs/app.md, "API")


@pytest.fixture(scope="module")
def validated(app_assets, tmp_path_factory):  # noqa: F811
    """An engine of its own (the side test changes its tau) over the tests' weights, with the validation record."""
    import torch

    from medclr.inference import load_checkpoint, read_metadata, write_metadata
    from medclr.prompts import CHEX5

    ckpt = tmp_path_factory.mktemp("meaning") / "checkpoint"
    shutil.copytree(app_assets["checkpoint"], ckpt)
    write_metadata(ckpt, dataclasses.replace(read_metadata(ckpt), findings=findings_record(CHEX5)))
    torch.set_num_threads(1)
    return load_checkpoint(ckpt)


@pytest.fixture(scope="module")
def served(validated, index_dir):  # noqa: F811
    from gradio_client import Client

    with served_app(validated, index_dir) as (url, service):
        yield Client(url, verbose=False, analytics_enabled=False, download_files=False), service


def _picture(file_data) -> np.ndarray:
    path = file_data["path"] if isinstance(file_data, dict) else str(file_data)
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def _grey(picture: np.ndarray) -> bool:
    """No map: every pixel grey (the film, and its R/L markers in black and white)."""
    return bool((picture[..., 0] == picture[..., 1]).all() and (picture[..., 1] == picture[..., 2]).all())


def _ground(client, phrase: str) -> tuple[np.ndarray, str]:
    from gradio_client import handle_file

    image, legend = client.predict(handle_file(rg1_path()), phrase, "relative", api_name="/ground")
    return _picture(image), legend


def _table(client) -> tuple[dict, str]:
    from gradio_client import handle_file

    _label, table, note = client.predict(handle_file(rg1_path()), api_name="/zero_shot")
    return {row[0]: row for row in table["data"]}, note


def test_a_negated_or_normal_phrase_gets_no_map(served):
    client, _ = served
    rows, _ = _table(client)
    for phrase in ("no pleural effusion", "lungs are clear", "Heart size is normal.", "There is no pneumothorax.",
                   "no pacemaker"):
        picture, legend = _ground(client, phrase)
        assert _grey(picture), phrase
        assert legend.startswith(f"No heatmap for “{phrase}”: it states an absence, and a map shows where a finding "
                                 "is"), legend
    # the absence is read where it can be: the denied finding's own probability, or why the model cannot say
    _, legend = _ground(client, "no pleural effusion")
    assert f"The model gives pleural effusion {rows['Pleural Effusion'][1]}% on this image (at or above" in legend
    _, legend = _ground(client, "There is no pneumothorax.")
    assert "This model does not reliably read pneumothorax: validation AUC 0.31" in legend
    assert "so it cannot vouch for its absence either" in legend


@contextlib.contextmanager
def _tau(engine, tau: float):
    kept = engine.tau
    engine.tau = tau
    try:
        yield
    finally:
        engine.tau = kept


def test_a_side_swapped_phrase_gets_the_preference_line_or_no_map(served, validated):
    """Pleural effusion is read and (operating point -10) found on every film: the side decides. Of "left" and
    "right", the one the model prefers is drawn with the preference said, the other is withheld naming the side
    it prefers; when it cannot tell them apart, neither is drawn."""
    client, _ = served
    phrases = {"left": "left pleural effusion", "right": "right pleural effusion"}
    with _tau(validated, 1e-9):
        answers = {side: _ground(client, phrase) for side, phrase in phrases.items()}
    drawn = [side for side, (_, legend) in answers.items() if "rather than the" in legend]
    assert len(drawn) == 1, [legend for _, legend in answers.values()]
    side = drawn[0]
    other = "right" if side == "left" else "left"
    legend = answers[side][1]
    assert "the model finds pleural effusion on this image (probability" in legend
    assert f"it places it on the {side} rather than the {other} (“{phrases[side]}” " in legend
    assert legend.startswith(f"Map of “{phrases[side]}”") or "no localised signal" in legend  # flat maps: none
    picture, legend = answers[other]
    assert _grey(picture) and legend.startswith(f"No heatmap for “{phrases[other]}”: the model finds pleural effusion")
    assert f"but on the {side}, not on the {other}" in legend and f"Type “{phrases[side]}” to see that map." in legend
    with _tau(validated, 1e3):
        for phrase in phrases.values():
            picture, legend = _ground(client, phrase)
            assert _grey(picture) and legend.startswith(f"No heatmap for “{phrase}”") and "cannot tell" in legend
    # a size is checked the same way
    with _tau(validated, 1e3):
        picture, legend = _ground(client, "small pleural effusion")
    assert _grey(picture) and "cannot tell small from large on this image" in legend


def test_enlarged_heart_follows_cardiomegalys_probability(served):
    client, _ = served
    rows, note = _table(client)
    p = rows["Cardiomegaly"][1]  # whole percent, as the labels show it
    assert f"- Cardiomegaly {p}%: at or above its operating point" in note
    for phrase in ("enlarged heart", "heart size is enlarged", "cardiomegaly"):
        _, legend = _ground(client, phrase)
        assert f"the model finds cardiomegaly on this image (probability {p}%, at or above its operating point" in legend
        assert "does not see" not in legend
    # a phrase that states no CheX5 finding says so
    _, legend = _ground(client, "a pacemaker")
    assert "the phrase states none of the five CheX5 findings, so this check is not validated" in legend


def test_a_text_query_for_an_unread_finding_carries_the_note(served):
    client, _ = served
    _, box = _table(client)
    grey = next(line for line in box.splitlines() if line.startswith("> Pneumothorax:"))
    for query in ("pneumothorax", "large right pneumothorax", "no pneumothorax"):
        gallery, note = client.predict(query, 5, api_name="/retrieve_by_text")
        assert gallery and any(line.startswith(grey) for line in note.splitlines()), (query, note)
    _, note = client.predict("cardiomegaly", 5, api_name="/retrieve_by_text")
    assert not note.startswith("> Pneumothorax:")
    from gradio_client import handle_file

    _, note = client.predict(handle_file(rg1_path()), 5, api_name="/retrieve_by_image")
    assert note.startswith("> This model does not read pneumothorax: these results are alike in what it reads")


def test_text_search_for_k8_is_the_first_8_of_k24(validated, tmp_path_factory):
    """The head ranks the candidates of the largest k once: k = 8 shows the first 8 of k = 24, same scores."""
    from gradio_client import Client

    from medclr.index import load_index
    from medclr.inference import load_checkpoint

    wide = build_wide_index(str(tmp_path_factory.getbasetemp()))
    engine = load_checkpoint(wide["checkpoint"])
    index = load_index(wide["index"], engine)
    assert index.reranks and index.images.ntotal > 240  # more than the head re-ranks for k = 24
    with served_app(engine, wide["index"]) as (url, _service):
        client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
        for query in ("cardiomegaly", "small left pleural effusion", "no acute cardiopulmonary process"):
            short, _ = client.predict(query, 8, api_name="/retrieve_by_text")
            long, _ = client.predict(query, 24, api_name="/retrieve_by_text")
            assert len(short) == 8 and len(long) == 24
            assert [g["caption"] for g in short] == [g["caption"] for g in long[:8]], query


def test_api_clients_get_data_and_output_galleries_take_no_uploads(served):
    client, _ = served
    rows, note = _table(client)
    assert "<" not in note and "class=" not in note
    assert all(isinstance(r[1], int) for r in rows.values() if r[1] is not None)  # whole percent, as the labels
    props = {c.get("props", {}).get("elem_id"): c.get("props", {}) for c in client.config["components"]}
    for gallery in ("similar", "by_text"):
        assert props[gallery]["interactive"] is False, gallery


def test_phrase_reading():
    from medclr.app.phrases import read_phrase

    no = read_phrase("no pleural effusion")
    assert no.denial and no.denied == ("Pleural Effusion",) and no.finding is None
    assert read_phrase("The lungs are clear.").denial and read_phrase("heart is not enlarged").denial
    assert read_phrase("enlarged heart").finding == "Cardiomegaly"
    assert read_phrase("Cardiomegaly without edema").finding == "Cardiomegaly"  # a stated finding is not a denial
    left = read_phrase("small left pleural effusion")
    assert left.finding == "Pleural Effusion" and not left.denial
    assert [(a.kind, a.typed, a.other, a.phrase) for a in left.alternatives] == [
        ("side", "left", "right", "small right pleural effusion"), ("size", "small", "large", "large left pleural effusion")]
    assert read_phrase("bilateral pleural effusions").alternatives == ()  # both sides: nothing to swap
    assert read_phrase("possible left pleural effusion").finding is None  # hedged: neither negated nor one finding
