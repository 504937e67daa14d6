"""medclr.inference: preprocessing geometry, zero-shot maths, grounding maps, checkpoint side files."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from medclr.errors import MedclrError
from medclr.inference import (
    CropGeometry,
    Preprocess,
    load_checkpoint,
    preprocess_image,
    read_metadata,
)
from medclr.prompts import CHEX5_PROMPTS
from tests.conftest_app import app_assets, engine, rg1_path  # noqa: F401 - fixtures


def test_crop_geometry_of_the_datasets_example():
    # docs/evaluation.md 1.1: 2544 x 3056 (W x H), R 512, C 480 -> a 2385-pixel square; training's crop starts at
    # resized row 67 (615 // 2 - 240) = original row 332.94, so NaN margins 79/80 (columns) and 333/338 (rows)
    # (hi-ml's floor-centred square would put the rows at 335/336: not the crop the model saw)
    geo = CropGeometry.from_resize_crop((3056, 2544), 512, 480)
    top, left, bottom, right = geo.box()
    assert bottom - top == right - left == 2385
    m = geo.to_original(np.arange(225, dtype=np.float32).reshape(15, 15))
    assert m.shape == (3056, 2544)
    cols = np.flatnonzero(~np.isnan(m).all(axis=0))
    rows = np.flatnonzero(~np.isnan(m).all(axis=1))
    assert (cols[0], 2544 - 1 - cols[-1]) == (79, 80)
    assert (rows[0], 3056 - 1 - rows[-1]) == (333, 338)
    assert np.nanmin(m) >= 0 and np.nanmax(m) <= 224


def test_preprocess_resizes_shorter_side_and_centre_crops():
    img = np.zeros((300, 200), np.float32)
    img[:, 100:] = 1.0  # right half bright
    t, geo = preprocess_image(img, Preprocess(64, 80))
    assert t.shape == (1, 64, 64) and t.dtype == torch.float32
    assert geo == CropGeometry.from_resize_crop((300, 200), 80, 64) == CropGeometry(300, 200, 120, 80, 28, 8, 64, 64)
    assert t[0, :, :30].mean() < 0.05 and t[0, :, 34:].mean() > 0.95  # orientation kept
    with pytest.raises(MedclrError):
        Preprocess(64, 32)


def test_preprocess_area_resize_and_monai_centre_crop():
    img = np.random.default_rng(0).random((64, 96)).astype(np.float32)
    t, geo = preprocess_image(img, Preprocess(32, 32))  # shorter side 64 -> 32: 2x2 block means, 32 x 48
    blocks = img.reshape(32, 2, 48, 2).mean(axis=(1, 3))
    np.testing.assert_allclose(t[0].numpy(), blocks[:, 8:40], atol=1e-6)  # start = 48 // 2 - 32 // 2 = 8


@pytest.mark.parametrize("image, message", [
    (np.full((1, 500), 0.5, np.float32), "not a radiograph"),
    (np.full((16384, 3), 0.5, np.float32), "not a radiograph"),
    (np.full((64, 64), np.nan, np.float32), "NaN or infinite"),
    (np.where(np.eye(64, dtype=bool), np.inf, 0.5).astype(np.float32), "NaN or infinite"),
])
def test_garbage_images_are_refused_not_scored(image, message):
    with pytest.raises(MedclrError, match=message):
        preprocess_image(image, Preprocess(32, 32))


@pytest.mark.slow  # importing MONAI (through training.data) alone takes 10-20 s on a busy 2-core machine
def test_preprocess_is_trainings_deterministic_view():
    data = pytest.importorskip("medclr.training.data", reason="training/ not present in this checkout")
    from monai.transforms import CenterSpatialCrop

    from medclr.io import read_image

    for resize, crop in ((512, 480), (256, 225)):
        theirs = data._load_resize_transform(resize, "float32")({"image": rg1_path()})["image"]
        theirs = torch.as_tensor(CenterSpatialCrop(roi_size=(crop, crop))(theirs))
        mine, _ = preprocess_image(read_image(rg1_path()), Preprocess(crop, resize))
        assert mine.shape == theirs.shape and torch.equal(mine, theirs)


def test_checkpoint_metadata_and_overrides(engine, app_assets, tmp_path):  # noqa: F811
    meta = read_metadata(app_assets["checkpoint"])
    assert meta.image_size == 224 and meta.source["image_size"] == "checkpoint_meta.json"
    assert meta.tau == 0.05 and meta.eta_table == str(app_assets["eta"]) and engine.meta == meta
    assert engine.preprocess == Preprocess(224, 224) and engine.tau == 0.05 and engine.stats.has_eta
    other = load_checkpoint(app_assets["other_checkpoint"], image_size=160)
    assert other.preprocess.image_size == 160 and other.tau == pytest.approx(1 / 14)  # no loss recorded
    assert not other.stats.has_eta and other.stats.has_zeta
    with pytest.raises(MedclrError, match="no such directory"):
        load_checkpoint(tmp_path / "missing")


def test_checkpoint_of_the_old_layout_loads_as_before(engine, app_assets, tmp_path):  # noqa: F811
    """A checkpoint from before checkpoint_meta.json: preprocess.json + train_config.yaml, as training wrote them."""
    old = tmp_path / "old"
    shutil.copytree(app_assets["checkpoint"], old)
    (old / "checkpoint_meta.json").unlink()
    (old / "preprocess.json").write_text(json.dumps({"image_size": 224, "resize": 224}))
    (old / "train_config.yaml").write_text(f"loss:\n  name: nuclr\n  tau: 0.05\ndata:\n  eta: {app_assets['eta']}\n")
    legacy = load_checkpoint(old)
    assert legacy.preprocess == engine.preprocess and legacy.tau == engine.tau == 0.05
    assert legacy.meta.source == {"image_size": "preprocess.json", "resize": "preprocess.json",
                                  "tau": "train_config.yaml", "eta_table": "train_config.yaml"}
    assert legacy.stats.eta("No pneumothorax.") == engine.stats.eta("No pneumothorax.") is not None


def test_zero_shot_is_softmax_over_prompt_pair(engine):  # noqa: F811
    enc = engine.encode(rg1_path())
    details = engine.zero_shot_details(enc)
    assert [d["class"] for d in details] == list(CHEX5_PROMPTS)
    for d in details:
        expect = torch.softmax(torch.tensor([d["score_negative"], d["score_positive"]]) / engine.tau, 0)[1]
        assert d["probability"] == pytest.approx(float(expect), abs=1e-6)
        assert d["positive_prompts"] == CHEX5_PROMPTS[d["class"]]["positive"]
    # same scores through the model's own head
    text = engine.embed_texts(["Pleural effusions", "No pleural effusions"])
    sims = engine.model.similarity(enc.features, torch.from_numpy(text)).numpy()[0]
    eff = next(d for d in details if d["class"] == "Pleural Effusion")
    assert sims[0] == pytest.approx(eff["score_positive"], abs=1e-5)
    assert sims[1] == pytest.approx(eff["score_negative"], abs=1e-5)


def test_prompt_sets_average_unnormalised_projections(engine):  # noqa: F811
    prompts = {"X": {"positive": ["Cardiomegaly", "Mild cardiomegaly is seen"], "negative": ["Heart size normal"]}}
    pos, _ = engine.prompt_embeddings(prompts)["X"]
    raw = engine.model.text_encoder.encode(prompts["X"]["positive"], normalize=False)
    expect = torch.nn.functional.normalize(raw.mean(0), dim=-1)
    assert torch.allclose(pos, expect, atol=1e-6)


def test_ground_map_at_original_resolution_nan_outside_crop(engine):  # noqa: F811
    m = engine.ground(rg1_path(), "left pleural effusion")
    assert m.shape == (1955, 1841)
    geo = engine.encode(rg1_path()).geometry
    top, left, bottom, right = geo.box()
    assert np.isnan(m[:top]).all() and np.isnan(m[bottom:]).all()
    assert not np.isnan(m[top:bottom, left:right]).any()
    assert np.nanmax(np.abs(m)) <= 1.0
    raw = engine.ground_grid(rg1_path(), "left pleural effusion", sigma=0)
    assert raw.shape == (7, 7)
    with pytest.raises(MedclrError, match="phrase"):
        engine.ground(rg1_path(), "  ")


def test_the_app_and_evaluation_draw_the_same_heatmap(engine):  # noqa: F811
    """One path for a map (medclr.inference.heatmap): the app's overlay (a display copy), the engine's map at the
    original size and evaluation's grounding map of the same grid are byte-identical arrays."""
    from medclr.app.service import AppService
    from medclr.evaluation import grounding as G

    phrase = "possible left pleural effusion"
    enc = engine.encode(rg1_path())
    grid = engine.region_grid(enc, phrase)
    evaluation = G.upsample_map(grid, enc.geometry)  # what medclr eval's CNR/mIoU are computed on
    assert engine.ground(rg1_path(), phrase).tobytes() == evaluation.tobytes()
    service = AppService(engine)
    shown = service.upload(rg1_path()).display.shape
    display = G.upsample_map(grid, enc.geometry.resized(*shown))
    assert engine.ground(enc, phrase, size=shown).tobytes() == display.tobytes()
    _image, legend = service.ground(rg1_path(), phrase, "relative")  # the app paints that array
    lo, hi = np.nanmin(display), np.nanmax(display)
    assert f"cosine range [{lo:.3f}, {hi:.3f}]" in legend


def test_embeddings_are_unit_and_workers_agree(engine, app_assets):  # noqa: F811
    paths = [rg1_path(), app_assets["images"] / "p00/s00.png", app_assets["images"] / "p01/s01.png"]
    a = engine.embed_images(paths)
    b = engine.embed_images(paths, batch_size=2, num_workers=1)
    np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    t = engine.embed_texts(["No pneumothorax.", "Heart size is normal."])
    assert t.shape == (2, engine.joint_dim)


def _edited_checkpoint(src, dst, edit):
    """A copy of checkpoint ``src`` whose model went through ``edit(model)`` (saved as `medclr train` would: the
    metadata records the new weights' SHA-256)."""
    import dataclasses
    import shutil

    from medclr.inference import read_metadata, weights_sha256, write_metadata
    from medclr.models import DualEncoder

    shutil.copytree(src, dst)
    model = DualEncoder.from_pretrained(dst)
    edit(model)
    model.save_pretrained(dst)
    write_metadata(dst, dataclasses.replace(read_metadata(dst), weights_sha256=weights_sha256(dst)))
    return dst


def test_untrained_lse_nl_head_is_refused_in_one_line(app_assets, tmp_path):  # noqa: F811
    ckpt = _edited_checkpoint(app_assets["checkpoint"], tmp_path / "untrained",
                              lambda m: setattr(m.head, "trained", False))
    with pytest.raises(MedclrError, match="never trained") as exc:
        load_checkpoint(ckpt)
    assert "\n" not in str(exc.value)


def test_flat_map_is_not_painted(app_assets, tmp_path):  # noqa: F811
    """Every region cell equal (projection weights zero): the map is flat, and the app says so instead of
    stretching a colour scale over it; the trained fixture's map is painted."""
    from medclr.app.service import AppService
    from medclr.inference.heatmap import MIN_MAP_RANGE, has_localised_signal, map_range

    def flatten(model):
        with torch.no_grad():
            model.image_encoder.proj.weight.zero_()

    flat = load_checkpoint(_edited_checkpoint(app_assets["checkpoint"], tmp_path / "flat", flatten))
    grid = flat.ground_grid(rg1_path(), "possible left pleural effusion")
    assert map_range(grid) < 1e-6 and not has_localised_signal(grid)
    image, legend = AppService(flat).ground(rg1_path(), "possible left pleural effusion", "relative")
    assert "no localised signal" in legend and f"{MIN_MAP_RANGE:.2f}" in legend
    assert (image[..., 0] == image[..., 2]).all()  # the grey radiograph (and its R/L markers) alone: no colour
