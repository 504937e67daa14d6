"""Zero-shot prompt diagnostics (``docs/evaluation.md`` §7.2): why a class's AUC is what it is.

Per class, from the same reduced prompt embeddings the zero-shot scores use (mean of the
unnormalised prompt embeddings of a side, then L2-normalised):

* **prompt cosine** = cos(positive, negative). Near 1, the text tower barely tells the two prompts
  apart, and the zero-shot score is a difference of two almost equal numbers.
* **sign check** = cos(p − n, μ₁ − μ₀): the zero-shot direction (reduced positive minus reduced
  negative prompt embedding) against the image-side direction (mean L2-normalised global image
  embedding of the evaluated images labelled 1, minus that of the images labelled 0; −1/NaN left
  out). "agrees" when it is > 0, "FLIPPED" when < 0. For a cosine head the zero-shot score
  difference of an image x̂ is x̂·(p − n), so the sign check has the sign of
  mean(score | label 1) − mean(score | label 0): a FLIPPED class is one whose prompts point
  against the way its positive images differ (an AUC below 0.5 usually shows up here first).
  For LSE+NL the score is the head's, so the check is about the global embedding geometry only.

A cosine with a zero vector (identical prompt sets, or a class without a 1 or a 0) is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["markdown_lines", "prompt_diagnostics", "sign_word", "zeroshot_diagnostics"]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if not (na > 1e-12 and nb > 1e-12) or not (math.isfinite(na) and math.isfinite(nb)):
        return math.nan
    return float(np.clip(a @ b / (na * nb), -1.0, 1.0))


def prompt_diagnostics(prompt_emb: Mapping[str, tuple[np.ndarray, np.ndarray]], image_emb: np.ndarray,
                       labels: np.ndarray, classes: Sequence[str]) -> dict[str, dict[str, float]]:
    """``{"prompt_cosine": {class: cos(p, n)}, "sign_check": {class: cos(p − n, μ₁ − μ₀)}}``.

    ``prompt_emb[class] = (p, n)``: the reduced (D,) positive and negative prompt embeddings;
    ``image_emb`` (N, D) global image embeddings (L2-normalised here); ``labels`` (N, C) CheXpert
    coding, column j for ``classes[j]`` (only 1 and 0 are used)."""
    x = np.asarray(image_emb, np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    y = np.asarray(labels, np.float64).reshape(len(x), len(classes))
    cosine, sign = {}, {}
    for j, c in enumerate(classes):
        p, n = (np.asarray(e, np.float64).ravel() for e in prompt_emb[c])
        cosine[c] = _cos(p, n)
        pos, neg = y[:, j] == 1, y[:, j] == 0
        if pos.any() and neg.any():
            sign[c] = _cos(p - n, x[pos].mean(0) - x[neg].mean(0))
        else:
            sign[c] = math.nan
    return {"prompt_cosine": cosine, "sign_check": sign}


def zeroshot_diagnostics(model, enc, data, test_rows: np.ndarray, prompts) -> dict[str, dict[str, float]]:
    """:func:`prompt_diagnostics` for the runner: the checkpoint's reduced prompt embeddings
    (``Model.prompt_embeddings``, the ones its zero-shot scores use) and the encoded test images."""
    from medclr.evaluation.data import labels

    classes = list(prompts)
    p = enc.take(test_rows)
    return prompt_diagnostics(model.prompt_embeddings(prompts), enc.glob[p], labels(data, enc.rows[p], classes), classes)


def sign_word(value: Any) -> str:
    """"agrees" (> 0), "FLIPPED" (< 0), "–" (0 or undefined)."""
    if value is None or isinstance(value, str) or not math.isfinite(float(value)) or value == 0:
        return "–"
    return "agrees" if value > 0 else "**FLIPPED**"


EXPLAIN = ("Prompt cosine: cos(positive, negative) of the class's reduced prompt embeddings (near 1: the text "
           "tower hardly separates them; shown to 4 decimals). Sign check: cos(zero-shot direction, image direction), where the "
           "zero-shot direction is the reduced positive minus the reduced negative prompt embedding and the image "
           "direction is the mean global embedding of the images labelled 1 minus that of the images labelled 0. "
           "FLIPPED (< 0): the prompts point against the way the positive images differ; for a cosine head its sign "
           "is that of mean score(positives) − mean score(negatives).")


def markdown_lines(z: dict) -> list[str]:
    """The single-run report's prompt-check table (nothing when the metrics lack it)."""
    from medclr.evaluation.markdown import fmt, table

    if not z or "prompt_cosine" not in z:
        return []
    rows = [[c, fmt(z["prompt_cosine"].get(c), 4), fmt(z["sign_check"].get(c)), sign_word(z["sign_check"].get(c))]
            for c in z["classes"]]
    return ["### Prompt check", "", EXPLAIN, "",
            *table(["class", "cos(positive, negative prompts)", "sign check: cos(zero-shot dir, image dir)", "sign"],
                   rows), ""]
