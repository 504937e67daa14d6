"""The inference engine: a loaded checkpoint that embeds images and texts, scores zero-shot and grounds phrases.

Used by the app, the index builder, the batch scorer and evaluation, so that every consumer sees the
same preprocessing (:mod:`medclr.inference.preprocess`) and the same maths. Build one with
:func:`medclr.inference.load_checkpoint`.

* Zero-shot: for each class, the image-sentence score s (the checkpoint's similarity head, the score
  the loss was trained on) with the positive and the negative prompt set; the raw probability =
  softmax((s_neg, s_pos) / tau)[1]. Prompt sets with several prompts are reduced BioViL-style (mean of
  unnormalised projections, then L2-normalised). Reduction and scores are ``medclr.prompts``'s, which
  training's validation AUC uses too. Default prompts: the checkpoint's own
  (``medclr.prompts.checkpoint_prompts``: those its per-finding record was fitted with). What readers
  show is :meth:`Inference.calibrated`: the checkpoint's per-finding calibration of s_pos - s_neg
  (``medclr.findings``, fitted on validation at the end of training), NaN with a reason for a finding the
  checkpoint does not read.
* Grounding: the head's region-sentence cosines (``DualEncoder.region_scores``), smoothed on the grid
  (Gaussian, sigma in cells; BioViL uses 1.5), upsampled into the crop, NaN-padded to the original size:
  ``medclr.inference.heatmap``, the one path evaluation's maps take too.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medclr.errors import MedclrError
from medclr.inference.checkpoint import DEFAULT_TAU, attach_text, weights_sha256
from medclr.inference.heatmap import SMOOTH_SIGMA, smooth_map, upsample_map
from medclr.inference.metadata import CheckpointMeta
from medclr.inference.preprocess import CropGeometry, Preprocess, image_loader, preprocess_image
from medclr.inference.stats import SentenceStats
from medclr.io import MAX_PIXELS, read_image
from medclr.models.dual import DualEncoder
from medclr.models.image import ImageFeatures, grid_size
from medclr.prompts import PromptSet, checkpoint_prompts, prompt_embeddings, zero_shot_scores

# What a reader is told for an image whose embedding is NaN or infinite: an error row, never a score.
NON_FINITE = "the model gave NaN or infinite values for this image (damaged weights, or an input it cannot read)"


@dataclass
class EncodedImage:
    """One image through the image encoder, kept to answer several questions with one forward."""

    features: ImageFeatures
    geometry: CropGeometry
    image: np.ndarray  # the original H x W float32 in [0, 1]


def _source(image) -> str | None:
    """The file an image came from, for a refusal to name (None for an array: the app hands the engine arrays)."""
    return None if isinstance(image, np.ndarray) else str(image)


def _prompt_key(prompts: PromptSet) -> str:
    return json.dumps(prompts, sort_keys=True)


class Inference:
    """A checkpoint ready for inference (eval mode, no grad). Build with :func:`load_checkpoint`."""

    def __init__(self, model: DualEncoder, pre: Preprocess = Preprocess(), tau: float = DEFAULT_TAU,
                 checkpoint_dir: str | os.PathLike | None = None, meta: CheckpointMeta | None = None,
                 device: str | torch.device = "cpu", weights_sha256: str | None = None,
                 stored_prompts: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """``stored_prompts``: the default prompts' embeddings the checkpoint stores for these weights
        (:mod:`medclr.inference.stored_prompts`); a ``model`` without its text tower loads it from
        ``checkpoint_dir`` when a text is first encoded."""
        if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
            raise MedclrError(f"tau: expected a positive number, got {tau!r}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.preprocess, self.tau = pre, float(tau)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.meta = meta  # what the checkpoint records (checkpoint_meta.json); None when not loaded from one
        self._prompt_cache: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}  # by the prompt set
        # the prompt set the checkpoint's record calibrated: the default of every zero-shot call
        self.prompts_name, self.default_prompts = checkpoint_prompts(meta.findings if meta is not None else None)
        if stored_prompts is not None:
            self._prompt_cache[_prompt_key(self.default_prompts)] = {
                cls: tuple(t.to(self.device) for t in pair) for cls, pair in stored_prompts.items()}
        self._sha = weights_sha256  # of checkpoint_dir's weights, when the loader already hashed them
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
        return preprocess_image(self.load(image), self.preprocess, source=_source(image))

    @torch.inference_mode()
    def image_features(self, batch: torch.Tensor) -> ImageFeatures:
        """B x 1 x C x C preprocessed tensor -> ImageFeatures (on this engine's device)."""
        return self.model.encode_image(batch.to(self.device, non_blocking=True))

    def encode(self, image: str | os.PathLike | np.ndarray | EncodedImage) -> EncodedImage:
        if isinstance(image, EncodedImage):
            return image
        arr = self.load(image)
        tensor, geo = preprocess_image(arr, self.preprocess, source=_source(image))
        return EncodedImage(self.image_features(tensor[None]), geo, arr)

    def image_batches(self, paths: Sequence[str | os.PathLike], batch_size: int = 16, num_workers: int = 0
                      ) -> torch.utils.data.DataLoader:
        """The files as this checkpoint's preprocessing sees them, decoded in ``num_workers`` DataLoader workers:
        ordered batches {"tensor", "ok", "i", "error"} (:func:`~medclr.inference.preprocess.image_loader`) for
        :meth:`image_features`. An unreadable file is a row with ``ok`` False and its error, not an exception (the
        index builder records it and goes on)."""
        return image_loader(paths, self.preprocess, batch_size, num_workers)

    def embed_images(self, images: Iterable[str | os.PathLike | np.ndarray], batch_size: int = 16,
                     num_workers: int = 0) -> np.ndarray:
        """N x D float32 unit global embeddings. Paths are decoded in ``num_workers`` DataLoader workers;
        an unreadable file raises its ``ImageReadError``."""
        items = list(images)
        out = np.zeros((len(items), self.joint_dim), dtype=np.float32)
        if items and all(not isinstance(x, np.ndarray) for x in items):
            for batch in self.image_batches(items, batch_size, num_workers):
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
        if self.model.text_encoder is None:
            self._attach_text()
        return self.model.text_encoder.encode(list(sentences), batch_size=batch_size, normalize=normalize).float()

    def embed_texts(self, sentences: Sequence[str] | str, batch_size: int = 64) -> np.ndarray:
        """N x D float32 unit sentence embeddings."""
        if isinstance(sentences, str):
            sentences = [sentences]
        return self._text(sentences, True, batch_size).cpu().numpy()

    def _attach_text(self) -> None:
        """Load the text tower this engine was built without (``load_checkpoint(..., text=False)``)."""
        if self.checkpoint_dir is None:
            raise MedclrError("this model has no text tower and was not loaded from a checkpoint directory")
        attach_text(self.model, self.checkpoint_dir)
        self.model.text_encoder.to(self.device).eval().requires_grad_(False)

    def prompt_embeddings(self, prompts: PromptSet | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """class -> (positive D, negative D): mean of unnormalised projections, then L2-normalised (the default
        prompts' come from the checkpoint when it stores them for these weights)."""
        prompts = self.default_prompts if prompts is None else prompts
        key = _prompt_key(prompts)
        if key not in self._prompt_cache:
            self._prompt_cache[key] = prompt_embeddings(lambda texts: self._text(texts, False), prompts)
        return dict(self._prompt_cache[key])

    # -- zero-shot --------------------------------------------------------------------------------
    @torch.inference_mode()
    def zero_shot_scores(self, features: ImageFeatures, prompts: PromptSet | None = None
                         ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """(classes, prob N x C, s_pos N x C, s_neg N x C) for a batch of image features."""
        classes, s_pos, s_neg = zero_shot_scores(self.model.similarity, features, self.prompt_embeddings(prompts))
        prob = torch.sigmoid((s_pos - s_neg) / self.tau)  # = softmax((s_neg, s_pos) / tau)[1]
        return classes, prob.cpu().numpy(), s_pos.cpu().numpy(), s_neg.cpu().numpy()

    @property
    def findings_record(self) -> dict | None:
        """Which findings this checkpoint reads (``medclr.findings``), or None: not validated."""
        return self.meta.findings if self.meta is not None else None

    def _calibration(self, prompts: PromptSet | None) -> tuple[dict | None, str | None]:
        """(the record that calibrates these prompts, None), or (None, why readers get the raw score)."""
        from medclr.findings import NOT_VALIDATED

        if self.findings_record is None:
            return None, NOT_VALIDATED
        if prompts is not None and _prompt_key(prompts) != _prompt_key(self.default_prompts):
            return None, f"calibrated for the checkpoint's {self.prompts_name} prompts only: raw score"
        return self.findings_record, None

    def finding_notes(self, classes: Sequence[str], prompts: PromptSet | None = None) -> dict[str, str | None]:
        """{class: None} for a finding whose calibrated probability readers show, else the one-sentence reason
        (not read, not validated, or prompts other than the default ones the record was fitted with)."""
        from medclr.findings import unread_reason

        record, why = self._calibration(prompts)
        return {c: why if record is None else unread_reason(record, c) for c in classes}

    def calibrated(self, classes: Sequence[str], raw: np.ndarray, s_pos: np.ndarray, s_neg: np.ndarray,
                   prompts: PromptSet | None = None) -> tuple[np.ndarray, dict[str, str | None]]:
        """(P(finding) N x C, :meth:`finding_notes`) as readers show them: the checkpoint's calibrated
        probability of a finding it reads, NaN for one it does not; the raw softmax where no record
        calibrates these prompts."""
        from medclr.findings import probability

        record, why = self._calibration(prompts)
        if record is None:
            return np.asarray(raw, dtype=np.float64), {c: why for c in classes}
        out, notes = np.empty(np.shape(raw), dtype=np.float64), {}
        for j, c in enumerate(classes):
            out[:, j], notes[c] = probability(record, c, s_pos[:, j] - s_neg[:, j])
        return out, notes

    def zero_shot(self, image: Any, prompts: PromptSet | None = None) -> dict[str, float]:
        """{class: P(positive)} for one image (path, array or :class:`EncodedImage`): calibrated, NaN for a
        finding the checkpoint does not read (:meth:`calibrated`)."""
        return {d["class"]: d["probability"] for d in self.zero_shot_details(image, prompts)}

    def zero_shot_details(self, image: Any, prompts: PromptSet | None = None) -> list[dict[str, Any]]:
        """Per class: the shown probability (:meth:`calibrated`) and its note, the raw softmax, whether the
        checkpoint reads the finding and its validation AUC, the two scores and the prompts used."""
        chosen = self.default_prompts if prompts is None else prompts
        classes, raw, s_pos, s_neg = self.zero_shot_scores(self.encode(image).features, chosen)
        prob, notes = self.calibrated(classes, raw, s_pos, s_neg, prompts)
        record = (self.findings_record or {}).get("classes") or {}
        return [{"class": c, "probability": float(prob[0, j]), "note": notes[c], "raw_probability": float(raw[0, j]),
                 "reads": record[c]["reads"] if c in record else None,
                 "validation_auc": record[c]["auc"] if c in record else None,
                 "score_positive": float(s_pos[0, j]), "score_negative": float(s_neg[0, j]),
                 "positive_prompts": list(chosen[c]["positive"]), "negative_prompts": list(chosen[c]["negative"])}
                for j, c in enumerate(classes)]

    # -- grounding --------------------------------------------------------------------------------
    @property
    def region_cells(self) -> int:
        """Region cells per image at this engine's crop: the grid the heads score, and an index stores per image."""
        size = int(self.preprocess.image_size)
        h, w = grid_size(size, size, self.model.image_encoder.output_stride)
        return h * w

    @torch.inference_mode()
    def region_grid(self, image: Any, phrase: str) -> np.ndarray:
        """h x w region-phrase cosines over the crop, as the head scores them (no smoothing), float32."""
        if not isinstance(phrase, str) or not phrase.strip():
            raise MedclrError("phrase: expected a non-empty sentence to ground")
        enc = self.encode(image)
        text = self._text([phrase], True).to(self.device)
        return self.model.region_scores(enc.features, text)[0, 0].float().cpu().numpy()

    def ground_grid(self, image: Any, phrase: str, sigma: float = SMOOTH_SIGMA) -> np.ndarray:
        """:meth:`region_grid` smoothed (``medclr.inference.heatmap.smooth_map``, ``sigma`` cells; 0 = raw)."""
        return smooth_map(self.region_grid(image, phrase), sigma)

    @torch.inference_mode()
    def phrase_evidence(self, image: Any, phrase: str) -> dict[str, Any]:
        """Whether the model says the phrase holds for this image, before anyone paints where.

        A phrase that states one CheX5 finding ("small left pleural effusion"; ``medclr.findings.finding_named``)
        is judged as the checkpoint's validation judged that finding: its zero-shot margin with the default
        prompts against the finding's operating point (``threshold``, Youden's J on validation), with the
        calibrated probability; a finding the checkpoint does not read gets ``present`` None and its reason.
        Any other phrase (and every phrase of a checkpoint without the record) is compared with its negation
        (``medclr.data.hard_negatives.negate``: "Pacemaker." -> "No pacemaker."), the two-prompt rule applied
        to one phrase, uncalibrated; ``present`` is None when the rules cannot negate it (mixed or hedged).
        Returns {"phrase", "how": "finding" | "negation" | None, "present", "finding", "probability",
        "operating_probability", "negation", "score", "score_negation", "reason"}."""
        from medclr.data.hard_negatives import negate
        from medclr.findings import finding_named, probability

        out: dict[str, Any] = dict.fromkeys(("how", "present", "finding", "probability", "operating_probability",
                                             "negation", "score", "score_negation", "reason"))
        out["phrase"] = phrase
        features = self.encode(image).features
        classes = list(self.default_prompts)
        name = finding_named(phrase, classes) if self.findings_record is not None else None
        if name is not None:
            entry = self.findings_record["classes"].get(name) or {}
            out.update(how="finding", finding=name)
            if not entry.get("reads") or entry.get("threshold") is None:
                out["reason"] = entry.get("reason") or f"this model was not validated on {name.lower()}"
                return out
            _, raw, s_pos, s_neg = self.zero_shot_scores(features)
            j = classes.index(name)
            margin = float(s_pos[0, j] - s_neg[0, j])
            out.update(present=margin >= entry["threshold"],
                       probability=float(probability(self.findings_record, name, margin)[0]),
                       operating_probability=float(probability(self.findings_record, name, entry["threshold"])[0]))
            return out
        negation = negate(phrase)
        out.update(how="negation" if negation is not None else None, negation=negation)
        if negation is None:
            return out
        scores = self.model.similarity(features, self._text([phrase, negation], True).to(self.device))
        s, s_neg = (float(v) for v in scores[0].float().cpu())
        out.update(score=s, score_negation=s_neg, present=s > s_neg)
        return out

    def heatmap(self, image: Any, phrase: str, sigma: float = SMOOTH_SIGMA, interpolation: str = "bilinear",
                size: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(H x W float32 similarity map, NaN outside the model's crop, at the original resolution or at ``size``
        (a display copy's (H, W)); the smoothed grid it was drawn from, for the flat-map rule), from one pass
        of the head. ``medclr.inference.heatmap.upsample_map``, the path evaluation's maps take."""
        enc = self.encode(image)
        grid = self.region_grid(enc, phrase)
        geometry = enc.geometry if size is None else enc.geometry.resized(*size)
        return upsample_map(grid, geometry, mode=interpolation, smooth_sigma=sigma), smooth_map(grid, sigma)

    def ground(self, image: Any, phrase: str, sigma: float = SMOOTH_SIGMA, interpolation: str = "bilinear",
               size: tuple[int, int] | None = None) -> np.ndarray:
        """The map of :meth:`heatmap`."""
        return self.heatmap(image, phrase, sigma, interpolation, size)[0]

    def overlay(self, image: Any, phrase: str, scale: str = "relative", sigma: float = SMOOTH_SIGMA
                ) -> tuple[np.ndarray, dict[str, Any]]:
        """(H x W x 3 uint8: the map of :meth:`ground` over the radiograph at its own resolution, in the app's colours
        and contours (``medclr.inference.overlay``); the colour range {"lo", "hi", "levels", "min", "max"}). It paints
        wherever the phrase matches best; whether the model says the phrase holds at all is :meth:`phrase_evidence`."""
        from medclr.inference.overlay import overlay

        enc = self.encode(image)
        return overlay(enc.image, self.heatmap(enc, phrase, sigma)[0], scale=scale)

    # -- retrieval --------------------------------------------------------------------------------
    def retrieve(self, index: Any, *, image: Any = None, text: str | None = None, k: int = 10
                 ) -> list[dict[str, Any]]:
        """The ``k`` indexed studies most like one query, best first: an ``image`` (path or array; ranked by the
        cosine of global embeddings) or a ``text`` (ranked by this checkpoint's head, as the app's report search).
        ``index``: a folder from `medclr index build` of this checkpoint, or a ``medclr.index.RetrievalIndex`` opened
        with this engine. Each hit: {"score", "image_path", "report", "manifest_index", ...}. The query's own study
        is returned too when the index holds it."""
        from medclr.index import RetrievalIndex, load_index

        if (image is None) == (text is None):
            raise MedclrError("retrieve: pass exactly one query, image=... or text=...")
        idx = index if isinstance(index, RetrievalIndex) else load_index(index, self)
        if text is not None:
            return idx.search_images_by_text(self.embed_texts([text]), k=k)[0]
        return idx.search_images(self.embed_images([image]), k=k)[0]

    # -- sentence statistics ----------------------------------------------------------------------
    @property
    def stats(self) -> SentenceStats:
        if self._stats is None:
            meta = self.meta
            self._stats = SentenceStats.from_checkpoint(self.checkpoint_dir, meta and meta.eta_table,
                                                        meta and meta.eta_override)
        return self._stats
