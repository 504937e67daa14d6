"""Inference on a trained checkpoint: load it, embed images and texts, zero-shot scores, grounding maps.

Used by the app, the index builder, the batch scorer and evaluation, so that every consumer sees the
same preprocessing and the same maths.

* Image preprocessing matches training's deterministic view (and BioViL's, DATASETS §1.3):
  ``medclr.io.read_image`` (float32 H x W in [0, 1], air dark) -> shorter side resized to R (area
  averaging when shrinking) -> centre crop C -> ``1 x C x C``. C (``image_size``) and R (``resize``, default C) come from the checkpoint (see
  :func:`read_checkpoint_info`); default 224. The :class:`CropGeometry` returned with the tensor
  undoes the crop for heatmaps (BioViL's ``convert_similarity_to_image_size``: NaN outside the crop).
* Zero-shot: for each class, the image-sentence score s (the checkpoint's similarity head, the score
  the loss was trained on) with the positive and the negative prompt set; probability =
  softmax((s_neg, s_pos) / tau)[1]. Prompt sets with several prompts are reduced BioViL-style (mean of
  unnormalised projections, then L2-normalised). Default prompts: ``medclr.prompts.CHEX5_PROMPTS``.
* Grounding: the head's region-sentence cosines (``DualEncoder.region_scores``), optionally smoothed
  on the grid (Gaussian, sigma in cells; BioViL uses 1.5), upsampled into the crop, NaN-padded to the
  original size.
* Sentence statistics: eta_LM from the eta table recorded in the checkpoint's training config, and
  NUCLR's learned popularity zeta from ``loss_state.safetensors`` (indexed by manifest ``index``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medclr.errors import MedclrError
from medclr.io import MAX_PIXELS, read_image
from medclr.models.dual import CONFIG_NAME, WEIGHTS_NAME, DualEncoder
from medclr.models.image import ImageFeatures
from medclr.prompts import CHEX5_PROMPTS, PromptSet

log = logging.getLogger(__name__)

PREPROCESS_NAME = "preprocess.json"  # {"image_size": C, "resize": R} written by training
LOSS_STATE_NAME = "loss_state.safetensors"
DEFAULT_IMAGE_SIZE = 224
DEFAULT_TAU = 1.0 / 14.0  # the paper initialises the hypersphere radius at sqrt(14): tau = 1/gamma^2
_TRAIN_FILES = ("train_config.yaml", "train_config.json", "config.yaml", "trainer_state.json")
# dotted keys looked up (in order) in preprocess.json, config.json and the training files
_KEYS = {
    "image_size": ("image_size", "preprocess.image_size", "image.image_size", "data.image_size", "data.crop_size",
                   "model.image_size", "training.data.image_size"),
    "resize": ("resize", "preprocess.resize", "image.resize", "data.resize", "training.data.resize"),
    "tau": ("tau", "loss.tau", "training.loss.tau", "inference.tau"),
    "eta_table": ("eta_table", "data.eta", "data.eta_table", "training.data.eta", "inference.eta_table"),
    "manifest": ("data.manifest", "manifest", "training.data.manifest"),
}


# --------------------------------------------------------------------------------- preprocessing
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


@dataclass(frozen=True)
class CropGeometry:
    """Where the model's C x C crop lies in an original H x W image (hi-ml conventions)."""

    height: int
    width: int
    resize: int
    crop: int

    @property
    def side(self) -> int:
        """Crop side in original pixels: floor(C * min(H, W) / R)."""
        return int(self.crop * min(self.height, self.width) // self.resize)

    def box(self) -> tuple[int, int, int, int]:
        """(top, left, bottom, right) of the crop in original pixels (floor margins, as hi-ml)."""
        side = self.side
        top, left = (self.height - side) // 2, (self.width - side) // 2
        return top, left, top + side, left + side

    def resized(self, height: int, width: int) -> "CropGeometry":
        """The same crop for a display copy of the image scaled to ``height x width``."""
        return CropGeometry(int(height), int(width), self.resize, self.crop)

    def to_original(self, grid_map: np.ndarray, interpolation: str = "bilinear") -> np.ndarray:
        """h x w map over the crop -> H x W float32, upsampled into the crop, NaN outside it."""
        top, left, bottom, right = self.box()
        t = torch.as_tensor(np.asarray(grid_map, dtype=np.float32))[None, None]
        kw = {"align_corners": False} if interpolation in ("bilinear", "bicubic") else {}
        up = torch.nn.functional.interpolate(t, size=(bottom - top, right - left), mode=interpolation, **kw)[0, 0]
        out = np.full((self.height, self.width), np.nan, dtype=np.float32)
        out[top:bottom, left:right] = up.numpy()
        return out


def preprocess_image(image: np.ndarray, pre: Preprocess = Preprocess()) -> tuple[torch.Tensor, CropGeometry]:
    """H x W float image in [0, 1] -> (1 x C x C float32 tensor, its crop geometry).

    The deterministic view of training (``training/data.py``): shorter side resized to R (longer side
    round(long * R / short)), area averaging when shrinking and bilinear when enlarging, then MONAI's
    ``CenterSpatialCrop(C)`` (start = size // 2 - C // 2). Training may cache the resized image as
    uint8; that quantisation (< 1/255) is not repeated here."""
    arr = np.asarray(image, dtype=np.float32)
    if arr.ndim != 2 or min(arr.shape) < 1:
        raise MedclrError(f"image: expected a 2-D grey array, got shape {arr.shape}")
    h, w = arr.shape
    r, c = pre.resize_to, int(pre.image_size)
    s = r / min(h, w)
    size = (max(r, round(h * s)), max(r, round(w * s)))
    t = torch.from_numpy(np.ascontiguousarray(arr))[None, None]
    if s < 1:
        t = torch.nn.functional.interpolate(t, size=size, mode="area")
    else:
        t = torch.nn.functional.interpolate(t, size=size, mode="bilinear", align_corners=False)
    top, left = size[0] // 2 - c // 2, size[1] // 2 - c // 2
    t = t[0, :, top:top + c, left:left + c].clamp_(0.0, 1.0).contiguous()
    return t, CropGeometry(h, w, r, c)


class ImageFiles(torch.utils.data.Dataset):
    """Decode + preprocess files (in DataLoader workers). Items never raise: a bad file gives
    ``ok=False`` and its one-line error, so a batch job records it and goes on."""

    def __init__(self, paths: Sequence[str | os.PathLike], pre: Preprocess, max_pixels: int = MAX_PIXELS) -> None:
        self.paths, self.pre, self.max_pixels = [str(p) for p in paths], pre, max_pixels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        c = int(self.pre.image_size)
        try:
            arr = read_image(self.paths[i], max_pixels=self.max_pixels)
            tensor, geo = preprocess_image(arr, self.pre)
            return {"i": i, "tensor": tensor, "ok": True, "error": "", "height": geo.height, "width": geo.width}
        except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded error row
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return {"i": i, "tensor": torch.zeros(1, c, c), "ok": False, "error": msg, "height": 0, "width": 0}


def collate_images(batch: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "i": torch.tensor([b["i"] for b in batch], dtype=torch.long),
        "tensor": torch.stack([b["tensor"] for b in batch]),
        "ok": torch.tensor([b["ok"] for b in batch], dtype=torch.bool),
        "error": [b["error"] for b in batch],
        "height": [b["height"] for b in batch],
        "width": [b["width"] for b in batch],
    }


def worker_init(_worker_id: int) -> None:
    """DataLoader workers decode with one thread each; the model keeps the cores."""
    torch.set_num_threads(1)


def image_loader(paths: Sequence[str | os.PathLike], pre: Preprocess, batch_size: int = 16, num_workers: int = 0,
                 max_pixels: int = MAX_PIXELS, prefetch_factor: int = 4) -> torch.utils.data.DataLoader:
    """An ordered DataLoader over :class:`ImageFiles` (workers decode while the model runs)."""
    kw: dict[str, Any] = {}
    if num_workers > 0:
        kw = {"worker_init_fn": worker_init, "prefetch_factor": prefetch_factor, "persistent_workers": False}
    return torch.utils.data.DataLoader(ImageFiles(paths, pre, max_pixels), batch_size=batch_size, shuffle=False,
                                       num_workers=num_workers, collate_fn=collate_images, **kw)


# --------------------------------------------------------------------------------- checkpoint info
def _lookup(data: Mapping[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _read_structured(path: Path) -> dict[str, Any]:
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(path.read_text())
        else:
            data = json.loads(path.read_text())
    except Exception as exc:  # noqa: BLE001 - a broken side file must not stop loading the model
        log.warning("checkpoint file %s is unreadable (%s); ignored", path, type(exc).__name__)
        return {}
    return data if isinstance(data, dict) else {}


def read_checkpoint_info(directory: str | os.PathLike) -> dict[str, Any]:
    """Preprocessing and training facts of a checkpoint dir: ``image_size``, ``resize``, ``tau``,
    ``eta_table`` (absolute path or None), ``manifest``, and ``source`` (which file said so).

    Looked up, first hit wins, in ``preprocess.json`` (the contract: ``{"image_size": C, "resize": R}``),
    ``config.json`` (sections ``preprocess``, ``image``, ``training``), then training's
    ``train_config.yaml`` / ``trainer_state.json`` (keys such as ``data.image_size``, ``loss.tau``,
    ``data.eta``)."""
    src = Path(directory)
    docs = [(name, _read_structured(src / name)) for name in (PREPROCESS_NAME, CONFIG_NAME, *_TRAIN_FILES)
            if (src / name).is_file()]
    info: dict[str, Any] = {"source": {}}
    for field, keys in _KEYS.items():
        info[field] = None
        for name, data in docs:
            hit = next((v for v in (_lookup(data, k) for k in keys) if v not in (None, "")), None)
            if hit is not None:
                info[field], info["source"][field] = hit, name
                break
    for field in ("eta_table", "manifest"):
        if info[field] is not None:
            p = Path(str(info[field])).expanduser()
            info[field] = str(p if p.is_absolute() or p.exists() else (src / p))
    return info


def write_preprocess(directory: str | os.PathLike, image_size: int, resize: int | None = None) -> Path:
    """Write ``preprocess.json`` into a checkpoint dir (what training should call)."""
    Preprocess(int(image_size), None if resize is None else int(resize))  # validates
    out = Path(directory) / PREPROCESS_NAME
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"image_size": int(image_size), "resize": int(resize or image_size)}, indent=2))
    os.replace(tmp, out)
    return out


def weights_sha256(directory: str | os.PathLike) -> str:
    """SHA-256 of the checkpoint's ``model.safetensors`` (identifies the model an index was built from)."""
    h = hashlib.sha256()
    with open(Path(directory) / WEIGHTS_NAME, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------- the engine
@dataclass
class EncodedImage:
    """One image through the image encoder, kept to answer several questions with one forward."""

    features: ImageFeatures
    geometry: CropGeometry
    image: np.ndarray  # the original H x W float32 in [0, 1]


class Inference:
    """A checkpoint ready for inference (eval mode, no grad). Build with :func:`load_checkpoint`."""

    def __init__(self, model: DualEncoder, pre: Preprocess = Preprocess(), tau: float = DEFAULT_TAU,
                 checkpoint_dir: str | os.PathLike | None = None, info: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu") -> None:
        if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
            raise MedclrError(f"tau: expected a positive number, got {tau!r}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.preprocess, self.tau = pre, float(tau)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.info = dict(info or {})
        self._prompt_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._sha: str | None = None
        self._stats: Any = None

    # -- identity ---------------------------------------------------------------------------------
    @property
    def joint_dim(self) -> int:
        return self.model.joint_dim

    @property
    def weights_sha256(self) -> str:
        if self._sha is None:
            if self.checkpoint_dir is None:
                raise MedclrError("this model was not loaded from a checkpoint directory; it has no fingerprint")
            self._sha = weights_sha256(self.checkpoint_dir)
        return self._sha

    def describe(self) -> dict[str, Any]:
        """What an index/score table records about the model it came from."""
        return {"checkpoint": str(self.checkpoint_dir.resolve()) if self.checkpoint_dir else None,
                "weights_sha256": self.weights_sha256, "preprocess": asdict(self.preprocess),
                "joint_dim": self.joint_dim, "tau": self.tau}

    # -- images -----------------------------------------------------------------------------------
    @staticmethod
    def load(image: str | os.PathLike | np.ndarray, max_pixels: int = MAX_PIXELS) -> np.ndarray:
        if isinstance(image, np.ndarray):
            arr = image.astype(np.float32, copy=False)
            if arr.ndim == 3 and arr.shape[-1] in (3, 4):  # an RGB(A) array: its luminance
                arr = arr[..., :3] @ np.array([0.2125, 0.7154, 0.0721], dtype=np.float32)
            if arr.max(initial=0.0) > 1.0:
                arr = arr / 255.0 if arr.max() <= 255.0 else arr / float(arr.max())
            return arr
        return read_image(image, max_pixels=max_pixels)

    def prepare(self, image: str | os.PathLike | np.ndarray) -> tuple[torch.Tensor, CropGeometry]:
        return preprocess_image(self.load(image), self.preprocess)

    @torch.inference_mode()
    def image_features(self, batch: torch.Tensor) -> ImageFeatures:
        """B x 1 x C x C preprocessed tensor -> ImageFeatures (on this engine's device)."""
        return self.model.encode_image(batch.to(self.device, non_blocking=True))

    def encode(self, image: str | os.PathLike | np.ndarray | EncodedImage) -> EncodedImage:
        if isinstance(image, EncodedImage):
            return image
        arr = self.load(image)
        tensor, geo = preprocess_image(arr, self.preprocess)
        return EncodedImage(self.image_features(tensor[None]), geo, arr)

    def embed_images(self, images: Iterable[str | os.PathLike | np.ndarray], batch_size: int = 16,
                     num_workers: int = 0) -> np.ndarray:
        """N x D float32 unit global embeddings. Paths are decoded in ``num_workers`` DataLoader workers;
        an unreadable file raises its ``ImageReadError``."""
        items = list(images)
        out = np.zeros((len(items), self.joint_dim), dtype=np.float32)
        if items and all(not isinstance(x, np.ndarray) for x in items):
            for batch in image_loader(items, self.preprocess, batch_size, num_workers):
                bad = [e for ok, e in zip(batch["ok"].tolist(), batch["error"]) if not ok]
                if bad:
                    from medclr.errors import ImageReadError

                    raise ImageReadError(bad[0])
                out[batch["i"].numpy()] = self.image_features(batch["tensor"]).global_emb.float().cpu().numpy()
            return out
        for start in range(0, len(items), batch_size):
            chunk = torch.stack([self.prepare(x)[0] for x in items[start:start + batch_size]])
            out[start:start + len(chunk)] = self.image_features(chunk).global_emb.float().cpu().numpy()
        return out

    # -- texts ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _text(self, sentences: Sequence[str], normalize: bool, batch_size: int = 64) -> torch.Tensor:
        return self.model.text_encoder.encode(list(sentences), batch_size=batch_size, normalize=normalize).float()

    def embed_texts(self, sentences: Sequence[str] | str, batch_size: int = 64) -> np.ndarray:
        """N x D float32 unit sentence embeddings."""
        if isinstance(sentences, str):
            sentences = [sentences]
        return self._text(sentences, True, batch_size).cpu().numpy()

    def prompt_embeddings(self, prompts: PromptSet | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """class -> (positive D, negative D): mean of unnormalised projections, then L2-normalised."""
        prompts = CHEX5_PROMPTS if prompts is None else prompts
        out = {}
        for cls, sides in prompts.items():
            key = json.dumps([sides["positive"], sides["negative"]])
            if key not in self._prompt_cache:
                pos, neg = (torch.nn.functional.normalize(self._text(sides[s], False).mean(0), dim=-1)
                            for s in ("positive", "negative"))
                self._prompt_cache[key] = (pos, neg)
            out[cls] = self._prompt_cache[key]
        return out

    # -- zero-shot --------------------------------------------------------------------------------
    @torch.inference_mode()
    def zero_shot_scores(self, features: ImageFeatures, prompts: PromptSet | None = None
                         ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """(classes, prob N x C, s_pos N x C, s_neg N x C) for a batch of image features."""
        emb = self.prompt_embeddings(prompts)
        classes = list(emb)
        text = torch.stack([e for c in classes for e in emb[c]]).to(self.device)  # pos0, neg0, pos1, ...
        sim = self.model.similarity(features, text).float().reshape(-1, len(classes), 2)
        s_pos, s_neg = sim[..., 0], sim[..., 1]
        prob = torch.sigmoid((s_pos - s_neg) / self.tau)  # = softmax((s_neg, s_pos) / tau)[1]
        return classes, prob.cpu().numpy(), s_pos.cpu().numpy(), s_neg.cpu().numpy()

    def zero_shot(self, image: Any, prompts: PromptSet | None = None) -> dict[str, float]:
        """{class: P(positive)} for one image (path, array or :class:`EncodedImage`)."""
        return {d["class"]: d["probability"] for d in self.zero_shot_details(image, prompts)}

    def zero_shot_details(self, image: Any, prompts: PromptSet | None = None) -> list[dict[str, Any]]:
        """Per class: probability, the two scores and the prompts used."""
        prompts = CHEX5_PROMPTS if prompts is None else prompts
        classes, prob, s_pos, s_neg = self.zero_shot_scores(self.encode(image).features, prompts)
        return [{"class": c, "probability": float(prob[0, j]), "score_positive": float(s_pos[0, j]),
                 "score_negative": float(s_neg[0, j]), "positive_prompts": list(prompts[c]["positive"]),
                 "negative_prompts": list(prompts[c]["negative"])} for j, c in enumerate(classes)]

    # -- grounding --------------------------------------------------------------------------------
    @torch.inference_mode()
    def ground_grid(self, image: Any, phrase: str, sigma: float = 1.5) -> np.ndarray:
        """h x w region-phrase cosines over the crop (Gaussian-smoothed with ``sigma`` cells; 0 = raw)."""
        if not isinstance(phrase, str) or not phrase.strip():
            raise MedclrError("phrase: expected a non-empty sentence to ground")
        enc = self.encode(image)
        text = self._text([phrase], True).to(self.device)
        grid = self.model.region_scores(enc.features, text)[0, 0].float().cpu().numpy()
        if sigma and sigma > 0:
            from scipy.ndimage import gaussian_filter

            grid = gaussian_filter(grid, sigma=sigma, mode="reflect", truncate=4.0)
        return grid

    def ground(self, image: Any, phrase: str, sigma: float = 1.5, interpolation: str = "bilinear") -> np.ndarray:
        """H x W float32 similarity map at the original resolution, NaN outside the model's crop."""
        enc = self.encode(image)
        return enc.geometry.to_original(self.ground_grid(enc, phrase, sigma), interpolation)

    # -- sentence statistics ----------------------------------------------------------------------
    @property
    def stats(self) -> "SentenceStats":
        if self._stats is None:
            self._stats = SentenceStats.from_checkpoint(self.checkpoint_dir, self.info)
        return self._stats


class SentenceStats:
    """eta_LM per sentence (eta table) and NUCLR zeta per manifest index (loss_state.safetensors)."""

    def __init__(self, eta: Mapping[str, float] | None = None, zeta: Mapping[str, np.ndarray] | None = None,
                 eta_source: str | None = None) -> None:
        self._eta, self._zeta, self.eta_source = dict(eta or {}), dict(zeta or {}), eta_source

    @property
    def has_eta(self) -> bool:
        return bool(self._eta)

    @property
    def has_zeta(self) -> bool:
        return bool(self._zeta)

    def eta(self, sentence: str) -> float | None:
        from medclr.data.text import sentence_hash

        value = self._eta.get(sentence_hash(sentence))
        return None if value is None else float(value)

    def zeta(self, index: int) -> dict[str, float] | None:
        """{"txt": zeta of the report as a candidate of image anchors, "img": ...} for a manifest index."""
        out = {m: float(t[index]) for m, t in self._zeta.items() if 0 <= int(index) < len(t)}
        return out or None

    @classmethod
    def from_checkpoint(cls, directory: Path | None, info: Mapping[str, Any]) -> "SentenceStats":
        eta: dict[str, float] = {}
        zeta: dict[str, np.ndarray] = {}
        path = info.get("eta_table")
        if path and Path(path).is_file():
            try:
                eta = _read_eta_table(Path(path))
            except Exception as exc:  # noqa: BLE001 - the inspector degrades, the app keeps running
                log.warning("eta table %s unreadable (%s); eta not shown", path, type(exc).__name__)
        if directory is not None and (Path(directory) / LOSS_STATE_NAME).is_file():
            from safetensors.numpy import load_file

            try:
                tables = load_file(str(Path(directory) / LOSS_STATE_NAME))
            except Exception as exc:  # noqa: BLE001
                log.warning("%s unreadable (%s); zeta not shown", LOSS_STATE_NAME, type(exc).__name__)
                tables = {}
            for key, value in tables.items():
                for m in ("txt", "img"):
                    if key == f"zeta_{m}" or key.endswith(f".zeta_{m}"):
                        zeta[m] = np.asarray(value, dtype=np.float32)
        return cls(eta, zeta, str(path) if eta else None)


def _read_eta_table(path: Path) -> dict[str, float]:
    import pandas as pd

    from medclr.data.text import sentence_hash

    df = pd.read_parquet(path)
    if "eta" not in df:
        raise MedclrError(f"{path}: eta table has no 'eta' column")
    keys = df["hash"].astype(str) if "hash" in df else df["sentence"].astype(str).map(sentence_hash)
    return dict(zip(keys, df["eta"].astype(float)))


def _loss_tau(directory: Path) -> float | None:
    path = directory / LOSS_STATE_NAME
    if not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():
                name = key.rsplit(".", 1)[-1]
                if name in ("tau", "log_tau", "logit_scale"):
                    v = float(fh.get_tensor(key).float().reshape(-1)[0])
                    return {"tau": v, "log_tau": math.exp(v), "logit_scale": math.exp(-v)}[name]
    except Exception:  # noqa: BLE001
        return None
    return None


def load_checkpoint(directory: str | os.PathLike, device: str | torch.device = "cpu", image_size: int | None = None,
                    resize: int | None = None, tau: float | None = None) -> Inference:
    """Load a `medclr train` checkpoint dir for inference. Arguments override what the dir records."""
    src = Path(directory).expanduser()
    if not src.is_dir():
        raise MedclrError(f"checkpoint {str(src)!r}: no such directory (expected a `medclr train` output dir)")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise MedclrError(f"device {device!r}: CUDA is not available on this machine; use --device cpu")
    model = DualEncoder.from_pretrained(src, map_location=device)
    if model.tokenizer is None:
        raise MedclrError(f"checkpoint {str(src)!r}: no tokenizer/ directory; texts cannot be encoded")
    info = read_checkpoint_info(src)
    size = int(image_size or info["image_size"] or DEFAULT_IMAGE_SIZE)
    rsz = resize or info["resize"]
    pre = Preprocess(size, int(rsz) if rsz and int(rsz) >= size else None)
    t = tau or info["tau"] or _loss_tau(src) or DEFAULT_TAU
    return Inference(model, pre, float(t), checkpoint_dir=src, info=info, device=device)


__all__ = ["CropGeometry", "EncodedImage", "ImageFiles", "Inference", "Preprocess", "SentenceStats",
           "collate_images", "image_loader", "load_checkpoint", "preprocess_image", "read_checkpoint_info",
           "weights_sha256", "write_preprocess"]
