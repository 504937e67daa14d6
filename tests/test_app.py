"""The real app on a free local port, driven through gradio_client (the named API endpoints), with a
small real checkpoint and index, the real RG1 DICOM from pydicom-data, and bad uploads."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.conftest_app import app_assets, engine, free_port, index_dir, rg1_path, served_app  # noqa: F401 - fixtures
from tests.dicom_factory import make_dicom

os.environ["HF_HUB_OFFLINE"] = "1"  # gradio_client's own telemetry (docs/app.md, "API")
CHEX5 = ("Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax")
PATIENT_NAME, PATIENT_ID = "Doe^Janet Secret", "MRN-778899"


@pytest.fixture(scope="module")
def server(engine, index_dir):  # noqa: F811
    with served_app(engine, index_dir, {"max_upload_bytes": 20 << 20}, max_file_size="20mb") as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    from gradio_client import Client

    return Client(server[0], verbose=False, analytics_enabled=False, download_files=False)


def _path(file_data) -> str:
    return file_data["path"] if isinstance(file_data, dict) else str(file_data)


@pytest.fixture(scope="module")
def identified_dicom(tmp_path_factory):
    """RG1 with a patient name and id written into its header (as a real archive file would have)."""
    import pydicom

    ds = pydicom.dcmread(rg1_path())
    ds.PatientName, ds.PatientID, ds.PatientBirthDate = PATIENT_NAME, PATIENT_ID, "19500101"
    out = tmp_path_factory.mktemp("phi") / "study.dcm"
    ds.save_as(out)
    return out


def test_upload_warnings_are_logged_without_the_file_name(engine, tmp_path, caplog):  # noqa: F811
    """A multi-frame DICOM warns with its path; a file name can be a patient's: the log shows neither."""
    import pydicom

    from medclr.app.service import AppService

    ds = pydicom.dcmread(rg1_path())
    frames = np.stack([ds.pixel_array, ds.pixel_array])
    name = "Doe_John_PID-7734921_multiframe.dcm"
    path = make_dicom(tmp_path / name, frames.astype(np.uint16))
    caplog.set_level(logging.DEBUG)
    AppService(engine, None).upload(str(path))
    assert "2 frames" in caplog.text  # the warning is kept, as a log line
    assert "Doe_John" not in caplog.text and "7734921" not in caplog.text and str(tmp_path) not in caplog.text


def test_header_values_never_become_markup(client, tmp_path):
    """A crafted header value (HTML, a Markdown link) is not echoed into the facts line."""
    import warnings

    import pydicom
    from gradio_client import handle_file

    ds = pydicom.dcmread(rg1_path())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom warns that these are not valid code strings: that is the point
        ds.Modality = 'CR <img src="http://host/x.png">'
        ds.ViewPosition = "[PA](http://host/)"
    path = tmp_path / "crafted.dcm"
    ds.save_as(path)
    _, facts = client.predict(handle_file(path), api_name="/preview")
    assert "1841 x 1955" in facts and "MONOCHROME1" in facts
    for bad in ("<", ">", "[", "](", "http", "img"):
        assert bad not in facts, facts
    assert "⚠ modality a non-standard value" in facts  # flagged, without echoing it


def test_secondary_capture_is_read_and_flagged(client, tmp_path):
    import pydicom
    from gradio_client import handle_file

    ds = pydicom.dcmread(rg1_path())
    ds.Modality = "OT"
    ds.save_as(tmp_path / "ot.dcm")
    _, facts = client.predict(handle_file(tmp_path / "ot.dcm"), api_name="/preview")
    assert "modality OT" in facts and "⚠ modality OT is not a radiograph modality" in facts


def test_binds_localhost_and_telemetry_is_off(server):
    assert server[0].startswith("http://127.0.0.1:")
    assert os.environ["GRADIO_ANALYTICS_ENABLED"] == "False"


def test_named_endpoints(client):
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert {"/zero_shot", "/ground", "/retrieve_by_image", "/retrieve_by_text", "/inspect_sentence"} <= names


def test_zero_shot_on_real_dicom(client):
    from gradio_client import handle_file

    label, table, note = client.predict(handle_file(rg1_path()), api_name="/zero_shot")
    probs = {c["label"]: c["confidence"] for c in label["confidences"]}
    assert set(probs) == set(CHEX5)  # the test checkpoint records no validation: every raw score, with the notice
    assert all(0.0 <= p <= 1.0 for p in probs.values()) and "Not validated" in note
    rows = {r[0]: r for r in table["data"]}
    assert rows["Pneumonia"][5] == "Findings suggesting pneumonia" and rows["Pneumonia"][6] == "No signs of pneumonia"
    assert rows["Cardiomegaly"][6] == "Heart size normal"
    assert abs(rows["Cardiomegaly"][1] - 100 * probs["Cardiomegaly"]) <= 0.51  # the labels' value, in whole percent


def test_ground_returns_overlay_with_contours(client, server):
    from gradio_client import handle_file

    image, legend = client.predict(handle_file(rg1_path()), "possible left pleural effusion", "relative", api_name="/ground")
    picture = np.asarray(Image.open(_path(image)).convert("RGB")).astype(int)
    up = server[1].upload(rg1_path())
    # the display copy of the 1955 x 1841 DICOM, and under it the colour bar that names the contours
    arr = picture[: up.display.shape[0]]
    assert picture.shape[1] == up.display.shape[1] and picture.shape[0] > up.display.shape[0]
    assert 700 <= max(arr.shape[:2]) <= 768
    # a hedged phrase: neither negated nor read as one finding, so drawn and said to be unchecked
    assert legend.startswith("Map of “possible left pleural effusion”: presence unchecked") and "contours" in legend
    colourful = np.abs(arr[..., 0] - arr[..., 2]) > 20  # the RdBu overlay is not grey
    assert colourful.mean() > 0.2
    # top/bottom margins outside the centre crop stay grey (NaN, no colour)
    top, _, _, _ = up.encoded.geometry.resized(*up.display.shape).box()
    assert top > 0 and not colourful[: top - 1].any()


def test_retrieval_by_image_and_text(client, app_assets):  # noqa: F811
    from gradio_client import handle_file

    from medclr.data.manifest import read_manifest

    rows = read_manifest(app_assets["manifest"])["sentences"]
    shown = {s for row in rows for s in row} | {" ".join(row) for row in rows}  # a caption's finding sentences
    gallery = client.predict(handle_file(rg1_path()), 5, api_name="/retrieve_by_image")[0]
    assert len(gallery) == 5
    # "#rank · z SD · report N · finding sentences"; RG1 itself (report 11) is in the index, never its own hit
    fields = [[x.strip() for x in g["caption"].split("·", 3)] for g in gallery]
    assert [f[0] for f in fields] == [f"#{i}" for i in range(1, 6)] and "report 11" not in [f[2] for f in fields]
    assert all(f[1].endswith(" SD") and f[3] in shown for f in fields)
    assert all(os.path.getsize(_path(g["image"])) > 0 for g in gallery)
    by_text = client.predict("small left pleural effusion", 3, api_name="/retrieve_by_text")[0]
    assert len(by_text) == 3 and all(c["caption"].split("·", 3)[3].strip() in shown for c in by_text)


def test_inspector_shows_eta_and_zeta(client, engine, app_assets):  # noqa: F811
    import pandas as pd
    from safetensors.numpy import load_file

    eta = pd.read_parquet(app_assets["eta"]).set_index("sentence")["eta"]
    state = load_file(str(app_assets["checkpoint"] / "loss_state.safetensors"))
    zeta = dict(zip(state["sample_manifest_index"].tolist(), state["loss.zeta_txt"].tolist()))
    out = client.predict("No pneumothorax.", api_name="/inspect_sentence")
    assert out["eta_LM"] == pytest.approx(eta["No pneumothorax."])
    assert out["reports_with_sentence"] >= 1
    assert out["zeta"]
    for rec in out["zeta"]:
        assert rec["zeta_txt"] == pytest.approx(float(zeta[rec["manifest_index"]]), abs=1e-6)


def test_bad_uploads_get_messages_not_crashes(client, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    corrupt = tmp_path / "scan.dcm"
    data = open(rg1_path(), "rb").read()
    corrupt.write_bytes(data[:5000])  # a truncated real DICOM
    notes = tmp_path / "notes.png"
    notes.write_text("this is not an image")
    huge = tmp_path / "huge.png"
    Image.new("L", (10_000, 10_000)).save(huge)  # compresses to ~100 kB, decodes to 100 Mpx
    assert huge.stat().st_size < 2 << 20
    cases = [(corrupt, ("cannot decode", "DICOM")), (notes, ("not a readable PNG/JPEG",)),
             (huge, ("10000x10000", "over the limit"))]
    for path, needles in cases:
        for endpoint, extra in (("/zero_shot", ()), ("/ground", ("effusion",)), ("/retrieve_by_image", ())):
            with pytest.raises(AppError) as err:
                client.predict(handle_file(path), *extra, api_name=endpoint)
            msg = str(err.value)
            assert all(n in msg for n in needles), msg
            assert "Traceback" not in msg and str(tmp_path) not in msg and "/tmp/gradio" not in msg
    with pytest.raises(AppError, match="phrase"):
        client.predict(handle_file(rg1_path()), "   ", api_name="/ground")
    with pytest.raises(AppError, match="describe|type"):
        client.predict("", api_name="/retrieve_by_text")[0]
    # the server is still fine
    label, _, _ = client.predict(handle_file(rg1_path()), api_name="/zero_shot")
    assert len(label["confidences"]) == 5


def test_oversized_upload_is_refused(client, tmp_path):
    from gradio_client import handle_file

    big = tmp_path / "big.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (3000, 3000), dtype=np.uint8)).save(big)  # ~9 MB of noise
    with open(big, "ab") as fh:
        fh.write(os.urandom(12 << 20))  # past the 20 MB limit of this server
    with pytest.raises(Exception) as err:
        client.predict(handle_file(big), api_name="/zero_shot")
    assert "413" in str(err.value) or "too large" in str(err.value).lower() or "size" in str(err.value).lower()


def test_patient_identifiers_never_shown_or_logged(client, identified_dicom, caplog):
    from gradio_client import handle_file

    caplog.set_level(logging.DEBUG)
    image, facts = client.predict(handle_file(identified_dicom), api_name="/preview")
    label, table, note = client.predict(handle_file(identified_dicom), api_name="/zero_shot")
    assert "MONOCHROME1" in facts and "1841 x 1955" in facts
    shown = str(facts) + str(label) + str(table) + str(note)
    logged = caplog.text
    for secret in (PATIENT_NAME, "Doe", PATIENT_ID, "19500101", "study.dcm"):
        assert secret not in shown and secret not in logged


def test_app_cli_help_and_bad_input(tmp_path, app_assets):  # noqa: F811
    env = dict(os.environ, OMP_NUM_THREADS="1")
    help_ = subprocess.run([sys.executable, "-m", "medclr", "app", "--help"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert help_.returncode == 0 and "examples:" in help_.stdout and "127.0.0.1" in help_.stdout
    bad = subprocess.run([sys.executable, "-m", "medclr", "app", "--checkpoint", str(tmp_path / "nope"),
                          "--index", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 1 and len(lines) == 1 and "no such directory" in lines[0]


def test_auth_parsing(tmp_path, monkeypatch):
    from medclr.app.cli import parse_auth
    from medclr.errors import MedclrError

    monkeypatch.delenv("MEDCLR_APP_AUTH", raising=False)
    assert parse_auth(None, None) is None
    f = tmp_path / "users.txt"
    f.write_text("# users\nalice:s3cret\nbob:pa:ss\n")
    assert parse_auth("carol:x", str(f)) == [("carol", "x"), ("alice", "s3cret"), ("bob", "pa:ss")]
    with pytest.raises(MedclrError, match="USER:PASSWORD"):
        parse_auth("nopassword", None)
    monkeypatch.setenv("MEDCLR_APP_AUTH", "dave:pw")
    assert parse_auth(None, None) == [("dave", "pw")]


def test_auth_is_enforced(engine):  # noqa: F811
    from gradio_client import Client

    from medclr.app.service import AppService
    from medclr.app.ui import build_blocks, launch

    demo = build_blocks(AppService(engine, None))
    _, url = launch(demo, port=free_port(), block=False, auth=[("alice", "s3cret")])
    try:
        from gradio_client.exceptions import AuthenticationError

        with pytest.raises(AuthenticationError):
            Client(url, verbose=False, analytics_enabled=False)
        ok = Client(url, auth=("alice", "s3cret"), verbose=False, analytics_enabled=False)
        from gradio_client.exceptions import AppError

        with pytest.raises(AppError, match="no retrieval index"):
            ok.predict("effusion", api_name="/retrieve_by_text")[0]
    finally:
        demo.close()


def test_gallery_pick_lists_the_report_sentences(server, app_assets):  # noqa: F811
    from medclr.app.ui import _study_sentences
    from medclr.data.manifest import read_manifest

    sents = list(read_manifest(app_assets["manifest"])["sentences"].iat[11])
    gallery = [("a.png", "#1 · +1.20 SD · report 3 · x"), ("b.png", "#2 · +0.80 SD · report 11 · y")]
    picked = _study_sentences(server[1], gallery, 1, None)
    assert picked["report"] == 11 and [row[0] for row in picked["rows"]] == sents
    assert [row[0] for row in _study_sentences(server[1], None, 0, {"caption": gallery[1][1]})["rows"]] == sents
    assert _study_sentences(server[1], gallery, 5, None) == {}


def test_text_and_number_inputs_are_capped(client, caplog):
    """Every text an endpoint takes is refused over MAX_TEXT_CHARS, k outside 1..MAX_RESULTS or not a whole
    number, the colour scale outside its two values: one clear line each, and no traceback in the log."""
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from medclr.app.service import MAX_RESULTS, MAX_TEXT_CHARS

    caplog.set_level(logging.DEBUG)
    long = "effusion " * (MAX_TEXT_CHARS // 9 + 1)
    png = handle_file(rg1_path())
    calls = [((png, long, "absolute"), "/ground", "phrase is"), ((long, 3), "/retrieve_by_text", "description is"),
             ((long,), "/inspect_sentence", "sentence is")]
    for k in (0, MAX_RESULTS + 1, 2.5, "abc", -1e308):
        calls += [(("effusion", k), "/retrieve_by_text", f"whole number from 1 to {MAX_RESULTS}"),
                  ((png, k), "/retrieve_by_image", f"whole number from 1 to {MAX_RESULTS}")]
    calls.append(((png, "effusion", "sideways"), "/ground", "'absolute' or 'relative'"))
    for args, api, needle in calls:
        with pytest.raises(AppError) as err:
            client.predict(*args, api_name=api)
        msg = str(err.value)
        assert needle in msg and "\n" not in msg and len(msg) < 200, (api, args[1:], msg)
    # at the cap itself: served
    assert client.predict("e" * MAX_TEXT_CHARS, MAX_RESULTS, api_name="/retrieve_by_text")[0]
    assert "Traceback" not in caplog.text
