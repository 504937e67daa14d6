"""CheX5 zero-shot classification: prompts, scores from embeddings, AUC/ACC with bootstrap CIs.

Protocol (``docs/evaluation.md``, section "Zero-shot"):

* one positive and one negative prompt set per class (the paper's Table 2 by default);
  a set of several prompts is reduced BioViL-style: mean of the unnormalised text
  embeddings, then L2-normalised (:func:`class_text_embedding` = ``medclr.prompts.reduce_prompts``);
* the runner's scores are the checkpoint's own head score with each reduced side
  (``medclr.prompts.zero_shot_scores``, as training's validation AUC); for a cosine head that is
  :func:`cosine_zero_shot_scores` here, the cosine of the global embeddings;
* score = cos(image, positive) − cos(image, negative); AUC = ``roc_auc_score`` of that score;
  the prediction is positive iff cos(image, positive) > cos(image, negative) (a tie is
  negative); ACC = ``accuracy_score`` of that prediction;
* labels are CheXpert-style: 1 positive, 0 negative; −1 (uncertain) and NaN (not mentioned)
  are left out of that class only;
* macro = unweighted mean over the classes whose metric is defined;
* 95 % CIs: percentile bootstrap over images (seeded ``numpy`` Generator, resampling all
  classes jointly so the macro CI sees their correlation); a class whose resample holds one
  label value only is skipped in that resample.

:func:`zero_shot_metrics` lives in the core (``medclr.metrics``), because training's validation AUC
computes it too; it is re-exported here under its protocol name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from medclr.data.labels import CHEX5
from medclr.errors import MedclrError
from medclr.metrics import zero_shot_metrics  # shared with training's validation AUC
from medclr.prompts import CHEX5_PROMPTS, PromptSet, reduce_prompts

__all__ = [
    "CHEX5",
    "PAPER_PROMPTS",
    "PromptFileError",
    "PromptSet",
    "class_text_embedding",
    "load_prompts",
    "validate_prompts",
    "zero_shot_metrics",
    "cosine_zero_shot_scores",
]

#: class -> {"positive": [...], "negative": [...]}; PAPER_PROMPTS is Table 2 of the sample-specific
#: debiasing paper, verbatim (one prompt per side; the paper's row "effusion" is CheXpert's
#: "Pleural Effusion"). One table for the whole project: it lives in ``medclr.prompts`` (the model
#: side, which must not import ``evaluation``) and is re-exported here under its protocol name.
PAPER_PROMPTS: PromptSet = CHEX5_PROMPTS


class PromptFileError(MedclrError, ValueError):
    """A prompt file is missing, unreadable or not in the expected shape."""


# --------------------------------------------------------------------------- prompts


def _as_list(value: object, where: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(p, str) and p.strip() for p in items):
        raise PromptFileError(f"{where}: expected a non-empty string or list of non-empty strings")
    return [p.strip() for p in items]


def validate_prompts(data: object, source: str = "prompts") -> PromptSet:
    """Check and normalise ``{class: {"positive": str | [str], "negative": str | [str]}}``."""
    if not isinstance(data, Mapping) or not data:
        raise PromptFileError(f"{source}: expected a mapping of class name -> {{positive, negative}}")
    out: PromptSet = {}
    for cls, sides in data.items():
        if not isinstance(sides, Mapping):
            raise PromptFileError(f"{source}: class {cls!r}: expected keys 'positive' and 'negative'")
        extra = set(sides) - {"positive", "negative"}
        if extra or not {"positive", "negative"} <= set(sides):
            raise PromptFileError(
                f"{source}: class {cls!r}: expected exactly keys 'positive' and 'negative', got {sorted(sides)}"
            )
        out[str(cls)] = {
            side: _as_list(sides[side], f"{source}: class {cls!r}, {side}") for side in ("positive", "negative")
        }
    return out


def load_prompts(path: str | Path) -> PromptSet:
    """Read a prompt set from YAML (``.yaml``/``.yml``) or JSON (anything else)::

        Cardiomegaly:
          positive: [Cardiomegaly, The heart is enlarged]
          negative: Heart size normal

    Each side takes one string or a list; a class may be any label name (not only CheX5).
    Raises :class:`PromptFileError` (one line naming the file and field) on bad input.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PromptFileError(f"{p}: cannot read prompt file ({exc.strerror or exc})") from None
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # yaml.YAMLError / json.JSONDecodeError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PromptFileError(f"{p}: not valid {'YAML' if p.suffix.lower() in ('.yaml', '.yml') else 'JSON'}: {first}") from None
    return validate_prompts(data, str(p))


# --------------------------------------------------------------------------- scores


def _l2n(x: np.ndarray, axis: int = -1) -> np.ndarray:
    norm = np.linalg.norm(x, axis=axis, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def class_text_embedding(prompt_embeddings: np.ndarray) -> np.ndarray:
    """One embedding for a prompt set: mean of the UNNORMALISED prompt embeddings (k, D), then
    L2-normalised (BioViL's ``get_similarity_score_from_raw_data`` convention). This is
    :func:`medclr.prompts.reduce_prompts`, the reduction `medclr eval` and validation use, in float64."""
    import torch

    return reduce_prompts(torch.from_numpy(np.asarray(prompt_embeddings, dtype=np.float64))).numpy()


def cosine_zero_shot_scores(
    image_embeddings: np.ndarray,
    prompt_embeddings: Mapping[str, tuple[np.ndarray, np.ndarray]],
    classes: Sequence[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine of every image with each class's positive and negative prompt set.

    ``prompt_embeddings[cls] = (positive (k, D), negative (m, D))``, raw text-encoder outputs.
    Image embeddings (N, D) are L2-normalised here. Returns ``(pos, neg)``, each (N, C) float64,
    columns in ``classes`` order (default: the mapping's order).
    """
    img = _l2n(np.asarray(image_embeddings, dtype=np.float64))
    if img.ndim != 2:
        raise ValueError(f"image embeddings must be (N, D), got shape {img.shape}")
    names = list(prompt_embeddings) if classes is None else list(classes)
    pos = np.stack([img @ class_text_embedding(prompt_embeddings[c][0]) for c in names], axis=1)
    neg = np.stack([img @ class_text_embedding(prompt_embeddings[c][1]) for c in names], axis=1)
    return pos, neg
