"""Intensity augmentation in two places: per item in the loader, or batched on the training device.

``data.augment_on``: ``loader`` runs the MONAI transforms of ``training/data.py`` on each float crop
in the loader (the CPU default). ``device`` ships the crop in the cache's dtype (uint8: a quarter of
float32's bytes through the loader, the pinned copy and the host-to-device transfer) with the
per-item parameters those same transforms drew, and :func:`apply_on_device` applies them to the
whole batch on the device (the default on CUDA). The parameters come from the same MONAI
transform objects, seeded the same way from (seed, epoch, index), so both placements give the same
views up to float32 rounding and resume stays exact without any device RNG state.

Formulas, as MONAI 1.x defines them (monai/transforms/intensity/array.py), in Compose order:

* RandShiftIntensity (brightness): x + offset.
* RandScaleIntensityFixedMean (contrast): (x - mean(x)) * (1 + factor) + mean(x).
* RandAdjustContrast (gamma), ``retain_stats=False`` (MONAI's default, the one data.py uses):
  ((x - min) / (range + 1e-7)) ** gamma * range + min, with min and range of the item's crop.

Each is applied with its own probability (an item's flag); the result is clamped to [0, 1].
"""

from __future__ import annotations

import torch

from medclr.errors import MedclrError

PLACES = ("auto", "loader", "device")
# Per item: (applied, value) for shift, scale and gamma, in Compose order.
N_PARAMS = 6
_GAMMA_EPS = 1e-7  # AdjustContrast's epsilon


def check_place(value) -> str:
    if value not in PLACES:
        raise MedclrError(f"config data.augment_on {value!r}: expected auto, loader or device")
    return value


def augment_place(value: str, device: torch.device) -> str:
    """``data.augment_on`` resolved for a device: auto = device on CUDA, loader elsewhere."""
    if check_place(value) == "auto":
        return "device" if torch.device(device).type == "cuda" else "loader"
    return value


def unit_float(x: torch.Tensor) -> torch.Tensor:
    """A cached image or crop as float32 in [0, 1] (uint8 is stored as round(255 x))."""
    x = torch.as_tensor(x)
    return x.float() / 255.0 if x.dtype == torch.uint8 else x.float()


def drawn_parameters(intensity_transforms) -> torch.Tensor:
    """The parameters MONAI's intensity transforms draw from their own (already seeded) streams, as the
    loader path would draw them when it applies them: a float32 vector of ``N_PARAMS``."""
    from monai.transforms import RandAdjustContrast, RandScaleIntensityFixedMean, RandShiftIntensity

    slots = {RandShiftIntensity: (0, "_offset"), RandScaleIntensityFixedMean: (2, "factor"),
             RandAdjustContrast: (4, "gamma_value")}
    out = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    for t in intensity_transforms:
        slot, attribute = slots[type(t)]
        t.randomize(None)
        if t._do_transform:
            out[slot], out[slot + 1] = 1.0, float(getattr(t, attribute))
    return out


def apply_on_device(images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Batched intensity augmentation: B x C x H x W crops (uint8 or float) and B x N_PARAMS parameters
    from :func:`drawn_parameters` -> float32 views in [0, 1], on the images' device."""
    x = unit_float(images)
    p = params.to(x.device, torch.float32).view(-1, N_PARAMS, 1, 1, 1).unbind(1)
    x = torch.where(p[0] > 0, x + p[1], x)
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    x = torch.where(p[2] > 0, (x - mean) * (1 + p[3]) + mean, x)
    low = x.amin(dim=(1, 2, 3), keepdim=True)
    span = x.amax(dim=(1, 2, 3), keepdim=True) - low
    x = torch.where(p[4] > 0, ((x - low) / (span + _GAMMA_EPS)) ** p[5] * span + low, x)
    return x.clamp_(0.0, 1.0)
