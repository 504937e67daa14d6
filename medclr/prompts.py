"""Default zero-shot prompts: the CheX5 prompt pairs of the sample-specific debiasing paper.

Table 2 of the paper ("Zero-shot image classification prompts"), verbatim, one prompt per side.
The paper's row names are lower case and say "effusion"; the keys here are the CheXpert column
names (``medclr.data.labels.CHEX5``), so "effusion" is "Pleural Effusion".

Shape (shared by ``medclr.inference`` and ``evaluation.zeroshot``)::

    {class: {"positive": [prompt, ...], "negative": [prompt, ...]}}

A side with several prompts is reduced BioViL-style: the mean of the *unnormalised* projected
text embeddings, then L2-normalised (:func:`medclr.inference.Inference.prompt_embeddings`).
"""

from __future__ import annotations

from medclr.data.labels import CHEX5

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

assert tuple(CHEX5_PROMPTS) == CHEX5


def copy_prompts(prompts: PromptSet | None = None) -> PromptSet:
    """A deep copy (callers may edit it without touching the defaults)."""
    src = CHEX5_PROMPTS if prompts is None else prompts
    return {c: {side: list(v) for side, v in sides.items()} for c, sides in src.items()}


__all__ = ["CHEX5", "CHEX5_PROMPTS", "PromptSet", "copy_prompts"]
