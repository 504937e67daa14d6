"""Image preprocessing for inference: training's deterministic view, and the way back to the original image.

Kept apart from the engine because the index builder, the batch scorer and evaluation decode and
preprocess files in DataLoader workers (:func:`image_loader`) without needing a model.

* Image preprocessing matches training's deterministic view (and BioViL's inference transform in hi-ml-multimodal):
  ``medclr.io.read_image`` (float32 H x W in [0, 1], air dark) -> shorter side resized to R (area
  averaging when shrinking) -> centre crop C -> ``1 x C x C``. C (``image_size``) and R (``resize``,
  default C) come from the checkpoint (see :func:`medclr.inference.metadata.read_metadata`);
  default 224. Sizes, crop origin and the :class:`~medclr.geometry.CropGeometry` returned with the
  tensor (which carries heatmaps back to the original image, NaN outside the crop) all come from
  :mod:`medclr.geometry`, the rule training uses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from medclr.errors import MedclrError
from medclr.geometry import CropGeometry, centre_crop, resize_shorter_side, resized_shape
from medclr.io import (
    MAX_PIXELS,
    DecodedImage,
    Jpeg2000Frame,
    JpegBytes,
    StoredImage,
    read_image_for_device,
    read_image_reduced,
)
from medclr.io.limits import image_problem

DEFAULT_IMAGE_SIZE = 224


@dataclass(frozen=True)
class Preprocess:
    """Resize the shorter side to ``resize`` (default ``image_size``), then centre-crop ``image_size``."""

    image_size: int = DEFAULT_IMAGE_SIZE
    resize: int | None = None

    def __post_init__(self) -> None:
        if int(self.image_size) < 32 or (self.resize is not None and int(self.resize) < int(self.image_size)):
            raise MedclrError(f"preprocess: image_size {self.image_size} must be >= 32 and <= resize {self.resize}")

    @property
    def resize_to(self) -> int:
        return int(self.resize or self.image_size)


def preprocess_image(image: np.ndarray, pre: Preprocess = Preprocess(), *, source: str | os.PathLike | None = None
                     ) -> tuple[torch.Tensor, CropGeometry]:
    """H x W float image in [0, 1] -> (1 x C x C float32 tensor, its crop geometry); ``source``: the file it was
    read from, which a refusal (too small, blank) names.

    The deterministic view of training (``training/data.py``), both through :mod:`medclr.geometry`: shorter
    side resized to R (longer side round(long * R / short)), area averaging when shrinking and bilinear
    when enlarging, then the centre crop C (start = size // 2 - C // 2). Training may cache the resized
    image as uint8; that quantisation (< 1/255) is not repeated here."""
    arr = np.asarray(image, dtype=np.float32)
    if arr.ndim != 2 or min(arr.shape) < 1:
        raise MedclrError(f"{source or 'image'}: expected a 2-D grey array, got shape {arr.shape}")
    return preprocess_decoded(DecodedImage.full(arr), pre, source)


def preprocess_decoded(image: DecodedImage, pre: Preprocess, source: str | os.PathLike | None = None
                       ) -> tuple[torch.Tensor, CropGeometry]:
    """:func:`preprocess_image` of a :class:`~medclr.io.DecodedImage`. One decoded at a reduced size
    (``medclr.io.read_image_reduced``) is carried onto the same resized grid by box averaging over its
    pixels' footprints (``DecodedImage.resample``) instead of area-resizing the full image: the crop and its
    geometry are the original image's; the values agree with the full decode's within the tolerance that
    ``tests/test_reduced_decode.py`` measures."""
    problem = image_problem(image.pixels, (image.height, image.width))
    if problem:  # named by its file where there is one (the app passes none: a file name may be a patient's)
        raise MedclrError(f"{source or 'image'}: {problem}; nothing was scored")
    r, c = pre.resize_to, int(pre.image_size)
    if image.scale == 1:
        tensor = resize_crop(torch.from_numpy(np.ascontiguousarray(image.pixels))[None], pre)
    else:
        resized = torch.from_numpy(image.resample(*resized_shape(image.height, image.width, r)))[None]
        tensor = centre_crop(resized, c).clamp_(0.0, 1.0).contiguous()
    return tensor, CropGeometry.from_resize_crop((image.height, image.width), r, c)


def resize_crop(image: torch.Tensor, pre: Preprocess) -> torch.Tensor:
    """1 x H x W float in [0, 1] (on any device) -> the 1 x C x C model input: shorter side to R, centre crop."""
    return centre_crop(resize_shorter_side(image, pre.resize_to), int(pre.image_size)).clamp_(0.0, 1.0).contiguous()


class ImageFiles(torch.utils.data.Dataset):
    """Decode + preprocess files (in DataLoader workers). Items never raise: a bad file gives
    ``ok=False`` and its one-line error, so a batch job records it and goes on.

    ``reduced``: decode at a reduced size where the format allows (``medclr.io.read_image_reduced``;
    :func:`preprocess_decoded`). ``uint8``: an image whose source holds 8-bit samples travels as uint8
    (``round(255 x)``, as training's uint8 cache stores it), a quarter of the bytes to the device;
    :func:`model_input` turns a batch back into float."""

    def __init__(self, paths: Sequence[str | os.PathLike], pre: Preprocess, max_pixels: int = MAX_PIXELS,
                 reduced: bool = False, uint8: bool = False, device_formats: frozenset[str] = frozenset()) -> None:
        self.paths, self.pre, self.max_pixels = [str(p) for p in paths], pre, max_pixels
        self.reduced, self.uint8 = reduced, uint8
        # kinds of file whose decode the model's device finishes (``medclr.inference.device_decode``): such an
        # item carries them undecoded under "raw" (its "tensor" a placeholder)
        self.device_formats = frozenset(device_formats)

    def __len__(self) -> int:
        return len(self.paths)

    def _decode(self, path: str) -> tuple[DecodedImage | StoredImage | Jpeg2000Frame | JpegBytes, str]:
        # a DICOM header that says "maybe not a chest radiograph" (OT, another body part) travels with the scores,
        # and so do its archive fields (view, UIDs); min_side None decodes every pixel
        min_side = self.pre.resize_to if self.reduced else None
        if self.device_formats:
            return read_image_for_device(path, min_side, self.max_pixels, self.device_formats)
        return read_image_reduced(path, min_side, max_pixels=self.max_pixels)

    def _placeholder(self) -> torch.Tensor:
        c = int(self.pre.image_size)
        return torch.zeros(1, c, c, dtype=torch.uint8 if self.uint8 else torch.float32)

    def __getitem__(self, i: int) -> dict[str, Any]:
        try:
            image, caution = self._decode(self.paths[i])
            item = {"i": i, "ok": True, "error": "", "height": image.height, "width": image.width,
                    "caution": caution, "fields": image.fields, "raw": None}
            if not isinstance(image, DecodedImage):
                return {**item, "tensor": self._placeholder(), "raw": raw_item(image, self.paths[i])}
            tensor, geo = preprocess_decoded(image, self.pre, self.paths[i])
            if self.uint8 and image.bits <= 8:
                tensor = tensor.mul_(255.0).round_().to(torch.uint8)
            return {**item, "tensor": tensor, "height": geo.height, "width": geo.width}
        except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded error row
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return {"i": i, "tensor": self._placeholder(), "ok": False, "error": msg, "height": 0, "width": 0,
                    "caution": "", "fields": {}, "raw": None}


def raw_item(image: StoredImage | Jpeg2000Frame | JpegBytes, path: str) -> dict[str, Any]:
    """What the device needs to finish a file (``medclr.inference.device_decode``), as tensors the loader pins."""
    if isinstance(image, JpegBytes):
        return {"kind": "jpeg", "data": torch.from_numpy(image.data), "path": path}
    if isinstance(image, Jpeg2000Frame):
        return {"kind": "jpeg2000", "data": torch.from_numpy(image.data), "table": torch.from_numpy(image.table),
                "height": image.height, "width": image.width, "path": path}
    # torch has no uint16 arithmetic on every device: the codes cross as int16 and are unwrapped there
    codes = image.codes.view(np.int16) if image.codes.dtype == np.uint16 else image.codes
    return {"kind": "dicom", "codes": torch.from_numpy(np.ascontiguousarray(codes)),
            "table": torch.from_numpy(image.table), "path": path}


def collate_images(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack the items; the tensor stays uint8 only when every item is (else uint8 items become x / 255)."""
    tensors = [b["tensor"] for b in batch]
    if any(t.dtype != torch.uint8 for t in tensors):
        tensors = [t.float().div_(255.0) if t.dtype == torch.uint8 else t for t in tensors]
    return {
        "i": torch.tensor([b["i"] for b in batch], dtype=torch.long),
        "tensor": torch.stack(tensors),
        "ok": torch.tensor([b["ok"] for b in batch], dtype=torch.bool),
        "error": [b["error"] for b in batch],
        "height": [b["height"] for b in batch],
        "width": [b["width"] for b in batch],
        "caution": [b["caution"] for b in batch],
        "fields": [b["fields"] for b in batch],
        "raw": [b.get("raw") for b in batch],  # what the device finishes (``medclr.inference.device_decode``)
    }


def model_input(batch: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A collated batch on ``device`` as float in [0, 1]: a uint8 batch crosses as uint8 (non-blocking from
    pinned memory) and becomes ``x / 255`` there."""
    x = batch.to(device, non_blocking=True)
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x


def worker_init(_worker_id: int) -> None:
    """DataLoader workers decode with one thread each; the model keeps the cores."""
    torch.set_num_threads(1)


def image_loader(paths: Sequence[str | os.PathLike], pre: Preprocess, batch_size: int = 16, num_workers: int = 0,
                 max_pixels: int = MAX_PIXELS, prefetch_factor: int = 4, reduced: bool = False, uint8: bool = False,
                 pin_memory: bool = False, device_formats: frozenset[str] = frozenset()) -> torch.utils.data.DataLoader:
    """An ordered DataLoader over :class:`ImageFiles` (workers decode while the model runs); ``pin_memory``
    for a CUDA model (batches then cross without a staging copy, and asynchronously); ``device_formats``: the
    kinds of file left for the model's device to finish (``medclr.inference.device_decode.model_inputs``)."""
    kw: dict[str, Any] = {}
    if num_workers > 0:
        kw = {"worker_init_fn": worker_init, "prefetch_factor": prefetch_factor, "persistent_workers": False}
    data = ImageFiles(paths, pre, max_pixels, reduced, uint8, device_formats)
    return torch.utils.data.DataLoader(data, batch_size=batch_size,
                                       shuffle=False, num_workers=num_workers, collate_fn=collate_images,
                                       pin_memory=pin_memory, **kw)
