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

    shutil.copytree(src, dst)
    sha = weights_sha256(dst)
    write_metadata(dst, dataclasses.replace(read_metadata(dst), weights_sha256=sha))
    save_prompt_embeddings(dst, load_checkpoint(dst).model, sha)
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
    from medclr.prompts import copy_prompts

    sha = read_metadata(stored).weights_sha256
    assert read_prompt_embeddings(stored, sha) is not None
    assert read_prompt_embeddings(stored, "0" * 64) is None  # other weights
    assert read_prompt_embeddings(stored, None) is None  # weights not verified
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
    assert read_prompt_embeddings(moved, "f" * 64) is None


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
