"""Shipped models (issue 44): `medclr models pack` writes a folder from a small checkpoint into a temporary root
(MEDCLR_PRETRAINED_DIR), and every place that takes a checkpoint opens it by name, offline, with its files checked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from medclr.errors import MedclrError
from medclr.pretrained import ROOT_ENV, SUMS_NAME, available, folder_size, read_sums, resolve, verify
from tests.conftest_app import build_text_model, make_checkpoint

NAMES = ["tiny", "tiny-fp16"]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> dict:
    """A 64 px checkpoint packed twice into a temporary root: float32 with an eval report and a provenance folder,
    and float16; plus two phantom PNGs."""
    from PIL import Image

    from medclr.export.pack import pack, phantom_images

    base = tmp_path_factory.mktemp("pretrained")
    ckpt = make_checkpoint(base / "ckpt", build_text_model(str(base)), image_size=64)
    report = base / "eval"
    report.mkdir()
    (report / "metrics.json").write_text(json.dumps({"checkpoint": str(ckpt), "split": "test", "n_images_encoded": 4,
                                                     "summary": {"AUC": 0.61234, "ACC": 0.55, "CNR": None}}))
    record = base / "record"
    record.mkdir()
    (record / "commands.sh").write_text("medclr train --config dcl_lm seed=0 out=ckpt\n")
    images = base / "images"
    images.mkdir()
    for k, arr in enumerate(phantom_images(2, 96)):
        Image.fromarray(arr).save(images / f"study{k}.png")
    root = base / "root"
    out32 = pack(ckpt, "tiny", where=root, report=report, provenance=record, description="a test model")
    out16 = pack(ckpt, "tiny-fp16", where=root, fp16=True)
    return {"root": root, "checkpoint": ckpt, "images": images, "report": report, "tiny": out32, "tiny-fp16": out16}


@pytest.fixture
def env(shipped, monkeypatch):
    monkeypatch.setenv(ROOT_ENV, str(shipped["root"]))
    return shipped


def test_the_folder_holds_the_inference_files_provenance_and_sums(env):
    folder = env["root"] / "tiny"
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    top = {f for f in files if "/" not in f}
    assert top == {"config.json", "model.safetensors", "checkpoint_meta.json", "prompt_embeddings.safetensors",
                   "model.json", SUMS_NAME}  # no loss_state.safetensors: training's, not inference's
    assert {"provenance/commands.sh", "provenance/pack.json", "provenance/model_card.md",
            "provenance/eval/metrics.json"} <= files and any(f.startswith("tokenizer/") for f in files)
    assert set(read_sums(folder)) == files - {SUMS_NAME}
    if shutil.which("sha256sum"):  # the format the coreutils tool checks
        check = subprocess.run(["sha256sum", "--check", "--quiet", SUMS_NAME], cwd=folder, capture_output=True)
        assert check.returncode == 0, check.stdout + check.stderr
    model = json.loads((folder / "model.json").read_text())
    assert model["name"] == "tiny" and model["dtype"] == "float32" and model["description"] == "a test model"
    assert model["headline"] == {"AUC": 0.6123, "ACC": 0.55} and model["headline_source"].startswith("provenance/eval")
    assert model["recipe"] == "loss not recorded, lse_nl head, resnet18" and model["image_size"] == 64
    meta = json.loads((folder / "checkpoint_meta.json").read_text())
    assert meta["weights_sha256"] == model["weights_sha256"] == read_sums(folder)["model.safetensors"]
    assert env["tiny"]["size_bytes"] == folder_size(folder) and env["tiny"]["path"] == str(folder)
    pack_json = json.loads((folder / "provenance" / "pack.json").read_text())
    assert pack_json["source"] == str(env["checkpoint"].resolve()) and pack_json["dtype"] == "float32"
    card = (folder / "provenance" / "model_card.md").read_text()
    assert "# medclr dual encoder `tiny`" in card and 'medclr.load("tiny")' in card
    assert not any(p.name.startswith(".pack-") for p in env["root"].iterdir())


def test_fp16_weights_load_into_float32_and_score_within_1e_2(env):
    from safetensors import safe_open

    import medclr
    from medclr.export.pack import phantom_images
    from medclr.models.dual import DualEncoder

    with safe_open(str(env["root"] / "tiny-fp16" / "model.safetensors"), framework="pt") as fh:
        stored = {k: fh.get_tensor(k) for k in fh.keys()}
    assert {t.dtype for t in stored.values() if t.is_floating_point()} == {torch.float16}
    model = DualEncoder.from_pretrained(env["root"] / "tiny-fp16")
    state = model.state_dict()
    assert all(state[k].dtype == torch.float32 and torch.equal(state[k], t.float())
               for k, t in stored.items() if t.is_floating_point())
    m16, m32, src = medclr.load("tiny-fp16"), medclr.load("tiny"), medclr.load(env["checkpoint"])
    batch = torch.stack([src.prepare(x)[0] for x in phantom_images(4, 64)])
    probs = {k: m.zero_shot_scores(m.image_features(batch))[1] for k, m in (("16", m16), ("32", m32), ("src", src))}
    assert np.abs(probs["16"] - probs["src"]).max() < 1e-2 and np.abs(probs["32"] - probs["src"]).max() < 1e-6
    assert 0 < env["tiny-fp16"]["cast"]["max_probability_change"] < 1e-2
    assert env["tiny"]["cast"]["max_probability_change"] < 1e-6 and env["tiny-fp16"]["size_bytes"] < env["tiny"]["size_bytes"]


def test_score_by_name_in_a_fresh_home_offline(env, tmp_path):
    """A real `medclr score --checkpoint NAME` subprocess: HOME empty, the hub offline; the prompts come from the
    shipped folder (no text tower), and the scores are those of the model loaded by name in Python."""
    import medclr

    home = tmp_path / "home"
    home.mkdir()
    run_env = dict(os.environ, HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
                   **{ROOT_ENV: str(env["root"])})
    out = tmp_path / "scores.parquet"
    proc = subprocess.run([sys.executable, "-m", "medclr", "score", "--checkpoint", "tiny-fp16", "--input",
                           str(env["images"]), "--out", str(out), "--workers", "0", "--no-progress", "--threads", "1",
                           "--full-decode"], capture_output=True, text=True, env=run_env, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(out).sort_values("path")
    assert df["path"].tolist() == ["study0.png", "study1.png"]
    model = medclr.load("tiny-fp16")
    for _, row in df.iterrows():
        expected = model.zero_shot(env["images"] / row["path"])
        assert all(abs(row[c] - p) < 1e-5 for c, p in expected.items())
    assert not (home / ".cache" / "huggingface").exists()  # no hub lookup wrote a cache


def test_a_file_changed_after_packing_is_refused_in_one_line(env, tmp_path, monkeypatch, capsys):
    from medclr.cli import main

    root = tmp_path / "root"
    shutil.copytree(env["root"] / "tiny", root / "tiny")
    monkeypatch.setenv(ROOT_ENV, str(root))
    resolve("tiny")  # intact
    changed = sorted((root / "tiny" / "tokenizer").glob("*.json"))[0]
    changed.write_text(changed.read_text() + " ")
    with pytest.raises(MedclrError) as exc:
        resolve("tiny")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(changed)) and SUMS_NAME in msg
    assert main(["score", "--checkpoint", "tiny", "--input", str(env["images"]), "--out",
                 str(tmp_path / "s.parquet"), "--threads", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(changed) in err[0] and not (tmp_path / "s.parquet").exists()
    shutil.copy(env["root"] / "tiny" / changed.relative_to(root / "tiny"), changed)  # restored: accepted again
    verify(root / "tiny")
    (root / "tiny" / "notes.txt").write_text("added")
    with pytest.raises(MedclrError, match=r"notes\.txt: not in SHA256SUMS"):
        resolve("tiny")


def test_an_unknown_name_is_one_line_listing_the_shipped(env, tmp_path, capsys):
    import medclr
    from medclr.cli import main

    expected = "no checkpoint folder or shipped model named 'nope' (no such directory); shipped: tiny, tiny-fp16 " \
               "(medclr models)"
    with pytest.raises(MedclrError) as exc:
        medclr.load("nope")
    assert str(exc.value) == expected
    for argv in (["export", "--checkpoint", "nope", "--format", "hf", "--out", str(tmp_path / "hf")],
                 ["eval", "--checkpoint", "nope", "--manifest", str(tmp_path), "--out", str(tmp_path / "e")],
                 ["app", "--checkpoint", "nope"]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].endswith(expected), err
    assert resolve(env["checkpoint"]) == env["checkpoint"]  # a path is returned as it is


def test_models_lists_what_ships(env, capsys):
    from medclr.cli import main

    run_env = dict(os.environ, **{ROOT_ENV: str(env["root"])})
    proc = subprocess.run([sys.executable, "-m", "medclr", "models", "--json"], capture_output=True, text=True,
                          env=run_env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert [m["name"] for m in listed] == NAMES and listed == available()
    assert [m["dtype"] for m in listed] == ["float32", "float16"]
    assert [m["size_bytes"] for m in listed] == [folder_size(env["root"] / n) for n in NAMES]
    assert listed[0]["headline"] == {"AUC": 0.6123, "ACC": 0.55} and listed[1]["headline"] == {}
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "size", "dtype", "steps", "recipe", "headline"]
    assert lines[1].startswith("tiny ") and "AUC 0.612, ACC 0.550" in lines[1] and lines[2].startswith("tiny-fp16 ")


def test_pack_refuses_what_it_cannot_ship(env, tmp_path):
    from safetensors.torch import save_file

    from medclr.export.pack import cast_weights, pack

    with pytest.raises(MedclrError, match="exists; pass --overwrite"):
        pack(env["checkpoint"], "tiny", where=env["root"])
    with pytest.raises(MedclrError, match="--name 'Bad/Name'"):
        pack(env["checkpoint"], "Bad/Name", where=tmp_path)
    clash = tmp_path / "record"
    (clash / "eval").mkdir(parents=True)
    with pytest.raises(MedclrError, match="holds eval, which the packer writes"):
        pack(env["checkpoint"], "x", where=tmp_path / "root", provenance=clash)
    assert not (tmp_path / "root" / "x").exists() and not list((tmp_path / "root").glob(".pack-*"))
    save_file({"w": torch.tensor([1.0, 1e6])}, str(tmp_path / "big.safetensors"))
    with pytest.raises(MedclrError, match="'w' reaches 1e\\+06, beyond float16's range"):
        cast_weights(tmp_path / "big.safetensors", tmp_path / "half.safetensors")


def test_overwrite_replaces_a_shipped_model(env, tmp_path):
    from medclr.export.pack import pack

    root = tmp_path / "root"
    shutil.copytree(env["root"] / "tiny", root / "tiny")
    out = pack(env["checkpoint"], "tiny", where=root, fp16=True, overwrite=True,
               images=[str(p) for p in sorted(env["images"].glob("*.png"))])
    assert out["dtype"] == "float16" and out["cast"]["n_images"] == 2 and sorted(p.name for p in root.iterdir()) == ["tiny"]
    assert not (root / "tiny" / "provenance" / "commands.sh").exists()  # the old folder is gone, not merged
    verify(root / "tiny")


@pytest.mark.parametrize("name", NAMES)
def test_opened_by_name_it_gives_the_probabilities_its_pack_recorded(env, name):
    """model.json records the packed model's zero-shot probabilities on fixed phantom renders; opened by name (files
    checked against SHA256SUMS) it gives them again, to 1e-4."""
    import medclr
    from medclr.export.pack import phantom_images

    cast = json.loads((env["root"] / name / "model.json").read_text())["cast"]
    model = medclr.load(name)
    batch = torch.stack([model.prepare(x)[0] for x in phantom_images(cast["n_images"], model.preprocess.resize_to)])
    classes, prob, _, _ = model.zero_shot_scores(model.image_features(batch))
    assert list(classes) == cast["classes"] and np.asarray(cast["probabilities"]).shape == prob.shape
    assert np.abs(prob - np.asarray(cast["probabilities"])).max() < 1e-4


def test_demo_serves_a_shipped_model_without_training(env, tmp_path):
    """`medclr demo --no-serve` on a tiny phantom: data and an index built with the shipped model by name; no LM,
    no eta table, no training (its outputs are never made)."""
    run_env = dict(os.environ, HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
                   **{ROOT_ENV: str(env["root"])})
    work = tmp_path / "demo"
    argv = [sys.executable, "-m", "medclr", "demo", "--no-serve", "--workdir", str(work), "--n", "12",
            "--eval-per-class", "2", "--model", "tiny-fp16", "--no-progress"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=run_env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[3/3] build the retrieval index (tiny-fp16)" in proc.stdout
    index = json.loads((work / "index" / "tiny-fp16" / "index_manifest.json").read_text())
    held_out = pd.read_parquet(work / "manifest.parquet").query("split in ('validate', 'test')")
    assert index["counts"]["images"] == len(held_out) > 0  # the studies the model never trained on
    assert not any((work / name).exists() for name in ("lm", "eta.parquet", "checkpoint", "report"))
    again = subprocess.run(argv, capture_output=True, text=True, env=run_env, timeout=300)
    assert again.returncode == 0 and again.stdout.count(": cached (") == 3  # a second run goes straight to the app
    wrong = subprocess.run([*argv[:-3], "--preset", "cpu_small"], capture_output=True, text=True, env=run_env,
                           timeout=120)
    assert wrong.returncode == 1 and wrong.stderr.strip().endswith(
        "--preset cpu_small is a training preset: add --train to train with it")


def test_the_app_names_the_shipped_model_it_serves(env):
    """The app's first line: a shipped model by its name, with the findings its validation record says it reads."""
    import medclr
    from medclr.app.service import model_line

    line = model_line(medclr.load("tiny"))
    assert line.startswith("Serving the shipped model **tiny**") and str(env["root"]) not in line
    assert model_line(medclr.load(env["checkpoint"])).startswith("Serving the checkpoint **ckpt**")
