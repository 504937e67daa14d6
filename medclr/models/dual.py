"""DualEncoder: image encoder + text encoder + similarity head, with a checkpoint-directory format.

Checkpoint directory (docs/models.md): ``config.json`` (``to_config()``, enough to rebuild the modules),
``model.safetensors`` (all parameters and persistent buffers), ``tokenizer/`` (the text tokenizer's
``save_pretrained``). Other files there (loss state, optimizer, trainer state) belong to training and
are left alone. Loading never unpickles and never runs code from the directory.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medclr.errors import MedclrError
from medclr.files import atomic_path, stable_safetensors, write_text
from medclr.hub import one_line
from medclr.models.hub import load_tokenizer
from medclr.models.image import ImageEncoder, ImageFeatures
from medclr.models.similarity import build_head
from medclr.models.text import TextEncoder, TextFeatures

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_DIR = "tokenizer"
FORMAT = "medclr.dual_encoder/1"


class DualEncoder(nn.Module):
    """``text_encoder`` is None in a model loaded with ``from_pretrained(..., text=False)`` (scoring with stored
    prompt embeddings needs no text tower); :meth:`attach_text` adds it from the same directory."""

    def __init__(self, image_encoder: ImageEncoder, text_encoder: TextEncoder | None, head: nn.Module) -> None:
        super().__init__()
        if text_encoder is not None and image_encoder.joint_dim != text_encoder.joint_dim:
            raise MedclrError(
                f"joint dims differ: image {image_encoder.joint_dim} vs text {text_encoder.joint_dim}"
            )
        self.image_encoder, self.text_encoder, self.head = image_encoder, text_encoder, head

    @property
    def joint_dim(self) -> int:
        return self.image_encoder.joint_dim

    @property
    def tokenizer(self) -> Any:
        return None if self.text_encoder is None else self.text_encoder.tokenizer

    # -- forward pieces -----------------------------------------------------------------------------
    def encode_image(self, images: torch.Tensor) -> ImageFeatures:
        """B x 1 x H x W in [0, 1] -> ImageFeatures(regions B x D x h x w, global_emb B x D unit)."""
        return self.image_encoder(images)

    def encode_text(self, text: Sequence[str] | str | Mapping[str, torch.Tensor]) -> TextFeatures:
        """Sentences (tokenised here) or a pre-tokenised batch -> TextFeatures (embedding B x D unit)."""
        if isinstance(text, Mapping):
            return self.text_encoder.encode_batch(text)
        return self.text_encoder.encode_batch(self.text_encoder.tokenize(text))

    @staticmethod
    def _text_emb(text: TextFeatures | torch.Tensor) -> torch.Tensor:
        return text.embedding if isinstance(text, TextFeatures) else text

    def similarity(self, image: ImageFeatures, text: TextFeatures | torch.Tensor) -> torch.Tensor:
        """B_img x B_txt similarity matrix (row = image, column = sentence) in [-1, 1]."""
        return self.head(image, self._text_emb(text))

    def region_scores(self, image: ImageFeatures, text: TextFeatures | torch.Tensor) -> torch.Tensor:
        """B_img x B_txt x h x w region-sentence cosines (the grounding heatmap before resizing)."""
        return self.head.region_scores(image, self._text_emb(text))

    def forward(
        self, images: torch.Tensor, text: Sequence[str] | Mapping[str, torch.Tensor]
    ) -> tuple[ImageFeatures, TextFeatures, torch.Tensor]:
        img, txt = self.encode_image(images), self.encode_text(text)
        return img, txt, self.similarity(img, txt)

    # -- config round trip --------------------------------------------------------------------------
    def to_config(self) -> dict[str, Any]:
        if self.text_encoder is None:
            raise MedclrError("this model was loaded without its text tower (text=False): attach_text() first")
        return {
            "format": FORMAT,
            "image": self.image_encoder.to_config(),
            "text": self.text_encoder.to_config(),
            "head": self.head.to_config(),
        }

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], tokenizer: Any = None, load_image_weights: bool = True,
                    text: bool = True) -> DualEncoder:
        """Rebuild the architecture from :meth:`to_config` (random weights except, when
        ``load_image_weights``, cached ImageNet weights as the image config asks); ``text=False``: no text tower."""
        _check_format(cfg)
        image = ImageEncoder.from_config(cfg["image"], load_weights=load_image_weights)
        head = build_head(cfg["head"], dim=image.joint_dim)
        return cls(image, TextEncoder.from_config(cfg["text"], tokenizer=tokenizer) if text else None, head)

    # -- checkpoint directory -----------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        from safetensors.torch import save_model

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        # a crash never leaves a half-written checkpoint file (weights first: the config names what they are)
        with atomic_path(out / WEIGHTS_NAME) as tmp:
            # save_model (not save_file) de-duplicates tied/shared tensors instead of failing on them.
            save_model(self, str(tmp), metadata={"format": "pt", "medclr": FORMAT})
            stable_safetensors(tmp)  # the same tensors: the same bytes (and SHA-256), whatever the process
        write_text(out / CONFIG_NAME, json.dumps(self.to_config(), indent=2, sort_keys=True, default=str))
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(out / TOKENIZER_DIR)
        return out

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, map_location: str | torch.device = "cpu",
                        text: bool = True) -> DualEncoder:
        """The model of a checkpoint directory; ``text=False`` leaves the text tower (and transformers, its
        tokenizer and a third of the weights of a small model) unloaded until :meth:`attach_text`."""
        src = Path(directory)
        cfg = _read_config(src)
        try:
            # The trunk's ImageNet file is not needed: every weight comes from model.safetensors. So is no random
            # initialisation (a third of a ResNet-50 + BERT load on a CPU): the tensors are made on the target
            # device and left unfilled; the strict check in _fill proves the file fills every one of them.
            with _no_random_init(text), torch.device(map_location):
                model = cls.from_config(cfg, tokenizer=_tokenizer(src) if text else None, load_image_weights=False,
                                        text=text)
        except (KeyError, TypeError) as exc:
            raise MedclrError(f"checkpoint {str(src / CONFIG_NAME)!r}: incomplete or invalid model config "
                              f"({one_line(exc)})") from exc
        _fill(model, src, map_location, skip=() if text else ("text_encoder.",))
        return model.to(map_location)

    def attach_text(self, directory: str | os.PathLike) -> None:
        """Load the text tower of the checkpoint ``directory`` this model's image tower came from."""
        if self.text_encoder is not None:
            return
        src = Path(directory)
        device = next(self.image_encoder.parameters()).device
        cfg = _read_config(src)
        _check_format(cfg)
        with _no_random_init(True), torch.device(device):
            holder = nn.Module()
            holder.text_encoder = TextEncoder.from_config(cfg["text"], tokenizer=_tokenizer(src))
        _fill(holder, src, device, skip=("image_encoder.", "head."))
        if holder.text_encoder.joint_dim != self.joint_dim:
            raise MedclrError(f"checkpoint {str(src)!r}: its text tower's joint dim {holder.text_encoder.joint_dim} "
                              f"is not the image tower's {self.joint_dim}")
        self.text_encoder = holder.text_encoder.to(device).train(self.training)


def _read_config(src: Path) -> Any:
    """config.json, once the weights file beside it is known to exist (from_config checks its format)."""
    cfg_path, w_path = src / CONFIG_NAME, src / WEIGHTS_NAME
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise MedclrError(f"checkpoint {str(src)!r}: missing {p.name} (expected a `medclr train` output dir)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as exc:
        raise MedclrError(f"checkpoint {str(cfg_path)!r}: not valid JSON ({one_line(exc)})") from exc
    return cfg


def _check_format(cfg: Any) -> None:
    if not isinstance(cfg, Mapping) or cfg.get("format") != FORMAT:
        got = cfg.get("format") if isinstance(cfg, Mapping) else type(cfg).__name__
        raise MedclrError(f"model config: format {got!r}, expected {FORMAT!r}")


def _tokenizer(src: Path) -> Any:
    tok_dir = src / TOKENIZER_DIR
    return load_tokenizer(tok_dir, trust_remote_code=False) if tok_dir.is_dir() else None


def _fill(model: nn.Module, src: Path, device, skip: tuple[str, ...]) -> None:
    """Fill every tensor of ``model`` from ``src``'s weights file; the file's tensors under the ``skip`` prefixes
    are the parts not built. Anything else missing or left over means the file does not match its config."""
    from safetensors.torch import load_model

    w_path = src / WEIGHTS_NAME
    try:
        missing, unexpected = load_model(model, str(w_path), strict=False, device=str(device))
    except Exception as exc:  # safetensors raises its own error types on corrupt files
        raise MedclrError(f"checkpoint {str(w_path)!r}: cannot be read ({one_line(exc)})") from exc
    unexpected = [k for k in unexpected if not k.startswith(skip)] if skip else unexpected
    if missing or unexpected:
        raise MedclrError(
            f"checkpoint {str(w_path)!r} does not match its config.json: {len(missing)} missing, "
            f"{len(unexpected)} unexpected tensors (e.g. {sorted(missing + unexpected)[:3]})"
        )


def _no_random_init(text: bool):
    """transformers' context that turns torch's and its own weight initialisers into no-ops (both towers). Without
    the text tower, none: importing transformers for it would cost more (1-3 s) than the image tower's random
    initialisation (0.15 s for ResNet-18, 0.36 s for ResNet-50 on 2 cores)."""
    if not text:
        return contextlib.nullcontext()
    try:
        from transformers.initialization import no_init_weights  # transformers >= 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def build_dual_encoder(
    text_model: str | os.PathLike,
    *,
    arch: str = "resnet18",
    joint_dim: int = 128,
    head: str | Mapping[str, Any] = "lse_nl",
    image_pretrained: str = "auto",
    image_weights: str | os.PathLike | None = None,
    projector: str = "linear",
    input_norm: str = "auto",
    channels_last: bool = False,
    output_stride: int = 32,
    stages: int = 4,
    pooling: str = "cls",
    max_length: int = 128,
    allow_network: bool = False,
    trust_remote_code: bool = False,
) -> DualEncoder:
    """A fresh model for training: ResNet trunk (ImageNet init only if cached, or the weights file
    ``image_weights``: torchvision's, or BioViL's with ``image_pretrained="biovil"``) + the text model at
    ``text_model`` (local dir or cached hub id) + a head. Seed torch before calling for a
    reproducible initialisation."""
    from medclr.hub import resolve_model_dir

    # the text model is found first: a missing one is one line before the image tower is built
    resolve_model_dir(text_model, allow_network=allow_network, trust_remote_code=trust_remote_code)
    image = ImageEncoder(arch, joint_dim=joint_dim, projector=projector, pretrained=image_pretrained,
                         weights_path=image_weights, input_norm=input_norm, channels_last=channels_last,
                         output_stride=output_stride, stages=stages)
    text = TextEncoder.from_pretrained(text_model, joint_dim=joint_dim, pooling=pooling, max_length=max_length,
                                       allow_network=allow_network, trust_remote_code=trust_remote_code)
    return DualEncoder(image, text, build_head(dict(head) if isinstance(head, Mapping) else head, dim=joint_dim))
