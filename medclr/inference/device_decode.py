"""Finishing the decode on the model's device: JPEG through nvJPEG, JPEG 2000 DICOM through nvImageCodec,
uncompressed DICOM by table lookup.

On a GPU the DataLoader workers cannot decode as fast as the model reads (docs/scoring.md, "Start-up and
steady rate"). For two kinds of file the workers now only read the file and check its header
(``medclr.io.device``), and the device does the per-pixel work in the main process:

* uncompressed greyscale DICOM: the stored values cross as they are (uint8/uint16, no float on the CPU) with
  the image's display table (``medclr.io.dicom.display_table``: rescale slope/intercept or Modality LUT, VOI
  LUT or window, MONOCHROME1/INVERSE inversion, computed over the 2^8 or 2^16 possible values, the numbers
  ``read_image`` gives); the device looks every pixel up (``table[codes]``) and resizes and crops
  (``medclr.inference.preprocess.resize_crop``, the rule of every other path);
* greyscale JPEG files: ``torchvision.io.decode_jpeg(..., device=...)`` on the batch's files at once (nvJPEG on
  CUDA, libjpeg-turbo on the CPU), then the same resize and crop;
* JPEG 2000 greyscale DICOM with a VOI: NVIDIA's nvImageCodec decodes the batch's codestreams at once
  (nvJPEG2000 on CUDA; on the CPU its OpenJPEG backend), into the stored values, then the display table
  (made in the worker: a VOI makes it independent of the pixels) and the same resize and crop. Without
  nvImageCodec installed these decode in the workers (one log line says so).

On the CPU device the same code runs (the tests' path, ``--decoder device``): there it equals ``read_image``
+ :func:`~medclr.inference.preprocess.preprocess_image` exactly (the same table, the same libjpeg-turbo
decode, the same float resize). On CUDA the lookup is exact and the area resize differs by float rounding
(bound 1e-5); nvJPEG's inverse DCT may differ from libjpeg-turbo's by a grey level here and there (bound
2/255 per input pixel, mean 1e-3: unmeasured; ``tests/test_score_gpu_path.py`` checks it where CUDA is).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np
import torch

from medclr.errors import MedclrError
from medclr.inference.preprocess import Preprocess, model_input, resize_crop
from medclr.io.limits import image_problem

log = logging.getLogger(__name__)

FORMATS = frozenset({"dicom", "jpeg", "jpeg2000"})


def _dicom_on(raw: dict[str, Any], device: torch.device) -> torch.Tensor:
    codes = raw["codes"].to(device, non_blocking=True)
    index = codes.to(torch.int32) & 0xFFFF if codes.dtype == torch.int16 else codes.to(torch.int32)
    return raw["table"].to(device, non_blocking=True)[index][None]


def _jpegs_on(raws: list[dict[str, Any]], device: torch.device) -> list[torch.Tensor | str]:
    """1 x H x W float in [0, 1] per file, or its one-line error; one batched call, file by file when it fails."""
    from torchvision.io import ImageReadMode, decode_jpeg

    datas = [r["data"] for r in raws]
    try:
        decoded: list[torch.Tensor | str] = list(decode_jpeg(datas, mode=ImageReadMode.GRAY, device=device))
    except RuntimeError:
        decoded = []
        for raw, data in zip(raws, datas):
            try:
                decoded.append(decode_jpeg(data, mode=ImageReadMode.GRAY, device=device))
            except RuntimeError as exc:
                decoded.append(f"{raw['path']}: not a readable PNG/JPEG image ({_decoder_message(exc)})")
    return [x if isinstance(x, str) else x.float().div_(255.0) for x in decoded]


def _j2ks_on(raws: list[dict[str, Any]], device: torch.device) -> list[torch.Tensor | str]:
    """1 x H x W display image per JPEG 2000 frame, or its one-line error: one batched nvImageCodec call."""
    decoder, params = _j2k_decoder(str(device))
    decoded = decoder.decode([r["data"].numpy() for r in raws], params=params)  # None where a stream fails
    out: list[torch.Tensor | str] = []
    for raw, image in zip(raws, decoded):
        if image is None:
            out.append(f"{raw['path']}: its JPEG 2000 pixel data cannot be decoded")
            continue
        # H x W x 1 where the backend decoded it: device memory through DLPack, host memory as an array
        on_device = "DEVICE" in str(image.buffer_kind)
        codes = (torch.from_dlpack(image) if on_device else torch.from_numpy(np.asarray(image.cpu()))).to(device)
        if codes.ndim != 3 or codes.shape[-1] != 1 or tuple(codes.shape[:2]) != (raw["height"], raw["width"]):
            out.append(f"{raw['path']}: its JPEG 2000 pixel data decodes to {tuple(codes.shape)}, not the header's "
                       f"{raw['height']} x {raw['width']} grey image")
            continue
        out.append(raw["table"].to(device, non_blocking=True)[codes[..., 0].to(torch.int32)][None])
    return out


@functools.cache
def _j2k_decoder(device: str):
    """nvImageCodec's decoder for ``device`` (CUDA: its GPU backends first; CPU: the CPU-only backend) and the
    decode parameters that keep the stored values as they are (no colour conversion, 16 bits kept)."""
    from nvidia import nvimgcodec

    dev = torch.device(device)
    if dev.type == "cuda":
        decoder = nvimgcodec.Decoder(device_id=dev.index if dev.index is not None else torch.cuda.current_device())
    else:
        decoder = nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
                                     backends=[nvimgcodec.Backend(nvimgcodec.CPU_ONLY)])
    return decoder, nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.UNCHANGED, allow_any_depth=True)


def _j2k_decodes_on(device: str) -> bool:
    """Whether nvImageCodec is installed and makes a decoder for ``device``."""
    try:
        _j2k_decoder(device)
        return True
    except Exception as exc:  # noqa: BLE001 - not installed, no CUDA driver, a build without this backend
        log.info("nvImageCodec cannot decode JPEG 2000 on %s (%s): JPEG 2000 DICOM decodes in the CPU workers "
                 "(pip install 'medclr[gpu]' installs it)", device, " ".join(str(exc).split())[:200])
        return False


def _decoder_message(exc: Exception) -> str:
    """torchvision's message without the C++ source location it starts with ("decode_jpeg, <file>.cpp:171, ...")."""
    text = " ".join(str(exc).split())
    return text.rsplit(".cpp:", 1)[-1].split(", ", 1)[-1] if ".cpp:" in text else text


def finish_on_device(raws: list[dict[str, Any]], pre: Preprocess, device: torch.device | str
                     ) -> list[torch.Tensor | str]:
    """The 1 x C x C model input on ``device`` of each raw item (``medclr.inference.preprocess.raw_item``), or
    its one-line error: the checks of every path (``medclr.io.limits.image_problem``: sides, aspect, a blank
    image) are made on the decoded image's size and extremes, which decide them (one transfer for the batch)."""
    device = torch.device(device)
    images: list[torch.Tensor | str] = [_dicom_on(r, device) if r["kind"] == "dicom" else "" for r in raws]
    for kind, decode in (("jpeg", _jpegs_on), ("jpeg2000", _j2ks_on)):
        todo = [k for k, r in enumerate(raws) if r["kind"] == kind]
        for k, x in zip(todo, decode([raws[k] for k in todo], device) if todo else []):
            images[k] = x
    decoded = [k for k, x in enumerate(images) if not isinstance(x, str)]
    if decoded:
        extremes = torch.stack([torch.stack(images[k].aminmax()) for k in decoded]).cpu().numpy()
        for k, (lo, hi) in zip(decoded, extremes):
            problem = image_problem(np.array([[lo, hi]], np.float32), tuple(images[k].shape[-2:]))
            if problem:
                images[k] = f"{raws[k].get('path') or 'image'}: {problem}; nothing was scored"
    return [x if isinstance(x, str) else resize_crop(x, pre) for x in images]


def model_inputs(batch: dict[str, Any], pre: Preprocess, device: torch.device | str) -> torch.Tensor:
    """The model input on ``device`` of a collated batch's readable items, as float in [0, 1]: the workers'
    crops, and the raw items finished here. A raw item that fails here becomes an error row: ``batch["ok"]``
    and ``batch["error"]`` are updated in place."""
    ok, raws = batch["ok"], batch.get("raw") or []
    if not any(r is not None for r in raws):
        return model_input(batch["tensor"] if ok.all() else batch["tensor"][ok], device)  # indexing would unpin
    x = model_input(batch["tensor"], device)
    todo = [j for j, r in enumerate(raws) if r is not None and ok[j]]
    for j, image in zip(todo, finish_on_device([raws[j] for j in todo], pre, device)):
        if isinstance(image, str):
            ok[j], batch["error"][j] = False, image
        else:
            x[j] = image
    return x[ok.to(x.device)]


DECODERS = ("auto", "cpu", "device")


def device_formats(decoder: str, device: torch.device | str, full_decode: bool = False) -> frozenset[str]:
    """The kinds of file the model's device finishes. ``auto``: on CUDA uncompressed DICOM, JPEG where
    torchvision decodes it there, JPEG 2000 DICOM where nvImageCodec does, unless ``full_decode`` asks for the
    app's exact CPU inputs; on another device none. ``device``: as on CUDA, on any device (on the CPU: the same
    arithmetic in the main process, the tests' path). ``cpu``: none."""
    if decoder not in DECODERS:
        raise MedclrError(f"decoder {decoder!r}: expected one of {list(DECODERS)}")
    device = torch.device(device)
    if decoder == "cpu" or (decoder == "auto" and (device.type != "cuda" or full_decode)):
        return frozenset()
    jpeg = device.type != "cuda" or _jpeg_decodes_on(str(device))
    return frozenset({"dicom"} | ({"jpeg"} if jpeg else set()) | ({"jpeg2000"} if _j2k_decodes_on(str(device)) else set()))


@functools.cache
def _jpeg_decodes_on(device: str) -> bool:
    """Whether torchvision decodes a JPEG on ``device`` here (a build without nvJPEG raises)."""
    from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg

    probe = encode_jpeg(torch.full((1, 16, 16), 128, dtype=torch.uint8))
    try:
        decode_jpeg(probe, mode=ImageReadMode.GRAY, device=device)
        return True
    except (RuntimeError, NotImplementedError) as exc:
        log.info("torchvision cannot decode JPEG on %s (%s): JPEG files decode in the CPU workers", device,
                 " ".join(str(exc).split())[:200])
        return False


def describe(formats: frozenset[str], device: torch.device | str, workers: int) -> str:
    """The one line that says where files decode."""
    cpu = f"{workers} CPU worker{'s' if workers != 1 else ''}" if workers else "the main process (CPU)"
    if not formats:
        why = "" if torch.device(device).type == "cuda" else " (no CUDA device; --decoder device moves them there)"
        return f"decoder: every file in {cpu}{why}"
    done = {"jpeg": "greyscale JPEG through torchvision decode_jpeg", "dicom": "uncompressed DICOM by display table",
            "jpeg2000": "JPEG 2000 DICOM through nvImageCodec"}
    return (f"decoder: {', '.join(done[f] for f in sorted(formats, key=list(done).index))} finished on {device}; "
            f"other files in {cpu}")
