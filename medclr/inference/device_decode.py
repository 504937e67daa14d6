"""Finishing the decode on the model's device: baseline JPEG through nvJPEG, uncompressed DICOM by table lookup.

On a GPU the DataLoader workers cannot decode as fast as the model reads (docs/scoring.md, "Start-up and
steady rate"). For two kinds of file the workers now only read the file and check its header
(``medclr.io.device``), and the device does the per-pixel work in the main process:

* uncompressed greyscale DICOM: the stored values cross as they are (uint8/uint16, no float on the CPU) with
  the image's display table (``medclr.io.dicom.display_table``: rescale slope/intercept or Modality LUT, VOI
  LUT or window, MONOCHROME1/INVERSE inversion, computed over the 2^8 or 2^16 possible values, the numbers
  ``read_image`` gives); the device looks every pixel up (``table[codes]``) and resizes and crops
  (``medclr.inference.preprocess.resize_crop``, the rule of every other path);
* greyscale JPEG files: ``torchvision.io.decode_jpeg(..., device=...)`` on the batch's files at once (nvJPEG on
  CUDA, libjpeg-turbo on the CPU), then the same resize and crop.

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

FORMATS = frozenset({"dicom", "jpeg"})


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
    jpegs = [k for k, r in enumerate(raws) if r["kind"] == "jpeg"]
    images: list[torch.Tensor | str] = [_dicom_on(r, device) if r["kind"] == "dicom" else "" for r in raws]
    for k, x in zip(jpegs, _jpegs_on([raws[k] for k in jpegs], device) if jpegs else []):
        images[k] = x
    decoded = [k for k, x in enumerate(images) if not isinstance(x, str)]
    if decoded:
        extremes = torch.stack([torch.stack(images[k].aminmax()) for k in decoded]).cpu().numpy()
        for k, (lo, hi) in zip(decoded, extremes):
            problem = image_problem(np.array([[lo, hi]], np.float32), tuple(images[k].shape[-2:]))
            if problem:
                images[k] = f"image: {problem}; nothing was scored"
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
    """The kinds of file the model's device finishes. ``auto``: on CUDA both where torchvision decodes JPEG
    there (else DICOM only), unless ``full_decode`` asks for the app's exact CPU inputs; on another device
    none. ``device``: as on CUDA, on any device (on the CPU: the same arithmetic in the main process, the
    tests' path). ``cpu``: none."""
    if decoder not in DECODERS:
        raise MedclrError(f"decoder {decoder!r}: expected one of {list(DECODERS)}")
    device = torch.device(device)
    if decoder == "cpu" or (decoder == "auto" and (device.type != "cuda" or full_decode)):
        return frozenset()
    return FORMATS if device.type != "cuda" or _jpeg_decodes_on(str(device)) else frozenset({"dicom"})


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
    done = {"jpeg": "greyscale JPEG through torchvision decode_jpeg", "dicom": "uncompressed DICOM by display table"}
    return (f"decoder: {', '.join(done[f] for f in sorted(formats, reverse=True))} finished on {device}; "
            f"other files in {cpu}")
