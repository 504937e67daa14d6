"""Compressed DICOM transfer syntaxes beyond JPEG 2000: JPEG Lossless (.57/.70), JPEG-LS (.80/.81),
JPEG Extended (.51), decoded through pydicom's plugins (python-gdcm; imagecodecs for 12-bit JPEG).

Two independent checks: pydicom's own test files against the reference values pydicom's test suite
asserts for them (or against their uncompressed twins), and a crop of the real chest CR (RG1)
transcoded at test time by GDCM, which must read exactly like the uncompressed crop.
"""

from __future__ import annotations

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.uid import UID

from medclr.errors import ImageReadError
from medclr.io import dicom as mdicom, read_header, read_image
from tests.dicom_factory import make_dicom

# pydicom's reference values for its test files (tests/pixels/pixels_reference.py in pydicom).
STEPS = [0, 5, 10, 15, 20, 25, 30, 35, 40]
JLS_RGB = {0: [255, 0, 0], 10: [255, 130, 130], 20: [0, 255, 0], 30: [130, 255, 130], 40: [0, 0, 255],
           50: [130, 130, 255], 60: [0, 0, 0], 70: [65, 65, 65], 80: [190, 190, 190], 90: [255, 255, 255]}
REFERENCE = {
    "JPGLosslessP14SV1_1s_1f_8b.dcm": ("1.2.840.10008.1.2.4.70", lambda a: (
        tuple(a[300, 512:520]) == (26, 26, 25, 22, 19, 16, 14, 15)
        and tuple(a[600, 512:520]) == (45, 43, 41, 38, 33, 30, 26, 21))),
    "JPEG-LL.dcm": ("1.2.840.10008.1.2.4.70", lambda a: (
        a.dtype == np.int16 and tuple(a[400, 124:132]) == (60, 58, 61, 68, 59, 65, 64, 67)
        and tuple(a[600, 124:132]) == (3, 1, 2, 0, 2, 1, 2, 0))),
    "SC_rgb_jpeg_gdcm.dcm": ("1.2.840.10008.1.2.4.70", "SC_rgb.dcm"),
    "MR_small_jpeg_ls_lossless.dcm": ("1.2.840.10008.1.2.4.80", "MR_small.dcm"),
    "emri_small_jpeg_ls_lossless.dcm": ("1.2.840.10008.1.2.4.80", "emri_small.dcm"),
    "JPEGLSNearLossless_08.dcm": ("1.2.840.10008.1.2.4.81", lambda a: (
        a[STEPS, 0].tolist() == [255, 125, 65, 30, 15, 5, 5, 0, 0])),
    "JPEGLSNearLossless_16.dcm": ("1.2.840.10008.1.2.4.81", lambda a: (
        a[STEPS, 0].tolist() == [65535, 32765, 16385, 4095, 1025, 255, 65, 15, 5])),
    "SC_rgb_jls_lossy_line.dcm": ("1.2.840.10008.1.2.4.81", lambda a: (
        all(a[r, 0].tolist() == v for r, v in JLS_RGB.items()))),
    "SC_rgb_jls_lossy_sample.dcm": ("1.2.840.10008.1.2.4.81", lambda a: (
        all(a[r, 0].tolist() == v for r, v in JLS_RGB.items()))),
}


def _testdata(name: str) -> str:
    path = get_testdata_file(name)
    if path is None:
        pytest.skip(f"{name}: not in pydicom or pydicom-data here")
    return path


def _has_imagecodecs() -> bool:
    return mdicom.jpeg12.is_available(pydicom.uid.JPEGExtended12Bit)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_pydicom_test_files_decode_to_reference(name):
    syntax, check = REFERENCE[name]
    path = _testdata(name)
    ds = pydicom.dcmread(path)
    assert ds.file_meta.TransferSyntaxUID == syntax
    arr = mdicom.decode_pixels(path, ds)
    frame_shape = (ds.Rows, ds.Columns) + ((3,) if ds.SamplesPerPixel == 3 else ())
    assert arr.shape == frame_shape
    if isinstance(check, str):  # the uncompressed twin, first frame
        twin = pydicom.dcmread(_testdata(check)).pixel_array
        np.testing.assert_array_equal(arr, twin[0] if twin.ndim > len(frame_shape) else twin)
    else:
        assert check(arr)


def test_jpeg_extended_12_bit():
    path = _testdata("JPGExtended.dcm")
    ds = pydicom.dcmread(path)
    assert ds.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.51" and ds.BitsStored == 12
    if _has_imagecodecs():
        arr = mdicom.decode_pixels(path, ds)
        assert arr.shape == (1024, 256) and arr.dtype == np.uint16 and arr.max() < 4096
        assert arr[420, 140] == 244 and arr[230, 120] == 95  # pydicom's reference values
    else:
        with pytest.raises(ImageReadError) as info:
            mdicom.decode_pixels(path, ds)
        message = str(info.value)
        assert "\n" not in message and "12-bit JPEG Extended" in message and "1.2.840.10008.1.2.4.51" in message
        assert "pip install imagecodecs" in message


@pytest.fixture(scope="module")
def rg1_crop(tmp_path_factory):
    """A 256 x 256 crop of the real chest CR (MONOCHROME1, 15 bits stored, its own window)."""
    ds = pydicom.dcmread(get_testdata_file("RG1_UNCR.dcm"))
    crop = ds.pixel_array[800:1056, 700:956].copy()
    path = tmp_path_factory.mktemp("rg1") / "crop.dcm"
    return make_dicom(path, crop, photometric="MONOCHROME1", bits_stored=15, WindowCenter=15000,
                      WindowWidth=30000)


def _transcode(src, dst, syntax: str) -> None:
    gdcm = pytest.importorskip("gdcm")
    reader = gdcm.ImageReader()
    reader.SetFileName(str(src))
    assert reader.Read()
    change = gdcm.ImageChangeTransferSyntax()
    change.SetTransferSyntax(gdcm.TransferSyntax(gdcm.TransferSyntax.GetTSType(syntax)))
    change.SetInput(reader.GetImage())
    if syntax == "1.2.840.10008.1.2.4.81":
        codec = gdcm.JPEGLSCodec()
        codec.SetLossless(False)
        codec.SetLossyError(2)
        change.SetUserCodec(codec)
    assert change.Change()
    writer = gdcm.ImageWriter()
    writer.SetFileName(str(dst))
    writer.SetFile(reader.GetFile())
    writer.SetImage(change.GetOutput())
    assert writer.Write()


@pytest.mark.parametrize("syntax", ["1.2.840.10008.1.2.4.57", "1.2.840.10008.1.2.4.70", "1.2.840.10008.1.2.4.80",
                                    "1.2.840.10008.1.2.4.81"])
def test_chest_cr_transcoded_reads_like_uncompressed(tmp_path, rg1_crop, syntax):
    dst = tmp_path / "compressed.dcm"
    _transcode(rg1_crop, dst, syntax)
    assert read_header(dst)["transfer_syntax"] == syntax
    image, reference = read_image(dst), read_image(rg1_crop)
    if syntax.endswith(".81"):  # near-lossless, error 2 in 15 bits
        assert np.abs(image - reference).max() <= 2 / 30000 + 1e-6 and np.abs(image - reference).max() > 0
    else:
        np.testing.assert_array_equal(image, reference)


def test_missing_decoder_is_one_line_naming_syntax_and_package(tmp_path, rg1_crop, monkeypatch):
    dst = tmp_path / "jpeg_lossless.dcm"
    _transcode(rg1_crop, dst, "1.2.840.10008.1.2.4.70")

    class NoPlugins:
        available_plugins = ()

    monkeypatch.setattr(mdicom, "get_decoder", lambda syntax: NoPlugins())
    with pytest.raises(ImageReadError) as info:
        read_image(dst)
    message = str(info.value)
    assert "\n" not in message and str(dst) in message
    assert "JPEG Lossless" in message and "1.2.840.10008.1.2.4.70" in message and "pip install python-gdcm" in message


def test_unsupported_syntax_is_one_line(tmp_path, rg1_crop):
    dst = tmp_path / "j2k_part2.dcm"
    _transcode(rg1_crop, dst, "1.2.840.10008.1.2.4.80")
    ds = pydicom.dcmread(dst)
    ds.file_meta.TransferSyntaxUID = UID("1.2.840.10008.1.2.4.92")  # JPEG 2000 Part 2: no pydicom decoder
    ds.save_as(dst)
    with pytest.raises(ImageReadError) as info:
        read_image(dst)
    message = str(info.value)
    assert "\n" not in message and "1.2.840.10008.1.2.4.92" in message and "not supported" in message


def test_corrupt_stream_is_one_line(tmp_path, rg1_crop):
    dst = tmp_path / "jls.dcm"
    _transcode(rg1_crop, dst, "1.2.840.10008.1.2.4.80")
    ds = pydicom.dcmread(dst)
    frame = pydicom.encaps.get_frame(ds.PixelData, 0)
    ds.PixelData = pydicom.encaps.encapsulate([frame[: len(frame) // 3] + b"\xff\xd9"])
    ds.save_as(dst)
    with pytest.raises(ImageReadError) as info:
        read_image(dst)
    message = str(info.value)
    assert "\n" not in message and "cannot decode DICOM pixel data" in message and "JPEG-LS" in message


def test_invalid_number_of_frames_is_one_line(tmp_path, rg1_crop):
    """NumberOfFrames "1A" (pydicom's badVR.dcm) raised a bare ValueError out of the reader."""
    ds = pydicom.dcmread(rg1_crop)
    ds.NumberOfFrames = "7"
    path = tmp_path / "frames.dcm"
    ds.save_as(path)
    data = path.read_bytes()
    tag = b"\x28\x00\x08\x00IS\x02\x007 "  # (0028,0008) IS, 2 bytes: "7 "
    assert data.count(tag) == 1
    path.write_bytes(data.replace(tag, tag[:-2] + b"1A"))
    for read in (read_image, read_header):
        with pytest.raises(ImageReadError) as info:
            read(path)
        assert str(info.value) == f"{path}: invalid NumberOfFrames '1A'"


def test_jpeg_2000_keeps_openjpeg():
    """python-gdcm also decodes JPEG 2000; files read before it was a dependency keep their decoder."""
    ds = pydicom.dcmread(get_testdata_file("RG1_J2KR.dcm"))
    assert mdicom._plugins("x", ds, ds.file_meta.TransferSyntaxUID)[0] == "pylibjpeg"
