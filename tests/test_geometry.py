"""One resize/centre-crop geometry (medclr.geometry) for training, inference and evaluation (issue 16).

Fast: training's path is exercised through the plain functions its MONAI transforms call
(``medclr.training.data.load_resized``, ``medclr.training.data.centre_crop``), so MONAI is not imported.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from medclr.geometry import CropGeometry
from medclr.inference import Preprocess, preprocess_image

# (H, W, resize, crop): the issue's example both ways round, odd and even sizes, no-op resizes, enlarging,
# very tall and very wide (aspect up to 3.75, below the reader's limit of 4)
SHAPES = [(3056, 2544, 512, 480), (2544, 3056, 512, 480), (300, 200, 80, 64), (64, 96, 32, 32),
          (611, 777, 300, 299), (1955, 1841, 224, 224), (100, 333, 256, 225), (50, 40, 64, 63),
          (333, 100, 256, 225), (120, 450, 72, 64), (2000, 560, 72, 64)]


def _training_view(img: np.ndarray, resize: int, crop: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """Training's deterministic view of ``img`` and the crop origin (resized pixels) it used."""
    from medclr.training import data

    resized = data.load_resized(img, resize)
    h, w = resized.shape[-2:]
    index = torch.arange(h * w, dtype=torch.float64).reshape(1, h, w)
    origin = divmod(int(data.centre_crop(index, crop)[0, 0, 0]), w)
    return data.centre_crop(resized, crop), origin


def _evaluation_geometry(h: int, w: int, resize: int, crop: int) -> CropGeometry:
    """What `medclr eval` places heatmaps and box features with (``medclr.evaluation.data.Model.geometry``)."""
    from medclr.evaluation.data import Model

    return Model.geometry(SimpleNamespace(pre=Preprocess(crop, resize)), h, w)


def _box_image(h: int, w: int, box: tuple[int, int, int, int]) -> np.ndarray:
    x, y, bw, bh = box
    img = np.zeros((h, w), np.float32)
    img[y:y + bh, x:x + bw] = 1.0
    return img


@pytest.mark.parametrize("h, w, resize, crop", SHAPES)
def test_training_inference_and_evaluation_cut_the_same_crop(h, w, resize, crop):
    from medclr.evaluation.grounding import upsample_map

    # a box well inside the crop (the crop is centred and covers crop/resize of the shorter side)
    side = min(h, w) * crop / resize
    box = (int(w / 2 - side / 5), int(h / 2 - side / 4), max(4, int(side / 3)), max(4, int(side / 4)))
    img = _box_image(h, w, box)

    train_crop, train_origin = _training_view(img, resize, crop)
    infer_crop, infer_geo = preprocess_image(img, Preprocess(crop, resize))
    eval_geo = _evaluation_geometry(h, w, resize, crop)

    # one crop origin, one geometry, the same pixels
    assert train_origin == (infer_geo.crop_top, infer_geo.crop_left) == (eval_geo.crop_top, eval_geo.crop_left)
    assert infer_geo == eval_geo
    assert train_crop.shape == infer_crop.shape == (1, crop, crop) and torch.equal(train_crop, infer_crop)

    # the box lands where the geometry says, in crop pixels (within one pixel: resampling blurs its edge)
    x1, y1, x2, y2 = eval_geo.boxes_to_crop([box])[0]
    bright = np.argwhere(infer_crop[0].numpy() > 0.5)
    assert bright.size
    np.testing.assert_allclose(bright.min(0), [y1, x1], atol=1.0)
    np.testing.assert_allclose(bright.max(0) + 1, [y2, x2], atol=1.0)

    # evaluation's placement carries the crop back onto the drawn box (a grid of one cell per crop pixel)
    back = upsample_map(infer_crop[0].numpy(), eval_geo, (h, w), smooth_sigma=0)
    px = max(h / eval_geo.resize_h, w / eval_geo.resize_w) + 1  # one crop pixel, in original pixels
    found = np.argwhere(back > 0.5)
    x, y, bw, bh = box
    np.testing.assert_allclose(found.min(0), [y, x], atol=px)
    np.testing.assert_allclose(found.max(0) + 1, [y + bh, x + bw], atol=px)
    # and the NaN margin starts at the first original pixel whose centre lies in the crop
    rows, cols = eval_geo.crop_slices()
    finite = np.isfinite(back)
    assert finite[rows, cols].all() and finite.sum() == (rows.stop - rows.start) * (cols.stop - cols.start)
    top = eval_geo.crop_to_original(0.0, 0.0)[0]
    assert rows.start == int(np.ceil(top - 0.5))


def test_the_issue_example_crops_from_row_333_everywhere():
    """3056 x 2544 at 512 / 480: training crops from resized row 67 = original row 332.94; evaluation
    used to place heatmaps from row 338 (torchvision's rounding) and the app from 335 (hi-ml's square)."""
    geo = _evaluation_geometry(3056, 2544, 512, 480)
    assert (geo.resize_h, geo.resize_w, geo.crop_top, geo.crop_left) == (615, 512, 67, 16)
    assert geo.crop_to_original(0.0, 0.0)[0] == pytest.approx(332.94, abs=0.01)
    assert geo.box() == (333, 79, 2718, 2464)
    _, infer_geo = preprocess_image(_box_image(3056, 2544, (0, 0, 8, 8)), Preprocess(480, 512))
    app_map = infer_geo.to_original(np.zeros((15, 15)))  # what the app paints (medclr.inference)
    assert np.flatnonzero(np.isfinite(app_map).any(axis=1))[0] == 333
    # the app's display copy: the same crop, scaled
    small = infer_geo.resized(768, 639)
    assert small.box()[0] == int(np.ceil(332.94 * 768 / 3056 - 0.5))


def test_coordinate_maps_round_trip_and_reject_bad_crops():
    geo = CropGeometry.from_resize_crop((611, 777), 300, 299)
    y, x = np.array([0.0, 10.5, 610.0]), np.array([3.0, 400.25, 777.0])
    yy, xx = geo.crop_to_original(*geo.original_to_crop(y, x))
    np.testing.assert_allclose(yy, y)
    np.testing.assert_allclose(xx, x)
    with pytest.raises(ValueError):
        CropGeometry.from_resize_crop((100, 100), 32, 48)  # a crop larger than the resized image
