"""BioViL and BioViL-T image encoders, read from hi-ml-multimodal's files into medclr's :class:`ImageEncoder`.

hi-ml-multimodal (Microsoft's reference code for BioViL, ECCV 2022, and BioViL-T, CVPR 2023) saves its
``ImageModel.state_dict()`` with ``torch.save``. The key layout, which this module maps:

* ``encoder.encoder.*``: a torchvision ResNet (``fc.*`` unused) -> medclr's ``trunk.*``;
* ``projector.model.{0,1,3}``: 1x1 conv (no bias), BatchNorm, ReLU, 1x1 conv -> medclr's ``projector="mlp"``
  (``proj.{0,1,3}``), the joint size read from the file (128 for the published models);
* BioViL-T only (``img_encoder_type="resnet50_multi_image"``): ``encoder.backbone_to_vit`` (1x1 conv 2048 -> 256),
  ``encoder.missing_previous_emb`` (1 x 256 x 1 x 1) and ``encoder.vit_pooler.*``, the transformer that compares
  the current film with a prior one. Without a prior film its output is ``missing_previous_emb`` in every cell
  (hi-ml's ``MultiImageEncoder.forward``), so one image runs exactly through :class:`TemporalNeck` and the ViT
  weights are not needed; medclr scores one film at a time, so they are left out (logged).

Both models take grey [0, 1] input repeated to three channels with no mean/std standardisation (hi-ml's
transform: resize the shorter side to 512, centre-crop 480 for BioViL and 448 for BioViL-T, ``ToTensor``), which is
medclr's ``input_norm="none"``; :data:`CROP` records the crops for the docs and the error messages.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from medclr.errors import MedclrError
from medclr.hub import one_line

log = logging.getLogger(__name__)

# hi-ml-multimodal's centre crops (health_multimodal.image.utils.get_image_inference), after a 512 px resize
RESIZE = 512
CROP = {"biovil": 480, "biovil_t": 448}
_TRUNK, _PROJ = "encoder.encoder.", "projector.model."
_NECK = {"encoder.backbone_to_vit.weight": "neck.backbone_to_vit.weight",
         "encoder.missing_previous_emb": "neck.missing_previous_emb"}
_UNUSED = ("encoder.encoder.fc.", "encoder.vit_pooler.", "classifier.")


class TemporalNeck(nn.Module):
    """BioViL-T's single-image path between the ResNet and the projector: a 1x1 conv to ``width`` channels, then
    the learned "no prior image" embedding in the other ``width`` channels of every cell (the projector reads
    ``[current, difference]``). Attribute names follow hi-ml's ``MultiImageEncoder``."""

    def __init__(self, in_channels: int, width: int = 256) -> None:
        super().__init__()
        self.backbone_to_vit = nn.Conv2d(in_channels, width, kernel_size=1, bias=False)
        self.missing_previous_emb = nn.Parameter(torch.zeros(1, width, 1, 1))
        self.out_channels = 2 * width

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        current = self.backbone_to_vit(features)
        b, _, h, w = current.shape
        return torch.cat([current, self.missing_previous_emb.to(current.dtype).expand(b, -1, h, w)], dim=1)


@dataclass(frozen=True)
class BioViLWeights:
    """A hi-ml-multimodal image file mapped to :class:`~medclr.models.image.ImageEncoder` keys.

    kind: "biovil" or "biovil_t"; arch: the ResNet ("resnet50" for the published files); joint_dim: the
    projector's output size; state: the tensors under medclr's names; left_out: how many tensors were not needed.
    """

    kind: str
    arch: str
    joint_dim: int
    state: dict[str, torch.Tensor]
    left_out: int

    @property
    def neck(self) -> str | None:
        return "biovil_t" if self.kind == "biovil_t" else None


def read_biovil_weights(path: str | os.PathLike) -> BioViLWeights:
    """Read a BioViL / BioViL-T image file (``torch.save`` of hi-ml-multimodal's ``ImageModel.state_dict()``, e.g.
    ``biovil_image_resnet50_proj_size_128.pt``) with ``weights_only=True``; one :class:`MedclrError` line when the
    file is missing, unreadable or not in that layout."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise MedclrError(f"BioViL image weights {str(p)!r}: no such file (expected hi-ml-multimodal's "
                          "biovil_image_resnet50_proj_size_128.pt or biovil_t_image_model_proj_size_128.pt)")
    try:
        try:
            # mmap: the tensors stay in the file until the tower copies them, so reading it costs no heap (100 MB
            # for BioViL that the allocator would keep after the copy); only torch's zip format maps
            state = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, or a pickle that is more than tensors
        raise MedclrError(f"BioViL image weights {str(p)!r}: cannot be read as a state dict ({one_line(exc)})") from exc
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):  # a Lightning checkpoint of ImageModel
        state = {k.removeprefix("model."): v for k, v in state["state_dict"].items()}
    if not isinstance(state, dict) or not any(str(k).startswith(_TRUNK) for k in state):
        raise MedclrError(f"BioViL image weights {str(p)!r}: no 'encoder.encoder.*' tensors, so not a hi-ml-multimodal "
                          "ImageModel state dict (a torchvision ResNet file goes to model.image_pretrained=imagenet)")
    mapped: dict[str, torch.Tensor] = {}
    left_out = 0
    for key, tensor in state.items():
        if key.startswith(_UNUSED):
            left_out += 1
        elif key.startswith(_TRUNK):
            mapped["trunk." + key[len(_TRUNK):]] = tensor
        elif key.startswith(_PROJ):
            mapped["proj." + key[len(_PROJ):]] = tensor
        elif key in _NECK:
            mapped[_NECK[key]] = tensor
        else:
            raise MedclrError(f"BioViL image weights {str(p)!r}: unexpected tensor {key!r} (not BioViL's or BioViL-T's "
                              "image model)")
    if "proj.3.weight" not in mapped:
        raise MedclrError(f"BioViL image weights {str(p)!r}: no projector (projector.model.3.weight)")
    kind = "biovil_t" if "neck.backbone_to_vit.weight" in mapped else "biovil"
    # Bottleneck blocks (ResNet-50) have a third conv; BasicBlocks (ResNet-18) do not
    arch = "resnet50" if "trunk.layer1.0.conv3.weight" in mapped else "resnet18"
    weights = BioViLWeights(kind, arch, int(mapped["proj.3.weight"].shape[0]), mapped, left_out)
    if left_out:
        log.info("BioViL image weights %s: %d tensors not needed for one film (classifier, fc, BioViL-T's prior-image "
                 "transformer)", p, left_out)
    return weights


def load_biovil_into(encoder: nn.Module, weights: BioViLWeights, source: str | os.PathLike) -> None:
    """Load mapped BioViL weights into an :class:`ImageEncoder` built to fit them; every tensor must land."""
    missing, unexpected = encoder.load_state_dict(weights.state, strict=False)
    if missing or unexpected:
        raise MedclrError(f"BioViL image weights {os.fspath(source)!r} do not fit the image encoder: {len(missing)} "
                          f"missing, {len(unexpected)} unexpected tensors (e.g. {sorted(missing + unexpected)[:2]})")
