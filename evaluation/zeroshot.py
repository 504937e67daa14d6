"""CheX5 zero-shot classification: prompts, scores from embeddings, AUC/ACC with bootstrap CIs.

Protocol (``docs/evaluation.md``, section "Zero-shot"):

* one positive and one negative prompt set per class (the paper's Table 2 by default);
  a set of several prompts is reduced BioViL-style: mean of the unnormalised text
  embeddings, then L2-normalised (:func:`class_text_embedding` = ``medclr.prompts.reduce_prompts``);
* the runner's scores are the checkpoint's own head score with each reduced side
  (``medclr.prompts.zero_shot_scores``, as training's validation AUC); for a cosine head that is
  :func:`zero_shot_scores` here, the cosine of the global embeddings;
* score = cos(image, positive) − cos(image, negative); AUC = ``roc_auc_score`` of that score;
  the prediction is positive iff cos(image, positive) > cos(image, negative) (a tie is
  negative); ACC = ``accuracy_score`` of that prediction;
* labels are CheXpert-style: 1 positive, 0 negative; −1 (uncertain) and NaN (not mentioned)
  are left out of that class only;
* macro = unweighted mean over the classes whose metric is defined;
* 95 % CIs: percentile bootstrap over images (seeded ``numpy`` Generator, resampling all
  classes jointly so the macro CI sees their correlation); a class whose resample holds one
  label value only is skipped in that resample.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import accuracy_score, roc_auc_score

from medclr.data.labels import CHEX5
from medclr.errors import MedclrError
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
    "zero_shot_scores",
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


def zero_shot_scores(
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


# --------------------------------------------------------------------------- metrics


def _bootstrap_auc(score: np.ndarray, y: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Mann-Whitney AUC per bootstrap row (ties get half credit, as ``roc_auc_score``).

    ``score``/``y``/``valid`` are (B, N) resampled arrays; invalid entries are pushed to +inf so
    that they rank after every valid one and do not change the valid entries' ranks.
    NaN where a resample holds one label value only."""
    s = np.where(valid, score, np.inf)
    r = rankdata(s, method="average", axis=1)
    pos = valid & (y == 1)
    n_pos = pos.sum(axis=1).astype(np.float64)
    n_neg = (valid & (y == 0)).sum(axis=1).astype(np.float64)
    u = np.where(pos, r, 0.0).sum(axis=1) - n_pos * (n_pos + 1) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = u / (n_pos * n_neg)
    auc[(n_pos == 0) | (n_neg == 0)] = np.nan
    return auc


def _ci(samples: np.ndarray, level: float) -> tuple[float, float]:
    s = samples[np.isfinite(samples)]
    if s.size == 0:
        return (math.nan, math.nan)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(s, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


def zero_shot_metrics(
    pos_scores: np.ndarray,
    neg_scores: np.ndarray,
    labels: np.ndarray,
    classes: Sequence[str] = CHEX5,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    ci_level: float = 0.95,
) -> dict[str, object]:
    """Per-class and macro AUC/ACC of zero-shot scores, with percentile-bootstrap CIs.

    ``pos_scores``, ``neg_scores``, ``labels``: (N, C), columns in ``classes`` order (1-D
    arrays are treated as one class). Labels 1/0 are used; −1 and NaN are ignored for that
    class. Returns::

        {"per_class": {cls: {"AUC", "ACC", "AUC_CI", "ACC_CI", "n", "n_pos", "n_boot_AUC"}},
         "macro": {"AUC", "ACC", "AUC_CI", "ACC_CI"}, "n_boot", "seed", "ci_level"}

    AUC is NaN for a class with one label value (then left out of the macro). ``n_boot=0``
    skips the bootstrap (CIs are NaN). The bootstrap draws (n_boot, N) image indices once,
    shared by all classes; per-resample AUCs are computed vectorised from ranks (identical to
    ``roc_auc_score`` on the resample), and a class lacking positives or negatives in a
    resample is skipped there (``n_boot_AUC`` counts the resamples used).
    """
    pos = np.asarray(pos_scores, dtype=np.float64)
    neg = np.asarray(neg_scores, dtype=np.float64)
    lab = np.asarray(labels, dtype=np.float64)
    if pos.ndim == 1:
        pos, neg, lab = pos[:, None], neg[:, None], lab[:, None]
    if not (pos.shape == neg.shape == lab.shape) or pos.ndim != 2:
        raise ValueError(f"pos_scores {pos.shape}, neg_scores {neg.shape}, labels {lab.shape} must all be (N, C)")
    names = list(classes)
    if len(names) != pos.shape[1]:
        raise ValueError(f"{len(names)} class names for {pos.shape[1]} score columns")
    if not (np.all(np.isfinite(pos)) and np.all(np.isfinite(neg))):
        raise ValueError("scores must be finite (no NaN/inf)")
    bad = ~(np.isnan(lab) | np.isin(lab, (-1.0, 0.0, 1.0)))
    if bad.any():
        raise ValueError(f"labels must be 1, 0, -1 or NaN; found {np.unique(lab[bad])[:5].tolist()}")

    score = pos - neg
    pred = (pos > neg).astype(np.int64)
    valid = np.isin(lab, (0.0, 1.0))
    y = np.where(valid, lab, 0).astype(np.int64)
    n, n_cls = score.shape

    per: dict[str, dict[str, object]] = {}
    aucs, accs = np.full(n_cls, np.nan), np.full(n_cls, np.nan)
    for j, cls in enumerate(names):
        v = valid[:, j]
        yj = y[v, j]
        if v.any():
            accs[j] = accuracy_score(yj, pred[v, j])
        if v.any() and 0 < yj.sum() < yj.size:
            aucs[j] = roc_auc_score(yj, score[v, j])
        per[cls] = {"AUC": float(aucs[j]), "ACC": float(accs[j]), "n": int(v.sum()), "n_pos": int(yj.sum())}

    boot_auc = np.full((n_boot, n_cls), np.nan)
    boot_acc = np.full((n_boot, n_cls), np.nan)
    if n_boot > 0 and n > 0:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, n, size=(n_boot, n))
        # blocks of resamples keep (block, N) float arrays near 16 MB
        block = max(1, (1 << 21) // max(n, 1))
        correct = (pred == y) & valid
        for b0 in range(0, n_boot, block):
            ib = idx[b0 : b0 + block]
            for j in range(n_cls):
                vb, yb = valid[ib, j], y[ib, j]
                boot_auc[b0 : b0 + block, j] = _bootstrap_auc(score[ib, j], yb, vb)
                nv = vb.sum(axis=1)
                with np.errstate(invalid="ignore", divide="ignore"):
                    boot_acc[b0 : b0 + block, j] = np.where(nv > 0, correct[ib, j].sum(axis=1) / nv, np.nan)

    for j, cls in enumerate(names):
        per[cls]["AUC_CI"] = _ci(boot_auc[:, j], ci_level)
        per[cls]["ACC_CI"] = _ci(boot_acc[:, j], ci_level)
        per[cls]["n_boot_AUC"] = int(np.isfinite(boot_auc[:, j]).sum())

    def _macro(values: np.ndarray) -> float:
        v = values[np.isfinite(values)]
        return float(v.mean()) if v.size else math.nan

    def _macro_rows(samples: np.ndarray) -> np.ndarray:
        ok = np.isfinite(samples)
        cnt = ok.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cnt > 0, np.where(ok, samples, 0.0).sum(axis=1) / cnt, np.nan)

    macro = {
        "AUC": _macro(aucs),
        "ACC": _macro(accs),
        "AUC_CI": _ci(_macro_rows(boot_auc), ci_level),
        "ACC_CI": _ci(_macro_rows(boot_acc), ci_level),
    }
    return {"per_class": per, "macro": macro, "n_boot": int(n_boot), "seed": int(seed), "ci_level": float(ci_level)}
