"""Decoding at a reduced size (``medclr.io.reduced``, the batch scorer's read) against the full decode, on the
real chest CR of pydicom-data (RG1: MONOCHROME1, 15 bits, its own window; 1955 x 1841) as JPEG 2000
(lossless and lossy), as a JPEG file and as an 8-bit JPEG DICOM made from it here.

Tolerance of the model input (1 x C x C in [0, 1]; ImageNet normalisation multiplies by ~4.4): mean |d|
<= 0.003, 99th percentile <= 0.015, max <= 0.06. Measured on RG1
(docs/experiments/2026-11-23-reduced-decode-fidelity.md): mean 0.0020 / p99 0.011 / max 0.055 at 224 px
(scale 8), 0.0010 / 0.005 / 0.020 at 512 -> 480 (scale 2). The two paths shrink
with different anti-aliasing kernels (a wavelet low-pass or a DCT block mean, then a box, versus torch's
area resize); the difference sits on sharp edges (burnt-in labels, the collimator). For scale, on the same
image: translating the radiograph by ONE original pixel changes the input by mean 0.0015-0.0020, p99
0.009-0.012, max 0.043-0.055; a 2 % contrast change by mean 0.0023, p99 0.006-0.010. Training's own
augmentation (random crops of tens of pixels, contrast and brightness) is far larger. Content position:
phase correlation finds no shift (< 0.5 original pixel asserted; a wrong footprint origin shows 0.7-2.9).
"""

from __future__ import annotations

import io

import numpy as np
import pydicom
import pytest
import torch
from PIL import Image
from pydicom.encaps import encapsulate, get_frame
from pydicom.uid import JPEGBaseline8Bit

from medclr.errors import ImageReadError, MedclrError
from medclr.inference import Preprocess
from medclr.inference.preprocess import ImageFiles, collate_images, model_input, preprocess_decoded
from medclr.io import DecodedImage, read_image, read_image_reduced, read_image_with_caution
from medclr.io.dicom import _display_values, display
from medclr.io.reduced import decode_j2k, reduction
from tests.conftest_app import app_assets, engine, rg1_path  # noqa: F401 - fixtures

PRE = {"224": Preprocess(224), "512/480": Preprocess(480, 512)}
MEAN, P99, MAX = 0.003, 0.015, 0.06


def _jpeg_bytes(image: np.ndarray, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.round(image * 255).astype(np.uint8)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """name -> path: RG1 as JPEG 2000 lossless / lossy DICOM, a JPEG file, and an 8-bit JPEG DICOM with a window."""
    root = tmp_path_factory.mktemp("reduced")
    rg1 = read_image(rg1_path("RG1_UNCR.dcm"))
    (root / "rg1.jpg").write_bytes(_jpeg_bytes(rg1))
    ds = pydicom.dcmread(rg1_path("RG1_UNCR.dcm"))
    ds.PixelData = encapsulate([_jpeg_bytes(1.0 - rg1)])  # stored MONOCHROME1: bright lungs
    ds["PixelData"].is_undefined_length = True
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
    ds.WindowCenter, ds.WindowWidth = 120.0, 230.0  # clips the brightest and darkest few levels
    ds.save_as(root / "rg1_jpeg.dcm", enforce_file_format=True)
    return {"j2k_lossless": rg1_path("RG1_J2KR.dcm"), "j2k_lossy": rg1_path("RG1_J2KI.dcm"),
            "jpeg_file": str(root / "rg1.jpg"), "jpeg_dicom": str(root / "rg1_jpeg.dcm")}


def _shift_in_original_pixels(ref: torch.Tensor, x: torch.Tensor, original_per_crop_pixel: float) -> float:
    from skimage.registration import phase_cross_correlation

    shift = phase_cross_correlation(ref[0].numpy(), x[0].numpy(), upsample_factor=100)[0]
    return float(np.abs(shift).max()) * original_per_crop_pixel


@pytest.mark.parametrize("pre_name", list(PRE))
@pytest.mark.parametrize("source", ["j2k_lossless", "j2k_lossy", "jpeg_file", "jpeg_dicom"])
def test_reduced_input_matches_the_full_decode(sources, source, pre_name):
    pre = PRE[pre_name]
    full, caution = read_image_with_caution(sources[source])
    reduced, caution_reduced = read_image_reduced(sources[source], pre.resize_to)
    assert reduced.scale == {"224": 8, "512/480": 2}[pre_name]  # the reduced path ran
    assert (reduced.height, reduced.width) == full.shape == (1955, 1841) and caution_reduced == caution
    ref, geo = preprocess_decoded(DecodedImage.full(full), pre)
    x, geo_reduced = preprocess_decoded(reduced, pre)
    assert geo_reduced == geo  # the crop and its way back to the original: the full image's
    d = (x - ref).abs().flatten()
    assert float(d.mean()) <= MEAN and float(d.quantile(0.99)) <= P99 and float(d.max()) <= MAX
    assert _shift_in_original_pixels(ref, x, geo.original_h / geo.resize_h) < 0.5


def test_reduced_input_changes_the_embedding_and_scores_little(sources, engine):  # noqa: F811
    """The test checkpoint (random ResNet-18 at 224): its embeddings hardly see the difference."""
    pre = engine.preprocess
    for path in sources.values():
        ref = preprocess_decoded(DecodedImage.full(read_image(path)), pre)[0]
        x = preprocess_decoded(read_image_reduced(path, pre.resize_to)[0], pre)[0]
        feats = engine.image_features(torch.stack([ref, x]))
        emb = torch.nn.functional.normalize(feats.global_emb.float(), dim=1)
        assert float(emb[0] @ emb[1]) > 1 - 1e-4
        probs = engine.zero_shot_scores(feats)[1]
        assert np.abs(probs[0] - probs[1]).max() < 1e-3


def test_a_wrong_footprint_would_show(sources):
    """The geometry check has teeth: the J2K low-pass placed like a box average (origin 0) moves the content."""
    pre = PRE["224"]
    full = read_image(sources["j2k_lossless"])
    ref, geo = preprocess_decoded(DecodedImage.full(full), pre)
    good = read_image_reduced(sources["j2k_lossless"], pre.resize_to)[0]
    bad = DecodedImage(good.pixels, good.height, good.width, good.scale, 0.0, good.bits)
    x = preprocess_decoded(bad, pre)[0]
    assert _shift_in_original_pixels(ref, x, geo.original_h / geo.resize_h) > 2.0


def test_jpeg2000_levels_decode_pydicoms_values(tmp_path):
    """Level 0 of the Pillow/OpenJPEG decoder equals pydicom's decode (values and dtype) on the unsigned
    greyscale JPEG 2000 files of pydicom-data; the reduced levels have OpenJPEG's ceil(size / 2^r) size
    (1841 / 4 -> 461, which Pillow's own sizing rounds to 460)."""
    for name in ("RG1_J2KR.dcm", "RG1_J2KI.dcm", "RG3_J2KR.dcm", "RG3_J2KI.dcm", "MR2_J2KR.dcm", "MR2_J2KI.dcm"):
        ds = pydicom.dcmread(rg1_path(name))
        frame = get_frame(ds.PixelData, 0, number_of_frames=1)
        expected = ds.pixel_array
        np.testing.assert_array_equal(decode_j2k(frame, 0, expected.dtype), expected, err_msg=name)
    ds = pydicom.dcmread(rg1_path("RG1_J2KR.dcm"))
    level2 = decode_j2k(get_frame(ds.PixelData, 0, number_of_frames=1), 2, np.dtype(np.uint16))
    assert level2.shape == (489, 461) and level2.dtype == np.uint16


def test_what_decodes_whole(sources, tmp_path):
    """Uncompressed, PNG, too small for a reduction, and min-max scaled DICOM (no window: the range would be the
    reduced image's, not the file's) decode at full size, identical to the full read."""
    rg1 = rg1_path("RG1_UNCR.dcm")
    assert reduction(1955, 1841, 231) == 4 and reduction(1955, 1841, 230) == 8 and reduction(300, 300, 224) == 1
    no_window = pydicom.dcmread(sources["jpeg_dicom"])
    del no_window["WindowCenter"], no_window["WindowWidth"]
    no_window.save_as(tmp_path / "min_max.dcm")
    Image.fromarray(np.round(read_image(rg1) * 255).astype(np.uint8)).save(tmp_path / "rg1.png")
    for path, min_side in ((rg1, 224), (tmp_path / "rg1.png", 224), (sources["j2k_lossless"], 1000),
                           (tmp_path / "min_max.dcm", 224)):
        reduced = read_image_reduced(path, min_side)[0]
        assert reduced.scale == 1
        np.testing.assert_array_equal(reduced.pixels, read_image(path))


def test_reduced_read_keeps_the_readers_checks(sources, tmp_path):
    """The header caution, the modality refusal, the size guard and the not-a-radiograph gate (on the
    original size) are the full read's, with the same lines."""
    ds = pydicom.dcmread(sources["j2k_lossy"])
    ds.Modality = "OT"
    ds.save_as(tmp_path / "ot.dcm")
    full_note = read_image_with_caution(tmp_path / "ot.dcm")[1]
    assert full_note.startswith("modality OT") and read_image_reduced(tmp_path / "ot.dcm", 224)[1] == full_note
    ds.Modality = "US"
    ds.save_as(tmp_path / "us.dcm")
    for read in (lambda p, **kw: read_image_with_caution(p, **kw), lambda p, **kw: read_image_reduced(p, 224, **kw)):
        with pytest.raises(ImageReadError, match="modality US"):
            read(tmp_path / "us.dcm")
        with pytest.raises(ImageReadError, match="over the limit"):
            read(sources["jpeg_file"], max_pixels=10**6)
        with pytest.raises(ImageReadError, match="over the limit"):
            read(sources["j2k_lossy"], max_pixels=10**6)
    strip = np.tile(np.linspace(0, 1, 2600, dtype=np.float32), (600, 1))  # 4.3 : 1, decodes at 1/2
    (tmp_path / "strip.jpg").write_bytes(_jpeg_bytes(strip))
    reduced = read_image_reduced(tmp_path / "strip.jpg", 224)[0]
    assert reduced.scale == 2
    with pytest.raises(MedclrError) as full_error:
        preprocess_decoded(DecodedImage.full(read_image(tmp_path / "strip.jpg")), PRE["224"])
    with pytest.raises(MedclrError) as reduced_error:
        preprocess_decoded(reduced, PRE["224"])
    assert str(reduced_error.value) == str(full_error.value) and "2600x600" in str(full_error.value)


@pytest.mark.parametrize("name", ["RG1_UNCR.dcm", "MR2_UNCR.dcm", "693_UNCR.dcm", "CT_small.dcm", "mlut_18.dcm",
                                  "vlut_04.dcm", "MR_small.dcm"])
def test_display_table_is_the_pixelwise_pipeline(name):
    """The lookup table gives the very numbers of the pipeline run over the pixels: window (RG1, MR2), rescale
    + window on signed data (693), rescale and min-max (CT), a Modality LUT (mlut_18), a VOI LUT (vlut_04)."""
    ds = pydicom.dcmread(rg1_path(name))
    arr = ds.pixel_array
    np.testing.assert_array_equal(display(arr, ds), _display_values(arr, ds, None))


@pytest.mark.parametrize("height, width, scale, origin", [(37, 29, 4, -1.5), (36, 28, 4, -1.5), (35, 30, 8, 0.0)])
def test_box_resample_is_the_mean_over_each_cell(height, width, scale, origin):
    """Brute force: the decoded image is a step function (pixel k over [origin + s k, origin + s (k + 1)),
    clipped to the image, the last pixel reaching the far edge: with 36 rows the J2K low-pass footprints of
    level 2 end at 34.5); each output cell is its mean over the cell, here sampled at 1/64 pixel."""
    rng = np.random.default_rng(0)
    n_rows, n_cols = -(-height // scale), -(-width // scale)  # what the decoders give: ceil(size / s)
    pixels = rng.random((n_rows, n_cols)).astype(np.float32)
    out = DecodedImage(pixels, height, width, scale, origin).resample(11, 9)

    def brute(axis_len: int, n_in: int, n_out: int) -> np.ndarray:
        t = (np.arange(axis_len * 64) + 0.5) / 64  # sample points over [0, axis_len)
        k = np.clip(np.floor((t - origin) / scale).astype(int), 0, n_in - 1)
        cell = np.floor(t * n_out / axis_len).astype(int)
        w = np.zeros((n_out, n_in))
        np.add.at(w, (cell, k), 1.0)
        return w / w.sum(axis=1, keepdims=True)

    expected = brute(height, n_rows, 11) @ pixels.astype(np.float64) @ brute(width, n_cols, 9).T
    np.testing.assert_allclose(out, expected, atol=2e-3)


def test_loader_sends_8bit_sources_as_uint8(sources):
    """uint8 travel: round(255 x) of the same crop for 8-bit sources (JPEG), float32 for the 15-bit CR; a mixed
    batch collates to float; model_input turns uint8 back into x / 255."""
    pre = PRE["224"]
    files = ImageFiles([sources["jpeg_file"], rg1_path("RG1_UNCR.dcm")], pre, reduced=True, uint8=True)
    jpeg, cr = files[0], files[1]
    assert jpeg["tensor"].dtype == torch.uint8 and cr["tensor"].dtype == torch.float32
    x = preprocess_decoded(read_image_reduced(sources["jpeg_file"], pre.resize_to)[0], pre)[0]
    assert torch.equal(jpeg["tensor"], (x * 255).round().to(torch.uint8))
    batch = collate_images([jpeg, cr])
    assert batch["tensor"].dtype == torch.float32 and torch.equal(batch["tensor"][0], jpeg["tensor"].float() / 255)
    alone = collate_images([jpeg])
    assert alone["tensor"].dtype == torch.uint8
    assert torch.equal(model_input(alone["tensor"], "cpu"), batch["tensor"][:1])
    broken = ImageFiles(["/nonexistent.jpg"], pre, reduced=True, uint8=True)[0]
    assert not broken["ok"] and broken["tensor"].dtype == torch.uint8 and "file not found" in broken["error"]
