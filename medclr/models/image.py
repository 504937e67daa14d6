"""Image encoder: a torchvision ResNet trunk -> region features + a global embedding.

Geometry (same as BioViL, see docs/models.md):
- input ``B x 1 x H x W`` float in [0, 1] (the `medclr.io.read_image` convention; air dark);
- the trunk is the ResNet cut after ``layer4`` (stride 32), so the region grid is
  ``h x w = ceil(H/32) x ceil(W/32)`` (224 -> 7x7, 480 -> 15x15, 512 -> 16x16); with
  ``output_stride=16`` the first block of ``layer4`` keeps stride 1 (an unstrided last stage, as
  DeepLab's output stride 16 but without dilation, which torchvision's BasicBlock lacks), so small
  CPU crops still give a grid that can localise (128 -> 8x8, 96 -> 6x6);
- ``stages=3`` cuts the trunk after ``layer3`` (natural stride 16, 256 channels for ResNet-18): half
  of ResNet-18's compute at a given size, and with ``output_stride=8`` (``layer3`` unstrided too) a 64 px
  crop still gives an 8x8 grid at a fifth of the stride-16 ResNet-18's cost at 128 px (docs/training.md);
- ``regions`` are the last kept stage's map projected to the joint dim by a 1x1 conv (``projector="linear"``,
  the "linear mapping to a 128-d space" of the sample-specific debiasing paper, §3.2) or BioViL's
  two-layer 1x1-conv projector (``projector="mlp"``): ``B x D x h x w``, channel-first like every
  torchvision feature map, NOT normalised;
- ``global_emb`` is the spatial mean of the projected regions, L2-normalised (BioViL's
  ``projected_global_embedding``: project first, pool second, no separate global head).

Input normalisation: the grey channel is repeated to 3 channels inside the model and, by default
(``input_norm="auto"``: "imagenet" except for BioViL weights), standardised with the ImageNet mean/std that
torchvision's weights expect. With random init this is harmless (conv1 is followed by BatchNorm);
``input_norm="none"`` feeds [0, 1] grey as BioViL does.

Published chest X-ray weights: ``pretrained="biovil"`` with ``weights_path`` = hi-ml-multimodal's BioViL or
BioViL-T image file (:mod:`medclr.models.biovil` maps its keys; BioViL-T adds its single-image neck). The trunk,
projector and joint size must be the file's (a mismatch is one error line naming the settings to use).

ImageNet weights are used only if the torchvision weight file is already on disk (the torch hub
cache, ``$TORCH_HOME/hub/checkpoints``, or an explicit ``weights_path``): nothing is downloaded.
"""

from __future__ import annotations

import logging
import math
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import nn

from medclr.errors import MedclrError
from medclr.models.biovil import TemporalNeck, load_biovil_into, read_biovil_weights

log = logging.getLogger(__name__)

# Trunk name -> (torchvision builder, layer4 channels, ImageNet weight enums in order of preference);
# layer3 has half layer4's channels in both.
# The weight file names come from the enums' URLs, so they track torchvision rather than being
# hard-coded here.
_ARCHS: dict[str, tuple[Any, int, tuple[Any, ...]]] = {
    "resnet18": (torchvision.models.resnet18, 512, (torchvision.models.ResNet18_Weights.IMAGENET1K_V1,)),
    "resnet50": (
        torchvision.models.resnet50,
        2048,
        (torchvision.models.ResNet50_Weights.IMAGENET1K_V2, torchvision.models.ResNet50_Weights.IMAGENET1K_V1),
    ),
}
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_STRIDE = 32


@dataclass
class ImageFeatures:
    """Output of :class:`ImageEncoder`.

    regions:    B x D x h x w, projected layer4 cells (not normalised; heads normalise per cell).
    global_emb: B x D, L2-normalised mean of ``regions``.
    """

    regions: torch.Tensor
    global_emb: torch.Tensor

    @property
    def grid(self) -> tuple[int, int]:
        return int(self.regions.shape[-2]), int(self.regions.shape[-1])

    def float(self) -> ImageFeatures:
        """The features in float32: what the heads score outside autocast (bf16 regions from an
        autocast trunk would meet the float32 weights of the non-local block)."""
        return ImageFeatures(self.regions.float(), self.global_emb.float())


def cached_imagenet_weights(arch: str) -> Path | None:
    """Path of a torchvision ImageNet weight file for ``arch`` already in the torch hub cache, else None.

    Only looks at the file system (``torch.hub.get_dir()/checkpoints``, which honours ``$TORCH_HOME``);
    never touches the network.
    """
    if arch not in _ARCHS:
        raise MedclrError(f"image arch {arch!r}: expected one of {sorted(_ARCHS)}")
    ckpt_dir = Path(torch.hub.get_dir()) / "checkpoints"
    for weights in _ARCHS[arch][2]:
        path = ckpt_dir / os.path.basename(weights.url)
        if path.is_file():
            return path
    return None


def grid_size(height: int, width: int, output_stride: int = _STRIDE) -> tuple[int, int]:
    """Region grid of a ResNet cut after layer4: every stride-2 stage rounds up, so ceil(x / stride)."""
    return math.ceil(height / output_stride), math.ceil(width / output_stride)


def _unstride(stage: nn.Sequential) -> None:
    """A stage's first block at stride 1 (its 3x3 conv and its 1x1 shortcut): the output stride halves.
    The weights are unchanged (a stride only changes where a kernel is applied), so ImageNet
    initialisation still fits."""
    block = stage[0]
    conv = block.conv2 if hasattr(block, "conv3") else block.conv1  # Bottleneck strides its 3x3 conv2
    conv.stride = (1, 1)
    if block.downsample is not None:
        block.downsample[0].stride = (1, 1)


class ImageEncoder(nn.Module):
    """ResNet-18/50 trunk + 1x1 projection to the joint space.

    Args:
        arch: "resnet18" or "resnet50".
        joint_dim: D, the joint image-text embedding size (128 in BioViL and the paper).
        projector: "linear" (one 1x1 conv with bias) or "mlp" (BioViL: 1x1 conv no bias -> BN -> ReLU
            -> 1x1 conv).
        pretrained: "auto" = ImageNet weights if the file is cached locally, else random init (logged);
            "imagenet" = require the cached file (MedclrError if missing); "none" = random init;
            "biovil" = BioViL / BioViL-T weights from ``weights_path`` (trunk, projector and, for BioViL-T, its neck).
        weights_path: an explicit torchvision ResNet state-dict file (.pth), which implies ImageNet init; with
            ``pretrained="biovil"``, hi-ml-multimodal's image model file.
        input_norm: "imagenet", "none" or "auto" (none for BioViL weights, else imagenet; see module docstring).
        neck: None, or "biovil_t" (BioViL-T's single-image neck between trunk and projector; set from the file
            when ``pretrained="biovil"``, and by :meth:`from_config`).
        output_stride: the region grid's stride: 32 (torchvision's ResNet), 16 (last stage unstrided, or
            ``stages=3`` as is) or 8 (the last two kept stages unstrided).
        stages: ResNet stages kept, 4 (the whole trunk) or 3 (cut after layer3).
        channels_last: run the trunk in channels-last memory format (faster convs on many CPUs/GPUs;
            outputs are the same up to float rounding).
    """

    def __init__(
        self,
        arch: str = "resnet18",
        joint_dim: int = 128,
        projector: str = "linear",
        pretrained: str = "auto",
        weights_path: str | os.PathLike | None = None,
        input_norm: str = "auto",
        channels_last: bool = False,
        output_stride: int = _STRIDE,
        stages: int = 4,
        neck: str | None = None,
    ) -> None:
        super().__init__()
        if stages not in (3, 4):
            raise MedclrError(f"image stages {stages!r}: expected 4 (the whole ResNet) or 3 (cut after layer3)")
        if output_stride not in (8, 16, 32) or output_stride > 2 ** (stages + 1):
            raise MedclrError(f"image output_stride {output_stride!r}: expected 32, 16 or 8 "
                              f"(at most {2 ** (stages + 1)} with stages={stages})")
        if arch not in _ARCHS:
            raise MedclrError(f"image arch {arch!r}: expected one of {sorted(_ARCHS)}")
        if projector not in ("linear", "mlp"):
            raise MedclrError(f"image projector {projector!r}: expected 'linear' or 'mlp'")
        if pretrained not in ("auto", "imagenet", "none", "biovil"):
            raise MedclrError(f"image pretrained {pretrained!r}: expected 'auto', 'imagenet', 'none' or 'biovil'")
        if input_norm not in ("auto", "imagenet", "none"):
            raise MedclrError(f"image input_norm {input_norm!r}: expected 'auto', 'imagenet' or 'none'")
        if neck not in (None, "biovil_t"):
            raise MedclrError(f"image neck {neck!r}: expected none or 'biovil_t'")
        biovil = None
        if pretrained == "biovil":
            if weights_path is None:
                raise MedclrError("image pretrained 'biovil' needs the weights file (model.image_weights / weights_path=): "
                                  "hi-ml-multimodal's BioViL or BioViL-T image model .pt")
            biovil = read_biovil_weights(weights_path)
            _check_fits_biovil(biovil, arch, joint_dim, projector, stages, output_stride)
            neck = biovil.neck
        if input_norm == "auto":
            input_norm = "none" if pretrained == "biovil" else "imagenet"
        builder, channels, _ = _ARCHS[arch]
        self.arch, self.joint_dim, self.projector_kind = arch, int(joint_dim), projector
        self.pretrained, self.input_norm, self.channels_last = pretrained, input_norm, bool(channels_last)

        resnet = builder(weights=None)  # weights=None: torchvision never downloads
        self.init = biovil.kind if biovil else self._maybe_load_imagenet(resnet, weights_path)
        self.output_stride, self.stages = int(output_stride), int(stages)
        kept = [resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4][:stages]
        natural_stride = 2 ** (stages + 1)  # conv1 and maxpool halve twice, every kept stage after layer1 once
        halvings_undone = int(math.log2(natural_stride // self.output_stride))
        for stage in kept[len(kept) - halvings_undone:]:
            _unstride(stage)
        # Keep torchvision's child names so ImageNet state dicts (minus fc) line up key for key.
        names = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")[: 4 + stages]
        self.trunk = nn.Sequential(OrderedDict((n, getattr(resnet, n)) for n in names))
        self.out_channels = channels if stages == 4 else channels // 2
        self.neck_kind = neck
        self.neck = TemporalNeck(self.out_channels) if neck == "biovil_t" else None
        proj_in = self.neck.out_channels if self.neck is not None else self.out_channels

        if projector == "linear":
            self.proj = nn.Conv2d(proj_in, joint_dim, kernel_size=1)
        else:
            self.proj = nn.Sequential(
                nn.Conv2d(proj_in, joint_dim, kernel_size=1, bias=False),
                nn.BatchNorm2d(joint_dim),
                nn.ReLU(inplace=True),
                nn.Conv2d(joint_dim, joint_dim, kernel_size=1),
            )
        # Buffers (not parameters) so .to(device) moves them and they never get gradients;
        # persistent=False keeps them out of the checkpoint (they are constants of input_norm).
        mean = torch.tensor(_IMAGENET_MEAN if input_norm == "imagenet" else (0.0,) * 3).view(1, 3, 1, 1)
        std = torch.tensor(_IMAGENET_STD if input_norm == "imagenet" else (1.0,) * 3).view(1, 3, 1, 1)
        self.register_buffer("mean", mean, persistent=False)
        self.register_buffer("std", std, persistent=False)
        if biovil is not None:
            load_biovil_into(self, biovil, weights_path)
            log.info("image encoder %s: %s init from %s", arch, biovil.kind, weights_path)
        if self.channels_last:
            self.to(memory_format=torch.channels_last)

    # -- weights -----------------------------------------------------------------------------------
    def _maybe_load_imagenet(self, resnet: nn.Module, weights_path: str | os.PathLike | None) -> str:
        if weights_path is not None:
            path: Path | None = Path(weights_path)
            if not path.is_file():
                raise MedclrError(f"image weights_path {str(path)!r}: no such file (expected a torchvision .pth)")
        elif self.pretrained == "none":
            return "random"
        else:
            path = cached_imagenet_weights(self.arch)
            if path is None:
                where = Path(torch.hub.get_dir()) / "checkpoints"
                names = ", ".join(os.path.basename(w.url) for w in _ARCHS[self.arch][2])
                if self.pretrained == "imagenet":
                    raise MedclrError(
                        f"ImageNet weights for {self.arch} are not cached: put {names} in {where} "
                        "(or pass weights_path=...; medclr never downloads)"
                    )
                log.info("image encoder %s: random init (no cached ImageNet weights in %s)", self.arch, where)
                return "random"
        try:
            # weights_only=True: a .pth is a pickle; never execute code from it.
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # corrupt or not a state dict
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise MedclrError(f"image weights {str(path)!r}: cannot be read as a state dict ({why})") from exc
        if not isinstance(state, dict):
            raise MedclrError(f"image weights {str(path)!r}: expected a state dict, got {type(state).__name__}")
        state = {k: v for k, v in state.items() if not k.startswith("fc.")}  # classifier is not used
        missing, unexpected = resnet.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith("fc.")]
        if missing or unexpected:
            raise MedclrError(
                f"image weights {str(path)!r} do not fit {self.arch}: "
                f"{len(missing)} missing, {len(unexpected)} unexpected keys (e.g. {(missing + unexpected)[:2]})"
            )
        log.info("image encoder %s: ImageNet init from %s", self.arch, path)
        return "imagenet"

    # -- forward -----------------------------------------------------------------------------------
    def forward(self, images: torch.Tensor) -> ImageFeatures:
        """images: B x 1 x H x W (or B x 3 x H x W grey already repeated) in [0, 1]."""
        if images.dim() != 4 or images.shape[1] not in (1, 3) or not images.is_floating_point():
            raise MedclrError(f"images: expected B x 1 x H x W in [0, 1], got {tuple(images.shape)} {images.dtype}")
        x = images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images
        # match the trunk's dtype (a float64 or fp16 batch would otherwise fail in conv1); autocast
        # still takes over inside the trunk when enabled
        x = ((x - self.mean) / self.std).to(self.std.dtype)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        features = self.trunk(x)
        regions = self.proj(features if self.neck is None else self.neck(features))
        # Downstream code (heads, grounding) reshapes/views regions; hand back a standard layout.
        regions = regions.contiguous()
        pooled = regions.float().mean(dim=(2, 3))
        global_emb = nn.functional.normalize(pooled, dim=-1).to(regions.dtype)
        return ImageFeatures(regions=regions, global_emb=global_emb)

    # -- config ------------------------------------------------------------------------------------
    def to_config(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "joint_dim": self.joint_dim,
            "projector": self.projector_kind,
            "pretrained": self.pretrained,
            "input_norm": self.input_norm,
            "channels_last": self.channels_last,
            "output_stride": self.output_stride,
            "stages": self.stages,
            "neck": self.neck_kind,
            "init": self.init,  # provenance only: what the trunk started from when it was built
        }

    @classmethod
    def from_config(cls, cfg: dict[str, Any], load_weights: bool = True) -> ImageEncoder:
        """Rebuild from :meth:`to_config`. ``load_weights=False`` skips the ImageNet file (the caller
        is about to load a checkpoint over it)."""
        known = {"arch", "joint_dim", "projector", "pretrained", "input_norm", "channels_last", "output_stride", "stages",
                 "neck"}
        kwargs = {k: v for k, v in cfg.items() if k in known}
        # BioViL's file is not recorded: a checkpoint carries those weights itself
        skip_file = not load_weights or kwargs.get("pretrained") == "biovil"
        if skip_file:
            kwargs["pretrained"] = "none"
        enc = cls(**kwargs)
        if skip_file:
            enc.pretrained = cfg.get("pretrained", "auto")
            enc.init = cfg.get("init", enc.init)
        return enc


def _check_fits_biovil(weights, arch: str, joint_dim: int, projector: str, stages: int, output_stride: int) -> None:
    """An encoder asked to take BioViL weights must have their shapes: one line naming the settings to use."""
    wrong = [f"{name}={want}" for name, want, got in (
        ("model.arch", weights.arch, arch), ("model.joint_dim", weights.joint_dim, int(joint_dim)),
        ("model.projector", "mlp", projector), ("model.stages", 4, stages), ("model.output_stride", 32, output_stride),
    ) if want != got]
    if wrong:
        raise MedclrError(f"{weights.kind} image weights need {' '.join(wrong)} (the file's trunk and projector)")
