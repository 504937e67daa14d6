"""data.augment_on: intensity augmentation in the loader (MONAI, per item) or batched on the device.

The device path must give the loader path's views (same (seed, epoch, index) -> same view, to float32
rounding), with every transform exercised (probability 1) and with the default probabilities over
many items; the batched formulas are also checked against float64 references written out here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from medclr.errors import MedclrError
from medclr.training.augment import N_PARAMS, apply_on_device, augment_place, unit_float

N_IMAGES, EPOCHS = 12, 8


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    from medclr.training.data import TrainTable

    root = tmp_path_factory.mktemp("aug")
    rng = np.random.default_rng(0)
    paths = []
    for k in range(N_IMAGES):  # varied brightness and contrast, so min/range/mean differ per crop
        low, high = rng.uniform(0, 120), rng.uniform(130, 255)
        img = low + (high - low) * rng.random((40, 48))
        Image.fromarray(img.astype(np.uint8)).save(root / f"{k}.png")
        paths.append(str(root / f"{k}.png"))
    return TrainTable(paths=paths, sentences=[["a sentence."]] * N_IMAGES, eta=None,
                      manifest_index=np.arange(N_IMAGES), labels=None, fingerprint="aug")


def _datasets(table, *overrides):
    from medclr.training.config import load_config
    from medclr.training.data import PairDataset

    cfg = load_config("infonce", ["data.manifest=m", "out=o", "data.resize=36", "data.crop=32",
                                  "data.cache_workers=1", *overrides])
    return PairDataset(table, cfg), PairDataset(table, cfg, device_augment=True)


@pytest.mark.parametrize("prob", [1.0, None])
def test_device_views_equal_loader_views(table, prob):
    loader, device = _datasets(table, *([f"data.aug.prob={prob}"] if prob is not None else []))
    keys = [(e, i) for e in range(EPOCHS) for i in range(N_IMAGES)]
    items = [device[k] for k in keys]
    assert all(it["image"].dtype == torch.uint8 and it["image"].shape == (1, 32, 32) for it in items)
    params = torch.stack([it["augment"] for it in items])
    flags = params[:, 0::2]
    if prob == 1.0:
        assert bool((flags == 1).all())
    else:  # the default 0.5: each transform both applied and skipped among these items
        assert bool((flags.sum(0) > 0).all()) and bool((flags.sum(0) < len(keys)).all())
    views = apply_on_device(torch.stack([it["image"] for it in items]), params)  # one batch, per-item statistics
    for k, view in zip(keys, views):
        want = loader[k]["image"]
        assert want.dtype == torch.float32 and torch.allclose(view, want, atol=2e-6, rtol=0), \
            (k, float((view - want).abs().max()))


def test_views_depend_on_the_parameters(table):
    loader, device = _datasets(table, "data.aug.prob=1.0")
    for key in [(0, 3), (5, 7)]:
        item, want = device[key], loader[key]["image"]
        plain = unit_float(item["image"])  # the crop without its intensity parameters
        assert float((plain - want).abs().max()) > 1e-3
        for slot in (1, 3, 5):  # each value matters on its own
            other = item["augment"].clone()
            other[slot] += 0.05
            assert float((apply_on_device(item["image"][None], other[None])[0] - want).abs().max()) > 1e-4


def _reference(x: np.ndarray, p: np.ndarray) -> np.ndarray:
    """MONAI's three intensity formulas, item by item, in float64."""
    out = []
    for img, (s_on, offset, c_on, factor, g_on, gamma) in zip(x.astype(np.float64), p.astype(np.float64)):
        if s_on:
            img = img + offset
        if c_on:
            img = (img - img.mean()) * (1 + factor) + img.mean()
        if g_on:
            low, span = img.min(), img.max() - img.min()
            img = ((img - low) / (span + 1e-7)) ** gamma * span + low
        out.append(np.clip(img, 0, 1))
    return np.stack(out)


def test_batched_formulas_match_float64_reference():
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(5, 1, 9, 7, generator=g) * 255).round().to(torch.uint8)
    p = torch.tensor([[1, 0.08, 1, -0.15, 1, 1.2], [0, 0.3, 1, 0.2, 0, 2.0], [1, -0.1, 0, 0.5, 1, 0.8],
                      [0, 0.0, 0, 0.0, 0, 1.0], [1, 0.0, 1, 0.0, 1, 1.0]], dtype=torch.float32)
    assert p.shape[1] == N_PARAMS
    got = apply_on_device(x, p)
    want = _reference(x.numpy() / 255.0, p.numpy())
    assert np.abs(got.double().numpy() - want).max() < 2e-6
    assert torch.equal(got[3], x[3].float() / 255.0)  # nothing applied: the crop itself


def test_augment_place():
    assert augment_place("auto", torch.device("cpu")) == "loader"
    assert augment_place("auto", torch.device("cuda")) == "device"
    assert augment_place("device", torch.device("cpu")) == "device"
    with pytest.raises(MedclrError, match="data.augment_on 'gpu': expected auto, loader or device"):
        augment_place("gpu", torch.device("cpu"))
