"""Radiograph I/O on real bytes: the pydicom-data chest CR, pydicom-written twins, PIL files."""

from __future__ import annotations

import warnings

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.data import get_testdata_file

from medclr.errors import ImageReadError
from medclr.io import read_header, read_image
from tests.dicom_factory import make_dicom


@pytest.fixture(scope="module")
def rg1_uncr():
    return get_testdata_file("RG1_UNCR.dcm")


@pytest.fixture(scope="module")
def rg1(rg1_uncr):
    return read_image(rg1_uncr)


def test_rg1_is_float_unit_range(rg1):
    assert rg1.dtype == np.float32 and rg1.shape == (1955, 1841)
    assert 0.0 <= rg1.min() < 0.3 and 0.9 < rg1.max() <= 1.0


def test_rg1_lungs_darker_than_spine_and_mediastinum(rg1):
    h, w = rg1.shape
    rows = slice(int(0.3 * h), int(0.6 * h))
    spine = rg1[rows, int(0.47 * w) : int(0.53 * w)].mean()
    right_lung = rg1[rows, int(0.2 * w) : int(0.3 * w)].mean()
    left_lung = rg1[rows, int(0.7 * w) : int(0.8 * w)].mean()
    assert spine > right_lung + 0.1 and spine > left_lung + 0.1


def test_jpeg2000_lossless_decodes_to_uncompressed_twin(rg1):
    j2k = read_image(get_testdata_file("RG1_J2KR.dcm"))
    np.testing.assert_array_equal(j2k, rg1)


def test_lossy_pair_matches_but_differs_from_lossless(rg1):
    unci = read_image(get_testdata_file("RG1_UNCI.dcm"))
    j2ki = read_image(get_testdata_file("RG1_J2KI.dcm"))
    np.testing.assert_array_equal(unci, j2ki)
    assert np.abs(unci - rg1).max() > 0  # UNCI is the decoded lossy file, not RG1_UNCR


def test_monochrome2_twin_reads_identically(tmp_path, rg1_uncr, rg1):
    ds = pydicom.dcmread(rg1_uncr)
    top = 2**ds.BitsStored - 1
    ds.PixelData = (top - ds.pixel_array.astype(np.int32)).astype(np.uint16).tobytes()
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.WindowCenter = top - float(ds.WindowCenter)
    twin = tmp_path / "mono2.dcm"
    ds.save_as(twin)
    np.testing.assert_allclose(read_image(twin), rg1, atol=2.0 / float(ds.WindowWidth))


def test_header_fields_and_no_identifiers(tmp_path, rg1_uncr):
    header = read_header(rg1_uncr)
    assert header["view"] == "PA" and header["rows"] == 1955 and header["columns"] == 1841
    assert header["photometric"] == "MONOCHROME1"
    assert header["pixel_spacing_mm"] is None  # RG1 stores 0\0, an invalid spacing
    path = make_dicom(tmp_path / "p.dcm", np.zeros((8, 8), np.uint16), PatientName="Doe^Jane", PatientID="MRN123456",
                      PatientBirthDate="19700101", PixelSpacing=[0.2, 0.2], ViewPosition="AP")
    header = read_header(path)
    assert header["pixel_spacing_mm"] == [0.2, 0.2] and header["view"] == "AP"
    text = repr(header)
    for secret in ("Doe", "Jane", "MRN123456", "19700101"):
        assert secret not in text


def test_read_radiograph_is_image_and_header_from_one_read(tmp_path, rg1_uncr, monkeypatch):
    """The app's upload path: read_radiograph gives read_image's pixels and read_header's fields, and a DICOM is
    parsed once (pydicom.dcmread called once), a PNG decoded once."""
    import pydicom
    from PIL import Image

    import medclr.io.dicom
    from medclr.io import read_radiograph

    want_image, want_header = read_image(rg1_uncr), read_header(rg1_uncr)
    calls = []
    real = pydicom.dcmread
    monkeypatch.setattr(medclr.io.dicom.pydicom, "dcmread", lambda *a, **k: calls.append(a) or real(*a, **k))
    image, header = read_radiograph(rg1_uncr)
    assert len(calls) == 1 and header == want_header
    np.testing.assert_array_equal(image, want_image)
    png = tmp_path / "x.png"
    Image.fromarray((np.arange(12 * 7).reshape(12, 7) * 3).astype(np.uint8)).save(png)
    image, header = read_radiograph(png)
    np.testing.assert_array_equal(image, read_image(png))
    assert header == read_header(png) and (header["rows"], header["columns"]) == (12, 7)


def test_modality_lut_and_window(tmp_path):
    stored = np.array([[0, 1000], [2000, 4000]], dtype=np.uint16)
    # HU = stored - 1024; window 476 +- 500 covers HU [-24, 976] -> stored [1000, 2000]
    path = make_dicom(tmp_path / "ct.dcm", stored, RescaleSlope=1, RescaleIntercept=-1024, WindowCenter=476,
                      WindowWidth=1000)
    image = read_image(path)
    assert image[0, 0] == 0.0 and image[1, 1] == 1.0
    assert abs(image[1, 0] - 1.0) < 2e-3 and abs(image[0, 1]) < 2e-3


def test_no_window_is_min_max(tmp_path):
    stored = np.array([[100, 200], [300, 500]], dtype=np.uint16)
    image = read_image(make_dicom(tmp_path / "mm.dcm", stored))
    np.testing.assert_allclose(image, (stored - 100) / 400.0, atol=1e-6)


def test_multiframe_takes_first_frame_with_warning(tmp_path):
    frames = np.stack([np.full((4, 5), 10, np.uint16), np.full((4, 5), 20, np.uint16)])
    frames[0, 0, 0] = 0
    path = make_dicom(tmp_path / "mf.dcm", frames)
    with pytest.warns(UserWarning, match="2 frames"):
        image = read_image(path)
    assert image.shape == (4, 5) and image[0, 0] == 0.0 and image[1, 1] == 1.0


def test_rgb_dicom_to_grey(tmp_path):
    rgb = np.zeros((4, 4, 3), np.uint8)
    rgb[:2] = 255
    image = read_image(make_dicom(tmp_path / "rgb.dcm", rgb, photometric="RGB"))
    assert image.shape == (4, 4) and image[0, 0] > 0.99 and image[3, 3] < 0.01


@pytest.mark.parametrize("damage", ["truncated", "text", "empty", "header_only"])
def test_bad_dicom_raises_one_clear_error(tmp_path, rg1_uncr, damage):
    path = tmp_path / f"{damage}.dcm"
    data = open(rg1_uncr, "rb").read()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "text":
        path.write_text("this is a radiology report, not an image\n")
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        ds = pydicom.dcmread(rg1_uncr)
        del ds.PixelData
        ds.save_as(path)
    with pytest.raises(ImageReadError) as info:
        read_image(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message


def test_png_8_and_16_bit_and_rgb_jpeg(tmp_path):
    grey8 = (np.arange(64, dtype=np.uint8) * 4).reshape(8, 8)
    Image.fromarray(grey8).save(tmp_path / "g8.png")
    np.testing.assert_allclose(read_image(tmp_path / "g8.png"), grey8 / 255.0, atol=1e-6)
    grey16 = (np.arange(64, dtype=np.uint16) * 1000).reshape(8, 8)
    Image.fromarray(grey16).save(tmp_path / "g16.png")
    np.testing.assert_allclose(read_image(tmp_path / "g16.png"), grey16 / 65535.0, atol=1e-6)
    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[:, 8:] = 255
    Image.fromarray(rgb).save(tmp_path / "c.jpg", quality=95)
    image = read_image(tmp_path / "c.jpg")
    assert image.shape == (16, 16) and image[:, :6].mean() < 0.05 and image[:, 10:].mean() > 0.95


def test_png_named_dcm_and_dicom_without_suffix(tmp_path, rg1_uncr, rg1):
    Image.fromarray(np.full((4, 4), 255, np.uint8)).save(tmp_path / "x.png")
    (tmp_path / "x.png").rename(tmp_path / "looks_like.dcm")
    with pytest.raises(ImageReadError, match="not a DICOM"):
        read_image(tmp_path / "looks_like.dcm")
    (tmp_path / "noext").write_bytes(open(rg1_uncr, "rb").read())
    np.testing.assert_array_equal(read_image(tmp_path / "noext"), rg1)


def test_oversized_and_truncated_png(tmp_path):
    huge = tmp_path / "huge.png"
    Image.new("1", (9000, 9000)).save(huge)  # 81 Mpx, tiny file: a decompression bomb
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no PIL bomb warning leaks out either
        with pytest.raises(ImageReadError, match="over the limit"):
            read_image(huge)
    Image.fromarray((np.random.default_rng(0).random((64, 64)) * 255).astype(np.uint8)).save(tmp_path / "t.png")
    data = (tmp_path / "t.png").read_bytes()
    (tmp_path / "t.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageReadError, match="t.png"):
        read_image(tmp_path / "t.png")
    with pytest.raises(ImageReadError, match="not found"):
        read_image(tmp_path / "missing.png")


def test_non_radiograph_modalities_are_refused(tmp_path):
    pixels = np.full((64, 64), 100, np.uint16)
    with pytest.raises(ImageReadError, match="modality US .ultrasound. is not a chest radiograph"):
        read_image(make_dicom(tmp_path / "us.dcm", pixels, Modality="US"))
    assert read_image(make_dicom(tmp_path / "ot.dcm", pixels, Modality="OT")).shape == (64, 64)  # secondary capture


def test_header_cautions_when_it_may_not_be_a_chest_radiograph(tmp_path):
    """OT (secondary capture) and other body parts are read, but the header says so in one plain line."""
    from medclr.io import read_header
    from medclr.io.dicom import caution

    pixels = np.full((64, 64), 100, np.uint16)
    assert read_header(make_dicom(tmp_path / "cr.dcm", pixels))["caution"] == ""
    assert read_header(make_dicom(tmp_path / "chest.dcm", pixels, BodyPartExamined="CHEST"))["caution"] == ""
    ot = read_header(make_dicom(tmp_path / "ot.dcm", pixels, Modality="OT"))["caution"]
    assert ot.startswith("modality OT is not a radiograph modality") and "chest X-ray" in ot
    hand = read_header(make_dicom(tmp_path / "hand.dcm", pixels, BodyPartExamined="HAND"))["caution"]
    assert hand.startswith("body part HAND") and "modality" not in hand
    assert caution("", "") .startswith("no modality")
    crafted = caution('CR <img src="http://h/x.png">', "[x](http://h/)")  # quoted only as plain code strings
    assert crafted.startswith("modality a non-standard value") and "body part a non-standard value" in crafted
    assert not any(c in crafted for c in "<>[]()") and "http" not in crafted
    Image.fromarray(np.zeros((40, 40), np.uint8)).save(tmp_path / "x.png")
    assert read_header(tmp_path / "x.png")["caution"] == ""  # a raster has no header to go by
    assert caution("CR", "CHEST", "RGB") == "a colour image (RGB): check this is a chest X-ray before reading the findings"
    assert caution("DX", "", "MONOCHROME1") == ""


def test_strips_are_not_chest_radiographs():
    from medclr.io.limits import image_problem

    assert image_problem(np.eye(100, 300, dtype=np.float32)) is None  # 3:1 is read
    for shape in ((100, 400), (2000, 40)):  # 4:1 and 50:1 are not
        assert "times the other" in image_problem(np.zeros(shape, np.float32))


def test_float_image_with_nan_or_inf_is_refused_not_zeroed(tmp_path):
    """A float TIFF with NaN used to min-max to NaN bounds and come out all zero: a black image, scored."""
    for bad in (np.nan, np.inf):
        arr = np.linspace(0, 1000, 64 * 64, dtype=np.float32).reshape(64, 64)
        arr[3, 3] = bad
        Image.fromarray(arr, mode="F").save(tmp_path / "f.tif")
        with pytest.raises(ImageReadError, match="NaN or infinite"):
            read_image(tmp_path / "f.tif")


def test_png_whose_header_claims_gigapixels_gets_one_line_from_the_header_reader(tmp_path):
    """Over twice PIL's bomb limit PIL refuses to open the file at all; read_header used to let that escape
    (a traceback from `medclr inspect`), and warned on stderr below it."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    for side, needle in ((60_000, "decompression bomb"), (12_000, None)):
        path = tmp_path / f"{side}.png"
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
                         + chunk(b"IDAT", zlib.compress(b"\0" * (side + 1))) + chunk(b"IEND", b""))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no bomb warning either
            if needle:
                with pytest.raises(ImageReadError, match=needle):
                    read_header(path)
            else:
                assert read_header(path)["columns"] == side
        with pytest.raises(ImageReadError, match="decompression bomb|over the limit"):
            read_image(path)
