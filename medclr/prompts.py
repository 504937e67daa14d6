"""Default zero-shot prompts: the CheX5 prompt pairs of the sample-specific debiasing paper.

Table 2 of the paper ("Zero-shot image classification prompts"), verbatim, one prompt per side.
The paper's row names are lower case and say "effusion"; the keys here are the CheXpert column
names (``medclr.data.labels.CHEX5``), so "effusion" is "Pleural Effusion".

Shape (shared by ``medclr.inference`` and ``medclr.evaluation.zeroshot``)::

    {class: {"positive": [prompt, ...], "negative": [prompt, ...]}}

A side with several prompts is reduced BioViL-style: the mean of the *unnormalised* projected
text embeddings, then L2-normalised (:func:`reduce_prompts`); a zero-shot score is the checkpoint's
own image-sentence score with each reduced side (:func:`zero_shot_scores`). Those two functions are
the only copy: `medclr eval`, the app and training's validation AUC all call them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from medclr.data.labels import CHEX5
from medclr.errors import MedclrError

#: class -> {"positive": [...], "negative": [...]}
PromptSet = dict[str, dict[str, list[str]]]

#: Table 2 of the paper, verbatim (class order = ``CHEX5``).
CHEX5_PROMPTS: PromptSet = {
    "Cardiomegaly": {"negative": ["Heart size normal"], "positive": ["Cardiomegaly"]},
    "Edema": {"negative": ["No pulmonary edema"], "positive": ["Pulmonary edema"]},
    "Pleural Effusion": {"negative": ["No pleural effusions"], "positive": ["Pleural effusions"]},
    "Pneumonia": {"negative": ["No signs of pneumonia"], "positive": ["Findings suggesting pneumonia"]},
    "Pneumothorax": {"negative": ["No pneumothorax"], "positive": ["Pneumothorax"]},
}

#: Prompt ensembles phrased the way reports state and deny each finding (several per side, reduced
#: BioViL-style). Not the paper's; reported beside it (docs/evaluation.md), never instead of it.
CHEX5_REPORT_PROMPTS: PromptSet = {
    "Cardiomegaly": {
        "positive": ["Cardiomegaly", "Mild cardiomegaly", "The heart size is moderately enlarged",
                     "The cardiac silhouette is enlarged"],
        "negative": ["Heart size normal", "The heart is normal in size", "Heart size is normal", "No cardiomegaly"],
    },
    "Edema": {
        "positive": ["Pulmonary edema", "Mild interstitial edema", "Vascular congestion and pulmonary edema",
                     "Interstitial pulmonary edema"],
        "negative": ["No pulmonary edema", "No evidence of pulmonary edema", "No edema",
                     "There is no pulmonary edema"],
    },
    "Pleural Effusion": {
        "positive": ["Pleural effusions", "Small right pleural effusion", "Small left pleural effusion",
                     "Bilateral pleural effusions"],
        "negative": ["No pleural effusions", "No pleural effusion", "There is no pleural effusion", "No effusions"],
    },
    "Pneumonia": {
        "positive": ["Findings suggesting pneumonia", "Right lower lobe pneumonia", "Left lower lobe consolidation",
                     "Focal airspace consolidation"],
        "negative": ["No signs of pneumonia", "No pneumonia", "No focal consolidation",
                     "No focal airspace consolidation"],
    },
    "Pneumothorax": {
        "positive": ["Pneumothorax", "Small right pneumothorax", "Small left apical pneumothorax",
                     "Moderate right-sided pneumothorax"],
        "negative": ["No pneumothorax", "There is no pneumothorax", "No evidence of pneumothorax",
                     "No pneumothorax is seen"],
    },
}

#: prompt sets by name (``medclr eval --prompts report``)
BUILTIN_PROMPTS: dict[str, PromptSet] = {"paper": CHEX5_PROMPTS, "report": CHEX5_REPORT_PROMPTS}


def checkpoint_prompts(findings_record: Mapping[str, Any] | None) -> tuple[str, PromptSet]:
    """(name, set) of the built-in prompt set a checkpoint's zero-shot is calibrated with: the one its per-finding
    record (``medclr.findings``) was fitted with, the paper's when it has no record. Every reader of a checkpoint
    (the app, `medclr score`, `medclr eval`'s default, the stored embeddings) takes its prompts from here, so the
    probabilities shown are those the record calibrated."""
    name = str((findings_record or {}).get("prompts") or "paper")
    if name not in BUILTIN_PROMPTS:
        raise MedclrError(f"the checkpoint's findings record names prompt set {name!r}, which this medclr does not have "
                          f"(built in: {', '.join(BUILTIN_PROMPTS)}); upgrade medclr")
    return name, BUILTIN_PROMPTS[name]

assert tuple(CHEX5_PROMPTS) == CHEX5 == tuple(CHEX5_REPORT_PROMPTS)


def copy_prompts(prompts: PromptSet | None = None) -> PromptSet:
    """A deep copy (callers may edit it without touching the defaults)."""
    src = CHEX5_PROMPTS if prompts is None else prompts
    return {c: {side: list(v) for side, v in sides.items()} for c, sides in src.items()}


# --------------------------------------------------------------------------- reduction and scores
# The one prompt reduction and zero-shot score of the project: `medclr eval` and the app (through
# medclr.inference.Inference), training's validation AUC (training.hooks) and evaluation.zeroshot's
# class_text_embedding all use these. torch is imported inside, so the tables above stay light.


def reduce_prompts(projections):
    """One unit (D,) embedding for a side's prompts: the mean of their UNNORMALISED projected text
    embeddings (k, D), then L2-normalised (BioViL's convention). A (D,) input is one prompt."""
    import torch

    p = torch.as_tensor(projections)
    p = p[None] if p.ndim == 1 else p
    if p.ndim != 2 or p.shape[0] == 0:
        raise ValueError(f"prompt embeddings must be (k, D) with k >= 1, got shape {tuple(p.shape)}")
    return torch.nn.functional.normalize(p.mean(0), dim=-1)


def prompt_embeddings(encode: Callable[[list[str]], Any], prompts: PromptSet) -> dict[str, tuple[Any, Any]]:
    """class -> (positive, negative) (D,) tensors reduced with :func:`reduce_prompts`. ``encode(prompts)``
    returns their unnormalised projections (k, D), e.g. ``text_encoder.encode(prompts, normalize=False)``."""
    return {cls: (reduce_prompts(encode(list(sides["positive"]))), reduce_prompts(encode(list(sides["negative"]))))
            for cls, sides in prompts.items()}


def zero_shot_scores(similarity: Callable[[Any, Any], Any], image, embeddings: Mapping[str, tuple[Any, Any]]):
    """``(classes, s_pos, s_neg)``, each score N x C float32: ``similarity(image, text)`` (the checkpoint's
    image-sentence score, ``DualEncoder.similarity``: its head, what the loss was trained on) of every
    image with each class's reduced positive and negative prompts (:func:`prompt_embeddings`)."""
    import torch

    classes = list(embeddings)
    text = torch.stack([e for c in classes for e in embeddings[c]])  # pos0, neg0, pos1, neg1, ...
    sim = similarity(image, text).float().reshape(-1, len(classes), 2)
    return classes, sim[..., 0], sim[..., 1]


__all__ = ["BUILTIN_PROMPTS", "CHEX5", "CHEX5_PROMPTS", "CHEX5_REPORT_PROMPTS", "PromptFileError", "PromptSet",
           "checkpoint_prompts", "copy_prompts", "load_prompts", "prompt_embeddings", "reduce_prompts", "validate_prompts",
           "zero_shot_scores"]


class PromptFileError(MedclrError, ValueError):
    """A prompt file is missing, unreadable or not in the expected shape."""


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
    yaml_file = p.suffix.lower() in (".yaml", ".yml")
    try:
        if yaml_file:
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # yaml.YAMLError / json.JSONDecodeError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if yaml_file or p.suffix.lower() == ".json":
            raise PromptFileError(f"{p}: not valid {'YAML' if yaml_file else 'JSON'}: {first}") from None
        # another suffix (.txt, none): say which formats a prompt file takes, not only that JSON failed
        raise PromptFileError(f"{p}: expected a prompt file in YAML (.yaml, .yml) or JSON (.json), a mapping of "
                              f"class -> {{positive: [...], negative: [...]}}; a {p.suffix or 'file without a suffix'} "
                              f"is read as JSON, and this one is not ({first})") from None
    return validate_prompts(data, str(p))
