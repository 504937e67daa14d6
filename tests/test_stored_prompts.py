"""The CheX5 prompt embeddings a checkpoint stores (issue 34: a scorer that starts without the text tower)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from tests.conftest_app import app_assets  # noqa: F401 - fixture


def _with_stored_prompts(src: Path, dst: Path) -> Path:
    """A copy of ``src`` as training now writes it: the weights' SHA-256 in its metadata and the prompts stored."""
    from medclr.inference import load_checkpoint, weights_sha256
    from medclr.inference.metadata import read_metadata, write_metadata
    from medclr.inference.stored_prompts import save_prompt_embeddings
    from medclr.prompts import CHEX5_PROMPTS

    shutil.copytree(src, dst)
    sha = weights_sha256(dst)
    write_metadata(dst, dataclasses.replace(read_metadata(dst), weights_sha256=sha))
    save_prompt_embeddings(dst, load_checkpoint(dst).model, sha, CHEX5_PROMPTS)
    return dst


@pytest.fixture(scope="module")
def stored(app_assets, tmp_path_factory):  # noqa: F811
    return _with_stored_prompts(app_assets["checkpoint"], tmp_path_factory.mktemp("stored") / "ckpt")


def test_stored_embeddings_are_the_text_towers_and_the_engine_starts_without_it(stored):
    from medclr.inference import load_checkpoint
    from medclr.prompts import CHEX5_PROMPTS, prompt_embeddings

    full = load_checkpoint(stored)
    assert full.model.text_encoder is not None
    lean = load_checkpoint(stored, text=False)
    assert lean.model.text_encoder is None
    encoded = prompt_embeddings(lambda t: full._text(t, False), CHEX5_PROMPTS)
    got = lean.prompt_embeddings()
    assert list(got) == list(CHEX5_PROMPTS)
    for cls, (pos, neg) in encoded.items():
        torch.testing.assert_close(got[cls][0], pos, rtol=0, atol=1e-6)
        torch.testing.assert_close(got[cls][1], neg, rtol=0, atol=1e-6)
    assert lean.model.text_encoder is None  # the stored ones answered
    # a text to encode loads the tower from the same directory, with the loader's checks
    np.testing.assert_allclose(lean.embed_texts(["No pneumothorax."]), full.embed_texts(["No pneumothorax."]),
                               atol=1e-6)
    assert lean.model.text_encoder is not None and not lean.model.text_encoder.training


def test_stored_embeddings_for_other_weights_or_prompts_are_not_used(stored, tmp_path):
    from medclr.inference import load_checkpoint
    from medclr.inference.metadata import read_metadata, write_metadata
    from medclr.inference.stored_prompts import PROMPTS_NAME, read_prompt_embeddings
    from medclr.prompts import CHEX5_PROMPTS, copy_prompts

    sha = read_metadata(stored).weights_sha256
    assert read_prompt_embeddings(stored, sha, CHEX5_PROMPTS) is not None
    assert read_prompt_embeddings(stored, "0" * 64, CHEX5_PROMPTS) is None  # other weights
    assert read_prompt_embeddings(stored, None, CHEX5_PROMPTS) is None  # weights not verified
    other = copy_prompts()
    other["Edema"]["positive"] = ["Pulmonary oedema"]
    assert read_prompt_embeddings(stored, sha, other) is None  # other prompts

    # weights retrained in place, their new SHA-256 recorded, the old prompts file left behind: not used
    moved = tmp_path / "moved"
    shutil.copytree(stored, moved)
    write_metadata(moved, dataclasses.replace(read_metadata(moved), weights_sha256="f" * 64))
    engine = load_checkpoint(moved, text=False, verify_weights=False)
    assert engine.model.text_encoder is not None  # no usable stored prompts: the tower is loaded at once
    (moved / PROMPTS_NAME).write_bytes(b"\0" * 64)  # a damaged file is ignored too
    assert read_prompt_embeddings(moved, "f" * 64, CHEX5_PROMPTS) is None


def test_medclr_score_imports_no_transformers_and_scores_as_with_the_text_tower(stored, tmp_path):
    """`medclr score` with the default prompts never imports transformers; its table equals the table of a
    checkpoint without stored prompts (the text tower encodes them), column for column."""
    rng = np.random.default_rng(0)
    root = tmp_path / "films"
    root.mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (72, 64), dtype=np.uint8)).save(root / f"f{i}.png")
    plain = tmp_path / "plain"
    shutil.copytree(stored, plain)
    (plain / "prompt_embeddings.safetensors").unlink()
    probe = ("import sys\nfrom medclr.cli import main\nrc = main(sys.argv[1:])\n"
             "print('TRANSFORMERS', 'transformers' in sys.modules)\nsys.exit(rc)")
    tables = {}
    for name, ckpt in (("stored", stored), ("plain", plain)):
        out = tmp_path / f"{name}.parquet"
        done = subprocess.run([sys.executable, "-c", probe, "score", "--checkpoint", str(ckpt), "--input", str(root),
                               "--out", str(out), "--workers", "0", "--no-progress"],
                              capture_output=True, text=True, check=True)
        imported = done.stdout.strip().splitlines()[-1]
        assert imported == f"TRANSFORMERS {name == 'plain'}", (name, done.stdout, done.stderr[-2000:])
        tables[name] = pd.read_parquet(out).sort_values("path").reset_index(drop=True)
    a, b = tables["stored"], tables["plain"]
    assert list(a.columns) == list(b.columns) and len(a) == 4
    for col in a.columns:
        if a[col].dtype.kind == "f":
            np.testing.assert_allclose(a[col], b[col], atol=1e-6, err_msg=col)
        else:
            assert a[col].astype(str).tolist() == b[col].astype(str).tolist(), col


def test_a_checkpoint_calibrated_with_report_prompts_is_read_with_them(stored, tmp_path):
    """A findings record fitted with the report-style prompts (training's val.prompts=report) makes them the
    checkpoint's: stored for its weights (no text tower to score), the default of every zero-shot call, and the
    only set its calibration serves; a set this medclr lacks is one line."""
    from medclr.errors import MedclrError
    from medclr.findings import fit_findings
    from medclr.inference import load_checkpoint, weights_sha256
    from medclr.inference.metadata import read_metadata, write_metadata
    from medclr.inference.stored_prompts import save_prompt_embeddings
    from medclr.prompts import CHEX5, CHEX5_PROMPTS, CHEX5_REPORT_PROMPTS, checkpoint_prompts, prompt_embeddings

    rng = np.random.default_rng(0)
    labels = (rng.random((40, len(CHEX5))) < 0.5).astype(np.float64)
    record = fit_findings(labels + rng.normal(0, 0.5, labels.shape), labels, CHEX5, n_boot=50, prompts="report")
    dst = tmp_path / "report"
    shutil.copytree(stored, dst)
    meta = dataclasses.replace(read_metadata(dst), findings=record)
    write_metadata(dst, meta)
    save_prompt_embeddings(dst, load_checkpoint(dst).model, weights_sha256(dst), checkpoint_prompts(record)[1])

    lean = load_checkpoint(dst, text=False)
    assert lean.prompts_name == "report" and lean.default_prompts == CHEX5_REPORT_PROMPTS
    got = lean.prompt_embeddings()
    assert lean.model.text_encoder is None  # the stored report-style embeddings answered
    full = load_checkpoint(dst)
    for cls, (pos, neg) in prompt_embeddings(lambda t: full._text(t, False), CHEX5_REPORT_PROMPTS).items():
        torch.testing.assert_close(got[cls][0], pos, rtol=0, atol=1e-6)
        torch.testing.assert_close(got[cls][1], neg, rtol=0, atol=1e-6)
    image = rng.random((96, 96)).astype(np.float32)
    details = full.zero_shot_details(image)
    assert details[0]["positive_prompts"] == CHEX5_REPORT_PROMPTS[details[0]["class"]]["positive"]
    assert all(d["note"] is None or "calibrated for" not in d["note"] for d in details)
    paper = full.zero_shot_details(image, CHEX5_PROMPTS)
    assert {d["note"] for d in paper} == {"calibrated for the checkpoint's report prompts only: raw score"}

    write_metadata(dst, dataclasses.replace(meta, findings={**record, "prompts": "bogus"}))
    with pytest.raises(MedclrError, match="names prompt set 'bogus', which this medclr does not have"):
        load_checkpoint(dst)
