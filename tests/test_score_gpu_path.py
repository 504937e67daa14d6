"""The device path of `medclr score` (issue 34): greyscale JPEG, uncompressed DICOM and JPEG 2000 DICOM finished on
the model's device.

The same code runs on the CPU device here (``--decoder device``) and on CUDA where there is one. Stated
tolerances against ``read_image`` + ``preprocess_image`` (the app's input): on the CPU, equal (the same display
table, the same libjpeg-turbo decode, OpenJPEG under nvImageCodec's CPU backend as under pydicom, the same float
resize); on CUDA, uncompressed and lossless JPEG 2000 DICOM within 1e-5 (the area resize's float rounding), JPEG
within 2/255 per input pixel, mean 1e-3 (nvJPEG's inverse DCT against libjpeg-turbo's), and lossy JPEG 2000
within 2/255, mean 1e-3 (nvJPEG2000's inverse wavelet against OpenJPEG's).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomllib
import torch
from PIL import Image
from pydicom.data import get_testdata_file

from medclr.inference.device_decode import device_formats, model_inputs
from medclr.inference.preprocess import ImageFiles, Preprocess, collate_images, preprocess_image
from medclr.io import read_image
from tests.conftest_app import app_assets, engine  # noqa: F401 - fixtures
from tests.dicom_factory import make_dicom

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
PRE = Preprocess(224, 256)  # shrinks every file below: the area resize, as the scorer's checkpoints do
ROOT = Path(__file__).resolve().parents[1]


def _testdata(name: str) -> str:
    path = get_testdata_file(name)
    if path is None:
        pytest.skip(f"pydicom-data is not installed ({name} missing)")
    return str(path)


@pytest.fixture(scope="module")
def dicoms(tmp_path_factory) -> list[str]:
    """Real files: RG1/RG3 (CR, MONOCHROME1, 15 and 10 bits, a window), mlut_18 (signed, a Modality LUT),
    vlut_04 (8 bits, a VOI LUT), image_dfl (8 bits, deflated); and RG1's stored values written with a rescale
    and a window (signed), with an INVERSE presentation and no window (min-max), and as 8 bits."""
    real = [_testdata(n) for n in ("RG1_UNCR.dcm", "RG1_UNCI.dcm", "RG3_UNCR.dcm", "mlut_18.dcm", "vlut_04.dcm",
                                   "image_dfl.dcm")]
    import pydicom

    stored = pydicom.dcmread(real[0]).pixel_array
    out = tmp_path_factory.mktemp("dicoms")
    made = [make_dicom(out / "rescaled.dcm", (stored.astype(np.int32) - 9000).astype(np.int16), RescaleSlope=2,
                       RescaleIntercept=-1024, WindowCenter=3000, WindowWidth=12000),
            make_dicom(out / "inverse.dcm", stored, bits_stored=15, PresentationLUTShape="INVERSE"),
            make_dicom(out / "eight.dcm", (stored >> 7).astype(np.uint8), photometric="MONOCHROME1")]
    return real + [str(p) for p in made]


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> list[str]:
    """RG1 as displayed, as a baseline q95 JPEG, a progressive q80 one, and an odd-sized crop."""
    image = np.round(read_image(_testdata("RG1_UNCR.dcm")) * 255).astype(np.uint8)
    out = tmp_path_factory.mktemp("jpegs")
    Image.fromarray(image).save(out / "baseline.jpg", quality=95)
    Image.fromarray(image).save(out / "progressive.jpg", quality=80, progressive=True)
    Image.fromarray(image[101:702, 33:550]).save(out / "odd.jpg", quality=90)
    return [str(out / n) for n in ("baseline.jpg", "progressive.jpg", "odd.jpg")]


@pytest.fixture(scope="module")
def j2ks(tmp_path_factory) -> list[str]:
    """Real JPEG 2000 chest CRs (RG1 and RG3, lossless and lossy, MONOCHROME1 with a window) and RG1's stored
    values compressed here (pydicom + OpenJPEG, lossless) as MONOCHROME2 with an INVERSE presentation and a
    window, and as 8 bits with a VOI LUT."""
    import pydicom
    from pydicom import uid

    real = [_testdata(n) for n in ("RG1_J2KR.dcm", "RG1_J2KI.dcm", "RG3_J2KR.dcm", "RG3_J2KI.dcm")]
    stored = pydicom.dcmread(_testdata("RG1_UNCR.dcm")).pixel_array
    out = tmp_path_factory.mktemp("j2k")
    made = [(make_dicom(out / "inverse.dcm", stored, bits_stored=15, PresentationLUTShape="INVERSE",
                        WindowCenter=12000, WindowWidth=16000), stored),
            (make_dicom(out / "eight.dcm", (stored >> 7).astype(np.uint8)), (stored >> 7).astype(np.uint8))]
    paths = []
    for path, pixels in made:
        ds = pydicom.dcmread(path)
        if pixels.dtype == np.uint8:  # a VOI LUT of 256 entries: a curve, not a window
            lut = pydicom.Dataset()
            lut.LUTDescriptor = [256, 0, 16]
            lut.add_new((0x0028, 0x3006), "US", (np.sqrt(np.arange(256) / 255) * 4095).astype(np.uint16).tolist())
            ds.VOILUTSequence = [lut]
        ds.compress(uid.JPEG2000Lossless, pixels)
        ds.save_as(path)
        paths.append(str(path))
    return real + paths


def _on_device(paths: list[str], device: str, formats=frozenset({"dicom", "jpeg"})) -> tuple[dict, torch.Tensor]:
    """The scorer's two halves: the workers' items (device route on), then the device's finish."""
    data = ImageFiles(paths, PRE, device_formats=formats)
    batch = collate_images([data[i] for i in range(len(paths))])
    return batch, model_inputs(batch, PRE, device).cpu()


def _reference(path: str) -> torch.Tensor:
    return preprocess_image(read_image(path), PRE)[0]


@pytest.mark.parametrize("device", DEVICES)
def test_dicom_on_the_device_equals_read_image(dicoms, device):
    batch, x = _on_device(dicoms, device)
    assert [r["kind"] for r in batch["raw"]] == ["dicom"] * len(dicoms)  # none fell back to the CPU decode
    assert batch["ok"].all()
    for path, got in zip(dicoms, x):
        want = _reference(path)
        if device == "cpu":
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=path)
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=path)
    ref = torch.stack([_reference(p) for p in dicoms])
    assert (ref.amax(dim=(1, 2, 3)) > ref.amin(dim=(1, 2, 3)) + 0.1).all()  # real images, not blanks that agree


@pytest.mark.parametrize("device", DEVICES)
def test_jpeg_on_the_device_equals_read_image(jpegs, device):
    batch, x = _on_device(jpegs, device)
    assert [r["kind"] for r in batch["raw"]] == ["jpeg"] * len(jpegs) and batch["ok"].all()
    for path, got in zip(jpegs, x):
        diff = (got - _reference(path)).abs()
        if device == "cpu":
            assert float(diff.max()) == 0.0, path
        else:
            assert float(diff.max()) <= 2 / 255 and float(diff.mean()) <= 1e-3, path


J2K = frozenset({"dicom", "jpeg", "jpeg2000"})
needs_nvimgcodec = pytest.mark.skipif(not device_formats("device", "cpu") >= {"jpeg2000"},
                                      reason="nvImageCodec is not installed (the test extra installs it)")


@needs_nvimgcodec
@pytest.mark.parametrize("device", DEVICES)
def test_jpeg2000_on_the_device_equals_read_image(j2ks, device):
    batch, x = _on_device(j2ks, device, J2K)
    assert [r["kind"] for r in batch["raw"]] == ["jpeg2000"] * len(j2ks) and batch["ok"].all()
    for path, got in zip(j2ks, x):
        diff = (got - _reference(path)).abs()
        if device == "cpu":
            assert float(diff.max()) == 0.0, path
        elif "J2KI" in path:  # lossy: another inverse wavelet
            assert float(diff.max()) <= 2 / 255 and float(diff.mean()) <= 1e-3, path
        else:
            assert float(diff.max()) <= 1e-5, path
    ref = torch.stack([_reference(p) for p in j2ks])
    assert (ref.amax(dim=(1, 2, 3)) > ref.amin(dim=(1, 2, 3)) + 0.1).all()


@needs_nvimgcodec
def test_jpeg2000_the_device_cannot_take_or_read(j2ks, tmp_path):
    """Without a VOI the display range is the image's own min-max (the table depends on the pixels) and a signed
    image needs pydicom's sign handling: both decode in the workers, exactly. A damaged codestream is an error row,
    beside files that still score."""
    import pydicom

    ds = pydicom.dcmread(j2ks[0])
    del ds.WindowCenter, ds.WindowWidth
    ds.save_as(tmp_path / "minmax.dcm")
    ds = pydicom.dcmread(j2ks[0])
    ds.PixelData = ds.PixelData[: len(ds.PixelData) // 3] + b"\0" * 64  # a third of the stream, then zeros
    ds.save_as(tmp_path / "damaged.dcm")
    paths = [str(tmp_path / "minmax.dcm"), str(tmp_path / "damaged.dcm"), j2ks[0]]
    batch, x = _on_device(paths, "cpu", J2K)
    assert [r and r["kind"] for r in batch["raw"]] == [None, "jpeg2000", "jpeg2000"]
    assert batch["ok"].tolist() == [True, False, True] and len(x) == 2
    assert batch["error"][1] == f"{paths[1]}: its JPEG 2000 pixel data cannot be decoded"
    for path, got in zip([paths[0], paths[2]], x):
        torch.testing.assert_close(got, _reference(path), rtol=0, atol=0, msg=path)


def test_what_the_device_does_not_take_decodes_in_the_workers(tmp_path):
    """Colour and EXIF-rotated JPEGs, PNG and compressed DICOM keep the CPU decode (and its exact numbers)."""
    rgb = np.stack([np.linspace(0, 255, 64 * 80).reshape(64, 80)] * 3, axis=-1).astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / "colour.jpg")
    grey = Image.fromarray(rgb[..., 0])
    exif = grey.getexif()
    exif[0x0112] = 6  # rotated 90 degrees
    grey.save(tmp_path / "rotated.jpg", exif=exif)
    grey.save(tmp_path / "grey.png")
    shutil.copy(_testdata("RG1_J2KR.dcm"), tmp_path / "j2k.dcm")
    paths = [str(tmp_path / n) for n in ("colour.jpg", "rotated.jpg", "grey.png", "j2k.dcm")]
    batch, x = _on_device(paths, "cpu")
    assert batch["raw"] == [None] * 4 and batch["ok"].all()
    assert tuple(batch["height"]) == (64, 80, 64, 1955)  # the rotation applied: 80 rows
    for path, got in zip(paths, x):
        torch.testing.assert_close(got, _reference(path), rtol=0, atol=0, msg=path)


def test_files_the_device_cannot_read_are_error_rows_with_the_cpu_path_words(jpegs, tmp_path):
    """A blank JPEG or DICOM, a JPEG too small to be a radiograph, a truncated JPEG: error rows (the checks of
    every path, ``image_problem``, made on the device's result), next to a good file that still scores."""
    Image.fromarray(np.full((64, 80), 128, np.uint8)).save(tmp_path / "blank.jpg")
    make_dicom(tmp_path / "blank.dcm", np.full((64, 80), 700, np.uint16))
    Image.fromarray(np.arange(20 * 20, dtype=np.uint8).reshape(20, 20)).save(tmp_path / "tiny.jpg")
    data = Path(jpegs[0]).read_bytes()
    (tmp_path / "truncated.jpg").write_bytes(data[: len(data) // 2])
    names = ["blank.jpg", "blank.dcm", "tiny.jpg", "truncated.jpg"]
    paths = [str(tmp_path / n) for n in names] + [jpegs[0]]
    batch, x = _on_device(paths, "cpu")
    assert batch["ok"].tolist() == [False] * 4 + [True] and len(x) == 1
    torch.testing.assert_close(x[0], _reference(jpegs[0]), rtol=0, atol=0)
    cpu = collate_images([ImageFiles(paths, PRE)[i] for i in range(len(paths))])
    assert batch["error"][:3] == cpu["error"][:3]  # blank, blank, too small: the same sentence
    assert "blank image" in batch["error"][0] and "at least 32 px" in batch["error"][2]
    assert not cpu["ok"][3] and batch["error"][3].startswith(f"{tmp_path / 'truncated.jpg'}: not a readable")
    assert ".cpp" not in batch["error"][3]


def test_scorer_on_the_device_scores_as_the_full_decode_and_says_which_decoder(engine, dicoms, jpegs,  # noqa: F811
                                                                               j2ks, tmp_path, caplog):
    from medclr.jobs import scoring

    root = tmp_path / "archive"
    root.mkdir()
    for p in [dicoms[0], dicoms[4], *jpegs[:2], j2ks[1]]:
        shutil.copy(p, root / Path(p).name)
    Image.fromarray(np.full((64, 80), 9, np.uint8)).save(root / "blank.jpg")
    Image.fromarray(np.linspace(0, 255, 64 * 80).reshape(64, 80).astype(np.uint8)).save(root / "grey.png")

    def score(name: str, **kw) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
        caplog.clear()
        out = tmp_path / f"{name}.parquet"
        with caplog.at_level(logging.INFO, logger="medclr.score"):
            scoring.score_tree(engine, root, out, scoring.ScoreOptions(batch_size=3, workers=0, progress=False, **kw))
        said = [r.getMessage() for r in caplog.records if "decoder:" in r.getMessage()]
        return pd.read_parquet(out), pd.read_parquet(scoring.errors_path(out)), said

    # both decode every pixel: the PNG's crop travels as float, not as the fast path's uint8, in both runs
    on_device, errors, said = score("device", decoder="device", full_decode=True)
    assert len(said) == 1 and "finished on cpu" in said[0]
    full, full_errors, said = score("full", full_decode=True)
    assert len(said) == 1 and "every file in the main process (CPU) (no CUDA device" in said[0]
    assert list(errors["path"]) == list(full_errors["path"]) == ["blank.jpg"]
    assert list(on_device["path"]) == list(full["path"]) and len(full) == 6
    classes = [c for c in full.columns if f"{c} reason" in full.columns]
    np.testing.assert_allclose(on_device[classes].to_numpy(float), full[classes].to_numpy(float), rtol=0, atol=1e-6)
    assert (on_device[["height", "width"]].to_numpy() == full[["height", "width"]].to_numpy()).all()
    assert (on_device["study_uid"] == full["study_uid"]).all() and on_device["study_uid"].iat[0] != ""


def test_auto_uses_the_device_on_cuda_only():
    assert device_formats("auto", "cpu") == frozenset() and device_formats("cpu", "cpu") == frozenset()
    assert device_formats("device", "cpu") - {"jpeg2000"} == {"dicom", "jpeg"}  # JPEG 2000 where nvImageCodec is
    from medclr.errors import MedclrError

    with pytest.raises(MedclrError, match="expected one of"):
        device_formats("gpu", "cpu")
    if torch.cuda.is_available():
        assert "dicom" in device_formats("auto", "cuda:0") and device_formats("auto", "cuda:0", True) == frozenset()


# ------------------------------------------------------------------------------------------------------ faiss
def test_the_loaded_faiss_build_is_named_once_and_a_shadowing_pair_is_a_warning(caplog):
    import faiss

    from medclr.index import vectors

    level, line = vectors.faiss_build_note(faiss, ["faiss-cpu==1.15.1"])
    gpu = hasattr(faiss, "StandardGpuResources")
    assert level == logging.INFO and f"{'GPU' if gpu else 'CPU'} build loaded (from faiss-cpu==1.15.1)" in line
    level, line = vectors.faiss_build_note(faiss, ["faiss-cpu==1.15.1", "faiss-gpu==1.15.1"])
    assert level == logging.WARNING and f"pip uninstall {'faiss-cpu' if gpu else 'faiss-gpu'}`" in line
    installed = vectors.installed_distributions(vectors.FAISS_DISTRIBUTIONS + ("no-such-distribution-medclr",))
    assert installed and all(d.split("==")[0] in vectors.FAISS_DISTRIBUTIONS for d in installed)
    vectors._say_which_faiss.cache_clear()
    with caplog.at_level(logging.INFO, logger="medclr.index.vectors"):
        vectors._faiss(), vectors._faiss()
    assert sum("build loaded" in r.getMessage() for r in caplog.records) == 1


def test_no_extra_installs_two_faiss_distributions():
    """faiss-cpu and faiss-gpu both write the `faiss` package: no install (the core, alone or with any extras)
    may ask for both."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def faiss_names(requirements: list[str]) -> set[str]:
        names = {r.split(";")[0].split("[")[0].strip() for r in requirements}
        return {n.split("<")[0].split(">")[0].split("=")[0].split("!")[0].split("~")[0].strip().lower()
                for n in names if n.lower().startswith("faiss")}

    core = faiss_names(project["dependencies"])
    extras = {name: faiss_names(reqs) for name, reqs in project.get("optional-dependencies", {}).items()}
    for name, names in extras.items():
        assert len(core | names) <= 1, f"core + [{name}] installs {sorted(core | names)}"
    assert core or any(extras.values()), "nothing installs faiss at all"
