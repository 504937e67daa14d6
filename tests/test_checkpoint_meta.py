"""checkpoint_meta.json: the versioned record training writes and every reader reads, and the migration
of checkpoints made before it (side files under their old key spellings)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from medclr.errors import MedclrError
from medclr.inference import CheckpointMeta, read_metadata, write_metadata
from tests.conftest_app import app_assets  # noqa: F401 - fixtures

FULL = CheckpointMeta(image_size=480, resize=512, tau=0.07, loss="dcl_lm", eta_source="lm",
                      eta_table="/data/eta.parquet", manifest="/data/manifest.parquet", split="train",
                      data_fingerprint="abc123", n_train=2660, global_batch=64, step=200, total_steps=200,
                      last_loss=3.989)


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data) if path.suffix == ".yaml" else json.dumps(data))


def _nested(dotted: str, value) -> dict:
    out: dict = {}
    node = out
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def test_write_then_read_gives_the_same_record(tmp_path):
    path = write_metadata(tmp_path, FULL)
    raw = json.loads(path.read_text())
    assert path.name == "checkpoint_meta.json" and raw["format_version"] == 3 and "source" not in raw
    assert raw["image_size"] == 480 and raw["last_loss"] == 3.989
    meta = read_metadata(tmp_path)
    assert meta == FULL
    assert set(meta.source.values()) == {"checkpoint_meta.json"} and len(meta.source) == 14
    write_metadata(tmp_path, CheckpointMeta(image_size=64))  # replaced whole: unknown facts become null
    again = read_metadata(tmp_path)
    assert again == CheckpointMeta(image_size=64) and again.tau is None and set(again.source) == {"image_size"}
    assert not list(tmp_path.glob(".*.tmp*"))  # the atomic write left no temporary behind


# Every spelling a reader or writer used before the file existed: (side file, dotted key, field, value).
OLD_SPELLINGS = [
    ("preprocess.json", "image_size", "image_size", 96),  # training's own record until now
    ("preprocess.json", "resize", "resize", 112),
    ("config.json", "preprocess.image_size", "image_size", 96),
    ("config.json", "image.image_size", "image_size", 96),
    ("config.json", "preprocess.resize", "resize", 112),
    ("config.json", "image.resize", "resize", 112),
    ("train_config.yaml", "data.image_size", "image_size", 96),
    ("train_config.yaml", "data.crop_size", "image_size", 96),
    ("train_config.yaml", "model.image_size", "image_size", 96),
    ("train_config.json", "training.data.image_size", "image_size", 96),
    ("train_config.yaml", "data.crop", "image_size", 96),  # what training writes: evaluation's fallback
    ("train_config.yaml", "data.resize", "resize", 112),
    ("config.yaml", "training.data.resize", "resize", 112),
    ("train_config.yaml", "loss.tau", "tau", 0.05),
    ("config.json", "tau", "tau", 0.05),
    ("train_config.json", "training.loss.tau", "tau", 0.05),
    ("config.yaml", "inference.tau", "tau", 0.05),
    ("train_config.yaml", "data.eta", "eta_table", "/x/eta.parquet"),
    ("config.json", "eta_table", "eta_table", "/x/eta.parquet"),
    ("train_config.yaml", "data.eta_table", "eta_table", "/x/eta.parquet"),
    ("train_config.json", "training.data.eta", "eta_table", "/x/eta.parquet"),
    ("config.yaml", "inference.eta_table", "eta_table", "/x/eta.parquet"),
    ("train_config.yaml", "data.manifest", "manifest", "/x/manifest.parquet"),
    ("trainer_state.json", "manifest", "manifest", "/x/manifest.parquet"),
    ("train_config.json", "training.data.manifest", "manifest", "/x/manifest.parquet"),
    ("trainer_state.json", "loss", "loss", "nuclr"),
    ("trainer_state.json", "step", "step", 500),
    ("trainer_state.json", "total_steps", "total_steps", 1000),
    ("trainer_state.json", "global_batch", "global_batch", 64),
    ("trainer_state.json", "n_train", "n_train", 2660),
    ("trainer_state.json", "last_loss", "last_loss", 3.5),
]


@pytest.mark.parametrize("name, key, field, value", OLD_SPELLINGS, ids=[f"{n}:{k}" for n, k, _, _ in OLD_SPELLINGS])
def test_each_old_spelling_migrates(tmp_path, name, key, field, value):
    _write(tmp_path / name, _nested(key, value))
    meta = read_metadata(tmp_path)
    assert getattr(meta, field) == value and meta.source[field] == name
    if field != "image_size":
        assert meta.image_size == 224 and meta.source["image_size"] == "medclr.inference default"


def test_old_checkpoint_as_training_wrote_it_migrates_whole(tmp_path):
    """The three side files training wrote before checkpoint_meta.json (the demo checkpoint's layout)."""
    cfg = {"data": {"manifest": "/x/manifest.parquet", "eta": "/x/eta.parquet", "split": "train", "resize": 144,
                    "crop": 128}, "loss": {"name": "dcl_lm", "eta_source": "lm", "tau": 0.07}}
    _write(tmp_path / "preprocess.json", {"image_size": 128, "resize": 144})
    _write(tmp_path / "train_config.yaml", cfg)
    _write(tmp_path / "trainer_state.json", {"step": 200, "total_steps": 200, "loss": "dcl_lm", "global_batch": 64,
                                             "n_train": 2660, "last_loss": 3.989, "fingerprint": "f00d",
                                             "manifest": "/x/manifest.parquet", "config": cfg})
    meta = read_metadata(tmp_path)
    assert meta == CheckpointMeta(image_size=128, resize=144, tau=0.07, loss="dcl_lm", eta_table="/x/eta.parquet",
                                  manifest="/x/manifest.parquet", n_train=2660, global_batch=64, step=200,
                                  total_steps=200, last_loss=3.989)
    assert meta.source["image_size"] == "preprocess.json" and meta.source["manifest"] == "train_config.yaml"


def test_old_spellings_keep_their_order(tmp_path):
    # file order first (preprocess.json before the training files); data.crop only when nothing else says
    _write(tmp_path / "train_config.yaml", {"data": {"crop": 96, "resize": 100}})
    _write(tmp_path / "config.yaml", {"data": {"image_size": 64}})
    meta = read_metadata(tmp_path)
    assert (meta.image_size, meta.source["image_size"], meta.resize) == (64, "config.yaml", 100)
    _write(tmp_path / "preprocess.json", {"image_size": 80, "resize": 90})
    assert (read_metadata(tmp_path).image_size, read_metadata(tmp_path).resize) == (80, 90)
    # a file written now wins over every side file
    write_metadata(tmp_path, CheckpointMeta(image_size=48))
    assert read_metadata(tmp_path) == CheckpointMeta(image_size=48)


@pytest.mark.parametrize("key, stored, tau", [("loss.tau", 0.2, 0.2), ("log_tau", -2.0, math.exp(-2.0)),
                                               ("loss.logit_scale", 3.0, math.exp(-3.0))])
def test_old_tau_from_the_loss_state(tmp_path, key, stored, tau):
    from safetensors.torch import save_file

    save_file({key: torch.tensor([stored]), "loss.u_txt": torch.zeros(4)}, str(tmp_path / "loss_state.safetensors"))
    meta = read_metadata(tmp_path)
    assert meta.tau == pytest.approx(tau, rel=1e-6) and meta.source["tau"] == "loss_state.safetensors"
    _write(tmp_path / "train_config.yaml", {"loss": {"tau": 0.5}})  # the config's value comes first
    assert read_metadata(tmp_path).tau == 0.5


def test_relative_paths_resolve_against_the_checkpoint(tmp_path):
    _write(tmp_path / "train_config.yaml", {"data": {"eta": "eta.parquet"}})
    assert read_metadata(tmp_path).eta_table == str(tmp_path / "eta.parquet")
    write_metadata(tmp_path, CheckpointMeta(image_size=64, manifest="../m.parquet"))
    assert read_metadata(tmp_path).manifest == str(tmp_path / "../m.parquet")


def test_an_unreadable_old_side_file_is_skipped(tmp_path):
    (tmp_path / "train_config.yaml").write_text("data: [unclosed")
    _write(tmp_path / "preprocess.json", {"image_size": 64})
    assert read_metadata(tmp_path).image_size == 64


@pytest.mark.parametrize("content, message", [
    ({"format_version": 4, "image_size": 64}, r"format_version 4 is newer than this medclr reads \(3\)"),
    ({"format_version": "1", "image_size": 64}, r"format_version '1', expected an integer from 1 to 3"),
    ({"image_size": 64}, r"format_version None, expected an integer"),
    ({"format_version": 1, "resize": 64}, r"required field 'image_size' is missing"),
    ({"format_version": 1, "image_size": None}, r"required field 'image_size' is missing"),
    ({"format_version": 1, "image_size": "224"}, r"field 'image_size' is '224', expected int"),
    ({"format_version": 1, "image_size": 64, "tau": True}, r"field 'tau' is True, expected float"),
    ({"format_version": 1, "image_size": 64, "crop": 64}, r"unknown field 'crop'"),
    ([1, 2], r"expected a JSON object, got list"),
])
def test_bad_file_is_one_clear_line(tmp_path, content, message):
    (tmp_path / "checkpoint_meta.json").write_text(json.dumps(content))
    with pytest.raises(MedclrError, match=message) as err:
        read_metadata(tmp_path)
    assert str(err.value).startswith(str(tmp_path / "checkpoint_meta.json")) and "\n" not in str(err.value)


def test_bad_old_side_value_names_its_file(tmp_path):
    _write(tmp_path / "preprocess.json", {"image_size": "big"})
    with pytest.raises(MedclrError, match=r"preprocess.json: field 'image_size' is 'big', expected int"):
        read_metadata(tmp_path)


def test_unparsable_file_and_bad_write(tmp_path):
    (tmp_path / "checkpoint_meta.json").write_text("{not json")
    with pytest.raises(MedclrError, match=r"checkpoint_meta.json: unreadable \(JSONDecodeError"):
        read_metadata(tmp_path)
    with pytest.raises(MedclrError, match="field 'step' is 1.5, expected int"):
        write_metadata(tmp_path / "new", CheckpointMeta(image_size=64, step=1.5))
    assert not (tmp_path / "new" / "checkpoint_meta.json").exists()


@pytest.mark.parametrize("name, kwargs, tau", [("infonce", {"tau": 0.1}, 0.1), ("decl", {}, 0.07),
                                                ("siglip", {}, None)])
def test_training_records_the_tau_its_loss_used(name, kwargs, tau):
    """What training writes: the loss's own tau (its default when the config sets none), crop and resize."""
    from medclr.losses import build_loss
    from medclr.training.checkpoint import checkpoint_meta

    loss = build_loss(name, **kwargs, **({"num_samples": 8} if name == "decl" else {}))
    cfg = {"data": {"crop": 32, "resize": 36, "eta": None, "manifest": "m.parquet", "split": "train"},
           "loss": {"name": name, "eta_source": "none"}}
    state = {"config": cfg, "fingerprint": "f", "n_train": 8, "global_batch": 4, "step": 2, "total_steps": 4,
             "last_loss": 1.25}
    meta = checkpoint_meta(state, loss)
    assert meta.tau == tau and (meta.image_size, meta.resize, meta.loss, meta.step) == (32, 36, name, 2)
    assert meta.manifest == str(Path("m.parquet").resolve()) and meta.eta_table is None


def test_sentence_keyed_zeta_is_read_per_sentence(tmp_path):
    """A NUCLR run with loss.zeta_key: sentence saves zeta_txt per distinct sentence beside its hashes: the
    inspector reads it per sentence, never as if it were per report; zeta_img stays per report."""
    from safetensors.torch import save_file

    from medclr.data.text import sentence_hash
    from medclr.inference.checkpoint import SAMPLE_INDEX_KEY, TEXT_HASH_KEY, hash_to_int
    from medclr.inference.stats import SentenceStats

    texts = ["Large right pneumothorax.", "No pleural effusion.", "No pneumothorax."]  # more texts than reports
    save_file({"loss.zeta_txt": torch.tensor([0.3, -0.1, 0.2]), "loss.zeta_img": torch.tensor([0.5, 0.7]),
               SAMPLE_INDEX_KEY: torch.tensor([10, 11]),
               TEXT_HASH_KEY: torch.tensor([hash_to_int(sentence_hash(t)) for t in texts])},
              str(tmp_path / "loss_state.safetensors"))
    stats = SentenceStats.from_checkpoint(tmp_path, None)
    assert stats.has_zeta and stats.sentence_zeta("No pneumothorax.") == pytest.approx(0.2)
    assert stats.sentence_zeta("No   pneumothorax.") == pytest.approx(0.2)  # whitespace-normalised, as the hash
    assert stats.sentence_zeta("Not a training sentence.") is None
    assert stats.zeta(10) == {"img": pytest.approx(0.5)} and stats.zeta(11) == {"img": pytest.approx(0.7)}


def test_inspector_eta_is_the_eta_training_used(tmp_path):
    """The inspector reads the eta table through medclr.lm (its sentence_hash column) and, where training
    recomputed eta from the PLL (the checkpoint's eta_override), shows that eta, not the table's column."""
    import pandas as pd

    from medclr.data.text import sentence_hash
    from medclr.inference.stats import SentenceStats
    from medclr.lm.eta import TABLE_COLUMNS, eta_from_pll, write_eta_table

    sentences = ["No pneumothorax.", "Large right pneumothorax."]
    pll = np.array([-3.0, -12.0])
    table = pd.DataFrame({"sentence_hash": [sentence_hash(s) for s in sentences], "sentence": sentences,
                          "count": [5, 1], "n_tokens": [4, 6], "n_scored": [4, 6], "pll": pll,
                          "pll_per_token": pll / [4, 6], "eta": [0.11, 0.02]})[TABLE_COLUMNS]
    path = write_eta_table(table, tmp_path / "eta.parquet", {"norm": "sum", "eta_max": 0.5})
    own = SentenceStats.from_checkpoint(None, str(path))
    assert [own.eta(s) for s in sentences] == pytest.approx([0.11, 0.02])
    override = {"a": 0.5, "k": 0.2, "eta_max": 0.25}
    redone = SentenceStats.from_checkpoint(None, str(path), override)
    want = eta_from_pll(pll, a=0.5, k=0.2, eta_max=0.25)
    assert [redone.eta(s) for s in sentences] == pytest.approx(list(want)) and want[0] == 0.25 > want[1]


def test_checkpoint_records_the_eta_override_it_trained_with():
    from medclr.training.checkpoint import _eta_override

    cfg = {"loss": {"eta_source": "lm"}, "data": {"eta_a": 0.2, "eta_k": 0.35, "eta_max": 0.5}}
    assert _eta_override(cfg) == {"a": 0.2, "k": 0.35, "eta_max": 0.5}
    assert _eta_override({**cfg, "loss": {"eta_source": "true"}}) is None
    assert _eta_override({**cfg, "data": {"eta_a": None, "eta_k": None, "eta_max": 0.5}}) is None


def _with_recorded_sha(src: Path, dst: Path) -> Path:
    """A copy of a checkpoint whose checkpoint_meta.json records its weights' SHA-256, as training writes it."""
    import dataclasses
    import shutil

    from medclr.inference import weights_sha256

    shutil.copytree(src, dst)
    write_metadata(dst, dataclasses.replace(read_metadata(dst), weights_sha256=weights_sha256(dst)))
    return dst


def _damage(path: Path, at: float = 0.6, n: int = 4096) -> None:
    """Random bytes over the middle of the file: the safetensors header still parses."""
    data = bytearray(path.read_bytes())
    start = int(len(data) * at)
    data[start:start + n] = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def test_damaged_weights_are_refused_in_one_line(app_assets, tmp_path, monkeypatch):  # noqa: F811
    from medclr.inference import load_checkpoint
    from medclr.inference.load import TRUST_WEIGHTS_ENV

    ckpt = _with_recorded_sha(app_assets["checkpoint"], tmp_path / "ckpt")
    good = load_checkpoint(ckpt)
    assert good.weights_sha256 == read_metadata(ckpt).weights_sha256
    _damage(ckpt / "model.safetensors")
    with pytest.raises(MedclrError, match=r"model\.safetensors: its SHA-256 is not the one training recorded") as e:
        load_checkpoint(ckpt)
    assert "\n" not in str(e.value) and TRUST_WEIGHTS_ENV in str(e.value)
    # told to trust the file, the loader still refuses weights that are not finite
    monkeypatch.setenv(TRUST_WEIGHTS_ENV, "1")
    with pytest.raises(MedclrError, match=r"holds NaN or infinity: the file is damaged"):
        load_checkpoint(ckpt)


def test_weights_edited_on_purpose_load_when_trusted(app_assets, tmp_path, monkeypatch):  # noqa: F811
    from safetensors.torch import load_file, save_file

    from medclr.inference import load_checkpoint
    from medclr.inference.load import TRUST_WEIGHTS_ENV

    ckpt = _with_recorded_sha(app_assets["checkpoint"], tmp_path / "ckpt")
    weights = load_file(str(ckpt / "model.safetensors"))
    name = next(k for k, v in weights.items() if v.is_floating_point())
    weights[name] = weights[name] * 0.5  # finite, but not the recorded file
    save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(MedclrError, match="SHA-256"):
        load_checkpoint(ckpt)
    assert load_checkpoint(ckpt, verify_weights=False).weights_sha256 != read_metadata(ckpt).weights_sha256
    monkeypatch.setenv(TRUST_WEIGHTS_ENV, "1")
    load_checkpoint(ckpt)


def test_a_record_that_always_holds_the_weights_sha256_is_refused_without_it(app_assets, tmp_path, monkeypatch,  # noqa: F811
                                                                             caplog):
    """Issue 46: format 3 records the weights' SHA-256 at every save, so a format-3 record without it was edited
    (or not written by training): it is refused in one line, also when the weights were changed beside it; before,
    the loader logged "saved before medclr recorded one" and served the changed weights. A format-2 record (saved
    before medclr recorded one) still loads, with that warning; MEDCLR_TRUST_WEIGHTS=1 loads either."""
    import logging
    import shutil

    from safetensors.torch import load_file, save_file

    from medclr.cli import main as medclr_main
    from medclr.inference import load_checkpoint
    from medclr.inference.load import TRUST_WEIGHTS_ENV
    from medclr.inference.metadata import METADATA_NAME, WEIGHTS_SHA256_SINCE

    ckpt = tmp_path / "ckpt"
    shutil.copytree(app_assets["checkpoint"], ckpt)
    raw = json.loads((ckpt / METADATA_NAME).read_text())
    assert raw["format_version"] == 3 == WEIGHTS_SHA256_SINCE and raw["weights_sha256"]  # as training writes it
    weights = load_file(str(ckpt / "model.safetensors"))
    name = next(k for k, v in weights.items() if v.is_floating_point())
    weights[name] = weights[name] * 0.5  # finite, not the trained file
    save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    for stripped in ({k: v for k, v in raw.items() if k != "weights_sha256"}, {**raw, "weights_sha256": None}):
        (ckpt / METADATA_NAME).write_text(json.dumps(stripped))
        with pytest.raises(MedclrError, match=r"checkpoint_meta\.json: format_version 3 records the SHA-256 of the "
                                              r"weights at every save, but this one has no weights_sha256") as e:
            load_checkpoint(ckpt)
        assert "\n" not in str(e.value) and TRUST_WEIGHTS_ENV in str(e.value)
    assert medclr_main(["score", "--checkpoint", str(ckpt), "--input", str(tmp_path), "--out",
                        str(tmp_path / "r.parquet"), "--no-progress"]) == 1
    assert not (tmp_path / "r.parquet").exists()
    # a format-2 record: saved before medclr recorded the hash, loaded with the warning
    old = {k: v for k, v in raw.items() if k not in ("weights_sha256", "eta_override")} | {"format_version": 2}
    (ckpt / METADATA_NAME).write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING, logger="medclr.inference.load"):
        load_checkpoint(ckpt)
    assert any("saved before medclr recorded one" in r.getMessage() for r in caplog.records)
    (ckpt / METADATA_NAME).write_text(json.dumps({**raw, "weights_sha256": None}))
    monkeypatch.setenv(TRUST_WEIGHTS_ENV, "1")
    assert read_metadata(ckpt).lacks_weights_sha256
    assert torch.equal(load_checkpoint(ckpt).model.state_dict()[name], weights[name])  # trusted: the edited weights
