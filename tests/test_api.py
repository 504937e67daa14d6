"""The Python API (`medclr.load`): what it returns agrees with the engine's own paths, computed independently."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from medclr.errors import MedclrError
from tests.conftest_app import app_assets, index_dir  # noqa: F401 - fixtures


def test_import_medclr_is_light():
    """`import medclr` pays for no tower: torch is imported by medclr.load, not before."""
    code = "import sys, medclr; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


@pytest.fixture(scope="module")
def model(app_assets):  # noqa: F811
    import medclr

    return medclr.load(app_assets["checkpoint"])


def _test_images(app_assets, n):  # noqa: F811
    from pathlib import Path

    from medclr.data.manifest import read_manifest

    studies = read_manifest(app_assets["manifest"])
    return [Path(studies.attrs["root"]) / p for p in studies.image_path.iloc[:n]]


def test_retrieve_by_text_and_by_image_against_brute_force(model, app_assets, index_dir):  # noqa: F811
    from medclr.index import load_index

    image = _test_images(app_assets, 1)[0]
    index = load_index(index_dir, model)
    by_image = model.retrieve(index_dir, image=image, k=5)
    # brute force: cosines of the query's global embedding with every indexed image's, in float64
    paths = index.image_table["image_path"].tolist()
    everything = model.embed_images(paths).astype(np.float64)
    cosines = everything @ model.embed_images([image]).astype(np.float64)[0]
    np.testing.assert_allclose([h["score"] for h in by_image], np.sort(cosines)[::-1][:5], atol=1e-5)
    assert [h["image_path"] for h in by_image][0] == paths[int(np.argmax(cosines))]
    by_text = model.retrieve(index, text="small left pleural effusion", k=4)
    assert by_text == index.search_images_by_text(model.embed_texts(["small left pleural effusion"]), k=4)[0]
    assert len(by_text) == 4
    with pytest.raises(MedclrError, match="exactly one query"):
        model.retrieve(index, image=image, text="effusion")
    with pytest.raises(MedclrError, match="exactly one query"):
        model.retrieve(index)


def test_overlay_draws_the_ground_map_in_the_app_colours(model, app_assets):  # noqa: F811
    from matplotlib import colormaps

    from medclr.io import read_image

    image = _test_images(app_assets, 1)[0]
    picture, info = model.overlay(image, "left pleural effusion", scale="relative")
    heat = model.ground(image, "left pleural effusion")
    grey = read_image(image)
    assert picture.shape == (*grey.shape, 3) and picture.dtype == np.uint8
    assert info["min"] == pytest.approx(float(np.nanmin(heat))) and info["max"] == pytest.approx(float(np.nanmax(heat)))
    # a pixel off the contours: 0.5 grey + 0.5 RdBu_r of the map's relative value (rounding of the colour LUT aside)
    valid = np.argwhere(~np.isnan(heat))
    y, x = valid[len(valid) // 2]
    t = (heat[y, x] - info["lo"]) / (info["hi"] - info["lo"])
    colour = np.asarray(colormaps["RdBu_r"](t)[:3]) * 255.0
    expected = 0.5 * grey[y, x] * 255.0 + 0.5 * colour
    contour_colours = {(255, 255, 255), (255, 215, 0), (0, 0, 0)}
    if tuple(picture[y, x]) not in contour_colours:
        np.testing.assert_allclose(picture[y, x], expected, atol=3.0)
    # outside the crop (NaN) the radiograph shows unchanged
    outside = np.argwhere(np.isnan(heat))
    if len(outside):
        oy, ox = outside[0]
        np.testing.assert_allclose(picture[oy, ox], [grey[oy, ox] * 255.0] * 3, atol=1.0)
