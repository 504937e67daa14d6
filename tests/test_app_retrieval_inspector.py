"""Retrieval a clinician can read and the sentence inspector (issue 30, items 5 and 6), on the real app.

The server serves the tests' small checkpoint and index (tests/conftest_app.py); its index's reports are
rewritten in memory to MIMIC's layout ("FINAL REPORT", EXAMINATION, INDICATION, FINDINGS, IMPRESSION) so
that a caption showing the report's header would show. RG1 (the real DICOM) is indexed as report 11.
"""

from __future__ import annotations

import os
import re
from types import SimpleNamespace

import pytest

from tests.conftest_app import app_assets, engine, index_dir, rg1_path, served_app  # noqa: F401 - fixtures

os.environ["HF_HUB_OFFLINE"] = "1"
RG1_REPORT = 11  # the manifest index of RG1 in the tests' index
CAPTION = re.compile(r"^#(\d+) · ([+-]\d+\.\d\d) SD · report (\d+) · (.*)$")


def _mimic(sentences) -> str:
    """A report in MIMIC-CXR's layout around the manifest's sentences."""
    return ("                                 FINAL REPORT\n EXAMINATION:  CHEST (PA AND LAT)\n\n"
            " INDICATION:  ___F with cough  // ?pna\n\n COMPARISON:  ___\n\n FINDINGS:\n\n "
            + "  ".join(sentences) + "\n")


@pytest.fixture(scope="module")
def manifest(app_assets):  # noqa: F811
    from medclr.data.manifest import read_manifest

    return read_manifest(app_assets["manifest"])


@pytest.fixture(scope="module")
def server(engine, index_dir, manifest):  # noqa: F811
    with served_app(engine, index_dir) as (url, service):
        table = service.index.image_table
        sents = dict(zip(manifest["index"].astype(int), manifest["sentences"]))
        table["report"] = [_mimic(list(sents[int(m)])) for m in table["manifest_index"]]
        yield url, service


@pytest.fixture(scope="module")
def client(server):
    from gradio_client import Client

    return Client(server[0], verbose=False, analytics_enabled=False, download_files=False)


def _parsed(gallery) -> list[tuple[int, float, int, str]]:
    out = []
    for item in gallery:
        m = CAPTION.match(item["caption"])
        assert m, item["caption"]
        out.append((int(m[1]), float(m[2]), int(m[3]), m[4]))
    return out


def _significant_digits(x: float) -> int:
    digits = f"{abs(x):.15e}".split("e")[0].replace(".", "").rstrip("0")
    return max(len(digits), 1)


# -- 5a: the query study is never its own hit ------------------------------------------------------------
def test_query_study_is_not_its_own_hit(client):
    from gradio_client import handle_file

    for k in (5, 11):  # 11: every other indexed image
        hits = _parsed(client.predict(handle_file(rg1_path()), k, api_name="/retrieve_by_image")[0])
        assert len(hits) == k
        assert RG1_REPORT not in [h[2] for h in hits]
        assert [h[0] for h in hits] == list(range(1, k + 1))


def test_other_images_of_the_query_study_are_dropped(client, server):
    """An image of the same study as the query image (a lateral, say) goes with it."""
    from gradio_client import handle_file

    table = server[1].index.image_table
    rg1_study = table.loc[table["manifest_index"] == RG1_REPORT, "study_id"].iloc[0]
    before = _parsed(client.predict(handle_file(rg1_path()), 3, api_name="/retrieve_by_image")[0])
    sibling = before[0][2]
    row = table.index[table["manifest_index"] == sibling][0]
    old = table.at[row, "study_id"]
    table.at[row, "study_id"] = rg1_study
    try:
        after = _parsed(client.predict(handle_file(rg1_path()), 3, api_name="/retrieve_by_image")[0])
    finally:
        table.at[row, "study_id"] = old
    assert [h[2] for h in after] == [h[2] for h in before[1:]] + [after[-1][2]]
    assert sibling not in [h[2] for h in after] and RG1_REPORT not in [h[2] for h in after]


def test_drop_query_study_rule():
    from medclr.app.service import drop_query_study

    hits = [{"id": 0, "study_id": "s1"}, {"id": 1, "study_id": "s2"}, {"id": 2, "study_id": "s1"},
            {"id": 3, "study_id": "nan"}, {"id": 4, "study_id": "s3"}]
    kept = drop_query_study(hits, lambda h: h["id"] == 0)
    assert [h["id"] for h in kept] == [1, 3, 4]
    # a query image without a study id drops itself only
    assert [h["id"] for h in drop_query_study(hits, lambda h: h["id"] == 3)] == [0, 1, 2, 4]
    assert drop_query_study(hits, lambda h: False) == hits


def test_an_indexed_file_is_recognised_by_its_bytes(server, tmp_path):
    """Same file content -> the query image (even if its embedding drifted); a copy re-encoded with the
    same pixels -> the same embedding; a different image -> neither."""
    from medclr.app.service import AppService

    service = server[1]
    up = service.upload(rg1_path())
    hit = {"score": 1.0 - 5e-4, "image_path": rg1_path()}
    assert AppService._is_query_image(up, hit)
    assert not AppService._is_query_image(up, dict(hit, image_path=str(tmp_path / "missing.dcm")))
    assert not AppService._is_query_image(up, dict(hit, score=0.99))  # too far apart to be the same image
    assert AppService._is_query_image(up, {"score": 1.0, "image_path": str(tmp_path / "missing.dcm")})


# -- 5b: scores on a scale that discriminates -----------------------------------------------------------
def test_scores_are_ranks_and_standard_scores(client):
    from gradio_client import handle_file

    hits = _parsed(client.predict(handle_file(rg1_path()), 8, api_name="/retrieve_by_image")[0])
    z = [h[1] for h in hits]
    assert z == sorted(z, reverse=True) and z[0] > 0 and z[0] - z[-1] > 0.5  # raw cosines span ~0.002 here
    by_text = _parsed(client.predict("small left pleural effusion", 4, api_name="/retrieve_by_text")[0])
    assert [h[0] for h in by_text] == [1, 2, 3, 4] and by_text[0][1] >= by_text[-1][1]


def test_relative_scores():
    import numpy as np

    from medclr.app.service import relative_scores

    z = relative_scores([0.9990, 0.9985, 0.9980, 0.9975, 0.9970])
    assert z == pytest.approx([1.414, 0.707, 0.0, -0.707, -1.414], abs=1e-3)
    assert relative_scores([0.9]).tolist() == [0.0] and np.all(relative_scores([0.5, 0.5]) == 0)


# -- 5c: captions show the hit's finding sentences, not the report's header -------------------------------
def test_captions_show_findings_sentences_not_the_header(client, manifest):
    from gradio_client import handle_file

    from medclr.data.hard_negatives import states_finding

    sents = dict(zip(manifest["index"].astype(int), manifest["sentences"]))
    galleries = [client.predict(handle_file(rg1_path()), 11, api_name="/retrieve_by_image")[0],
                 client.predict("small left pleural effusion", 6, api_name="/retrieve_by_text")[0]]
    seen_finding = False
    for gallery in galleries:
        for _, _, report, text in _parsed(gallery):
            assert "FINAL REPORT" not in text and "EXAMINATION" not in text and "INDICATION" not in text
            own = list(sents[report])
            stated = [s for s in own if states_finding(s)]
            assert text == (" ".join(stated[:2]) if stated else own[0]), (report, text)
            seen_finding |= bool(stated)
    assert seen_finding


def test_findings_caption_on_a_mimic_report():
    from medclr.app.service import findings_caption

    report = _mimic(["No pneumothorax.", "Heart size is normal.", "There is a small left pleural effusion."]) + \
        "\n IMPRESSION:\n\n Small left effusion.  Possible early pneumonia.\n"
    assert findings_caption(report) == "There is a small left pleural effusion. Small left effusion."
    assert findings_caption(_mimic(["No pneumothorax.", "Heart size is normal."])) == "No pneumothorax."
    assert findings_caption("") == ""


# -- 6a: the inspector shows the picked study's own sentences -----------------------------------------------
def test_inspector_table_is_the_picked_study_own_sentences(client, server, manifest, app_assets):  # noqa: F811
    import pandas as pd
    from gradio_client import handle_file

    from medclr.app.ui import _study_sentences

    eta = pd.read_parquet(app_assets["eta"]).set_index("sentence")["eta"]
    gallery = client.predict(handle_file(rg1_path()), 4, api_name="/retrieve_by_image")[0]
    for i, item in enumerate(gallery):
        report = _parsed([item])[0][2]
        study = _study_sentences(server[1], gallery, i, None)
        assert study["report"] == report and study["columns"] == ["sentence", "eta_LM", "zeta_txt"]
        assert [r[0] for r in study["rows"]] == list(manifest.set_index("index").at[report, "sentences"])
        for sentence, eta_lm, zeta_txt in study["rows"]:
            assert _significant_digits(eta_lm) <= 3 and eta_lm == pytest.approx(eta[sentence], rel=5e-3)
            assert _significant_digits(zeta_txt) <= 3
    # the gallery's select event value carries the caption too
    first = _study_sentences(server[1], None, 0, {"caption": gallery[0]["caption"]})
    assert first["report"] == _parsed(gallery)[0][2]
    assert _study_sentences(server[1], gallery, 9, None) == {}


def test_inspector_table_without_zeta_has_no_zeta_column(server):
    from medclr.app.service import AppService
    from medclr.data.text import sentence_hash
    from medclr.inference.stats import SentenceStats

    sents = server[1].report_sentences(3)
    stats = SentenceStats(eta={sentence_hash(sents[0]): 0.0123456789})
    columns, rows = AppService(SimpleNamespace(stats=stats), server[1].index).study_table(3)
    assert columns == ["sentence", "eta_LM"]
    assert rows == [[sents[0], 0.0123]] + [[s, None] for s in sents[1:]]


def test_pick_study_event_fills_heading_table_and_dropdown(server, manifest):
    import gradio as gr

    from medclr.app.ui import build_blocks

    demo = build_blocks(server[1])
    pick = next(fn for fn in demo.fns.values() if fn.api_name == "_pick_study")
    caption = "#1 · +1.20 SD · report 4 · x"
    heading, table, dropdown = pick.fn([("a.png", caption)], gr.SelectData(None, {"index": 0, "value": None}))
    sents = list(manifest.set_index("index").at[4, "sentences"])
    assert "Report 4" in heading
    assert [r[0] for r in table["value"]["data"]] == sents and table["value"]["headers"][:2] == ["sentence", "eta_LM"]
    assert dropdown["choices"] == sents and dropdown["value"] == sents[0]
    assert [fn.api_name for fn in demo.fns.values() if fn.api_name == "_pick_text_study"]  # text gallery too


# -- 6b: Clear empties every panel, the inspector included ------------------------------------------------
def test_clear_empties_every_panel_and_the_inspector(server):
    import gradio as gr

    from medclr.app.ui import build_blocks

    demo = build_blocks(server[1])
    clear = next(fn for fn in demo.fns.values() if fn.api_name == "_clear")
    written = {id(c) for fn in demo.fns.values() if fn is not clear for c in fn.outputs}
    assert written <= {id(c) for c in clear.outputs}
    ids = {getattr(c, "elem_id", None) for c in clear.outputs}
    assert {"upload", "study_title", "study_sentences", "inspected", "inspected_summary", "sentence", "similar",
            "by_text"} <= ids
    blanks = clear.fn()
    assert len(blanks) == len(clear.outputs)
    for component, update in zip(clear.outputs, blanks):
        assert update["value"] is None, component
        if isinstance(component, gr.Dropdown):
            assert update["choices"] == []
    # a new upload blanks what answered for the previous image: findings, heatmap, galleries, inspector
    reset = next(fn for fn in demo.fns.values() if fn.api_name == "_reset")
    assert {"findings", "findings_note", "heatmap", "similar", "study_sentences", "inspected", "sentence"} <= {
        getattr(c, "elem_id", None) for c in reset.outputs}
    assert all(update["value"] is None for update in reset.fn())
    # each blank is one the component accepts (Gradio's own postprocessing of an empty value)
    for component in clear.outputs:
        if isinstance(component, (gr.Dataframe, gr.Markdown, gr.JSON, gr.Gallery, gr.Textbox)):
            component.postprocess(None)
