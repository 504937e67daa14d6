"""Which findings a checkpoint reads: per-finding validation AUC, direction and a calibrated probability.

At the end of training, the zero-shot margin of every validation image (``s_pos - s_neg``: the model's
score of the positive prompts minus the negative prompts, ``medclr.prompts``) is compared with the
validation labels, finding by finding (:func:`fit_findings`):

* ``auc`` with a percentile-bootstrap 95 % CI (``medclr.metrics.zero_shot_metrics``), ``n`` and ``n_pos``;
* ``direction``: ``positive`` when the margin ranks positives above negatives (AUC ≥ 0.5), else ``flipped``;
* ``platt``: Platt scaling, P(finding | margin) = sigmoid(a · margin + b), by maximum likelihood
  (scikit-learn's unpenalised logistic regression): the calibrated probability the app and the scorer show
  instead of ``sigmoid(margin / tau)``, whose scale is the loss's temperature, not a frequency;
* ``threshold``: the operating point, the margin that maximises Youden's J (sensitivity + specificity − 1)
  on validation: where the model says "there is". The app paints a finding's heatmap only above it
  (:func:`finding_named`, ``Inference.phrase_evidence``);
* ``reads``: AUC ≥ ``min_auc`` and the CI's lower end above chance; otherwise ``reason`` says why in one
  plain sentence, and readers show no probability for that finding (:func:`probability`).

The record says where the validation labels came from (``labels``): ``manifest``, the manifest's own CheX5
columns, or ``rules``, read from each validation report by medclr's rule labeller when the validation rows have
none (``medclr.data.labeller.labels_or_rules``, as `medclr eval` labels a corpus without): the AUCs then measure
agreement with the reports' words, not with a radiologist's reading of the image.

The record is stored in ``checkpoint_meta.json`` (``findings``; medclr.inference.metadata). A checkpoint
without it (older, or trained without a labelled validation split) is "not validated" (:data:`NOT_VALIDATED`).
The probabilities are calibrated at the validation set's prevalence (the phantom's balanced validation
studies: about one positive in five per finding), which the record states as ``prevalence``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

MIN_AUC = 0.7  # below this validation AUC a finding is shown without a probability
NOT_VALIDATED = ("this model was not validated per finding (its checkpoint records no validation AUC): "
                 "treat these scores as uncalibrated")


def platt_fit(margin: np.ndarray, label: np.ndarray) -> tuple[float, float]:
    """(a, b) maximising the likelihood of ``label`` under sigmoid(a · margin + b) (no penalty)."""
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(margin, dtype=np.float64).reshape(-1, 1)
    y = np.asarray(label, dtype=np.float64).astype(int)
    fit = LogisticRegression(C=np.inf, tol=1e-10, max_iter=1000).fit(x, y)  # C = inf: no penalty
    return float(fit.coef_[0, 0]), float(fit.intercept_[0])


def sigmoid(z: np.ndarray | float) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=np.float64)))  # overflow-free logistic


def fit_findings(margins: np.ndarray, labels: np.ndarray, classes: Sequence[str], *, min_auc: float = MIN_AUC,
                 n_boot: int = 1000, seed: int = 0, split: str | None = None,
                 label_source: str = "manifest", prompts: str = "paper") -> dict[str, Any]:
    """The per-finding record of a checkpoint (module docstring) from validation margins (N x C) and
    labels (N x C: 1 / 0; −1 and NaN are left out per finding); ``label_source``: where the labels came from,
    ``manifest`` or ``rules`` (recorded as ``labels``); ``prompts``: the built-in prompt set (``medclr.prompts``) the
    margins were scored with, which every reader of the checkpoint then uses (``checkpoint_prompts``)."""
    from medclr.metrics import zero_shot_metrics

    m = np.asarray(margins, dtype=np.float64)
    lab = np.asarray(labels, dtype=np.float64)
    stats = zero_shot_metrics(m, np.zeros_like(m), lab, classes=classes, n_boot=n_boot, seed=seed)["per_class"]
    per: dict[str, Any] = {}
    for j, name in enumerate(classes):
        keep = np.isin(lab[:, j], (0.0, 1.0))
        y, x = lab[keep, j], m[keep, j]
        s = stats[name]
        auc, (lo, hi) = s["AUC"], s["AUC_CI"]
        entry: dict[str, Any] = {"n": int(keep.sum()), "n_pos": int(y.sum()), "auc": _num(auc),
                                 "auc_ci": [_num(lo), _num(hi)], "prevalence": _num(y.mean()) if len(y) else None}
        if not (math.isfinite(auc) and 0 < y.sum() < len(y)):
            entry.update(direction=None, platt=None, reads=False,
                         reason=f"this model was not validated on {name.lower()}: the validation split has "
                                f"{int(y.sum())} positive and {int(len(y) - y.sum())} negative images")
        else:
            a, b = platt_fit(x, y)
            entry.update(direction="positive" if auc >= 0.5 else "flipped", platt={"a": a, "b": b},
                         threshold=youden_threshold(x, y))
            entry.update(reads=bool(auc >= min_auc and math.isfinite(lo) and lo > 0.5), reason=None)
            if not entry["reads"]:
                entry["reason"] = _reason(name, auc, lo, hi, min_auc)
        per[name] = entry
    return {"min_auc": float(min_auc), "split": split, "labels": label_source, "prompts": prompts,
            "n_boot": int(n_boot), "classes": per}


def youden_threshold(margin: np.ndarray, label: np.ndarray) -> float:
    """The margin t maximising TPR − FPR of "margin ≥ t" (Youden's J; scikit-learn's ROC thresholds)."""
    from sklearn.metrics import roc_curve

    fpr, tpr, thresholds = roc_curve(np.asarray(label).astype(int), np.asarray(margin, dtype=np.float64))
    finite = np.isfinite(thresholds)
    j = np.where(finite, tpr - fpr, -np.inf)
    return float(thresholds[int(np.argmax(j))])


def finding_named(phrase: str, classes: Sequence[str]) -> str | None:
    """The one class of ``classes`` (CheX5 names) that ``phrase`` states ("small left pleural effusion" ->
    "Pleural Effusion", "enlarged heart" -> "Cardiomegaly"), by medclr's report rules: the hard negatives'
    finding names (``medclr.data.hard_negatives``) and the rule labeller's further cues
    (``medclr.data.labeller.mention``: 1 = stated); None when it states none, several, or is negated or hedged.

    Both rule sets, because a phrase the labeller reads as a finding must be judged as that finding: "enlarged
    heart" judged apart from Cardiomegaly's validated probability could be "not seen" beside a 94 % for it."""
    from medclr.data.hard_negatives import stated_findings
    from medclr.data.labeller import CLASS_FINDING, mention

    lower = {c.lower(): c for c in classes}  # the rules' finding names are the CheX5 names in lower case
    named = {lower[f] for f in stated_findings([phrase]) if f in lower}
    named |= {c for c in classes if c in CLASS_FINDING and mention(phrase, c) == 1.0}
    return next(iter(named)) if len(named) == 1 else None


def _reason(name: str, auc: float, lo: float, hi: float, min_auc: float) -> str:
    what = f"this model does not reliably read {name.lower()}: validation AUC {auc:.2f}"
    if hi < 0.5:  # the whole CI below chance; an AUC of 0.47 with a CI across 0.5 is chance, not a reversal
        return what + " (it ranks these images opposite to the finding)"
    if auc < min_auc:
        return what + f" (below {min_auc:.2f})"
    return what + f" (its 95 % CI reaches {lo:.2f}, not above chance)"


def _num(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def probability(record: Mapping[str, Any] | None, name: str, margin: np.ndarray | float
                ) -> tuple[np.ndarray, str | None]:
    """(calibrated probability, None) for a finding the checkpoint reads; (NaN, reason) for one it does not.
    Without a record (``record`` None): (NaN, :data:`NOT_VALIDATED`); callers that still want a score
    show the raw one with that notice."""
    why = unread_reason(record, name)
    if why is not None:
        return np.full(np.shape(margin), np.nan), why
    p = record["classes"][name]["platt"]
    return sigmoid(p["a"] * np.asarray(margin, dtype=np.float64) + p["b"]), None


def unread_reason(record: Mapping[str, Any] | None, name: str) -> str | None:
    """None when the record says the checkpoint reads finding ``name``, else the one sentence readers show."""
    if record is None:
        return NOT_VALIDATED
    entry = (record.get("classes") or {}).get(name)
    if entry is None:
        return f"this model was not validated on {name.lower()}"
    if not entry.get("reads"):
        return entry.get("reason") or f"this model does not reliably read {name.lower()}"
    return None


def operating_probability(record: Mapping[str, Any] | None, name: str) -> float | None:
    """The operating point (``threshold``, a margin) of a finding the checkpoint reads, as the calibrated probability
    readers show beside it; None for a finding it does not read."""
    if unread_reason(record, name) is not None or record["classes"][name].get("threshold") is None:
        return None
    return float(probability(record, name, record["classes"][name]["threshold"])[0])


def expected_calibration_error(prob: np.ndarray, label: np.ndarray, bins: int = 10) -> float:
    """ECE: the mean over equal-width probability bins of |mean label − mean probability|, weighted by
    the bin's share of the images (Guo et al., 2017). NaN probabilities and labels other than 0/1 are left out."""
    p = np.asarray(prob, dtype=np.float64)
    y = np.asarray(label, dtype=np.float64)
    keep = np.isfinite(p) & np.isin(y, (0.0, 1.0))
    p, y = p[keep], y[keep]
    if not len(p):
        return float("nan")
    which = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += inside.mean() * abs(y[inside].mean() - p[inside].mean())
    return float(total)
