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
computes it too; it is re-exported here under its protocol name, as the prompt-file reader
(:func:`load_prompts`, ``medclr.prompts``: `medclr score --prompts` reads the same files).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from medclr.data.labels import CHEX5
from medclr.metrics import zero_shot_metrics  # shared with training's validation AUC
from medclr.prompts import CHEX5_PROMPTS, PromptFileError, PromptSet, load_prompts, reduce_prompts, validate_prompts

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
