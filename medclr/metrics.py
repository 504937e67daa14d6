"""The metrics training's validation and `medclr eval` share: retrieval ranks, R@K and MedR, and
zero-shot AUC/ACC with bootstrap CIs. Pure functions on arrays (numpy, scipy, scikit-learn).

Retrieval: ``scores[q, c]`` is the score of candidate ``c`` for query ``q``; the correct candidate of
query ``q`` is ``c = q``. Ranks are 1-based. Ties are counted PESSIMISTICALLY by default: a
candidate scoring exactly as high as the correct one is ranked above it, so a constant
(uninformative) score matrix gives every query the worst rank rather than rank 1. Pass
``ties="optimistic"`` for the other convention (only strictly higher candidates count).

Zero-shot: score = s(image, positive prompt) − s(image, negative prompt); AUC = ``roc_auc_score`` of
that score; the prediction is positive iff the positive side scores higher (a tie is negative),
ACC = ``accuracy_score`` of it. Labels are CheXpert-style (1, 0; −1 and NaN left out of that class);
macro = unweighted mean over the classes whose metric is defined; 95 % CIs by percentile bootstrap
over images (seeded, all classes resampled jointly).

Both protocols are written down in ``docs/evaluation.md`` (sections "Retrieval" and "Zero-shot");
``medclr.evaluation.retrieval`` and ``medclr.evaluation.zeroshot`` re-export these functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import accuracy_score, roc_auc_score

from medclr.data.labels import CHEX5

__all__ = ["DEFAULT_KS", "bidirectional_retrieval", "ranks", "retrieval_metrics", "zero_shot_metrics"]

# --------------------------------------------------------------------------- retrieval

DEFAULT_KS: tuple[int, ...] = (10, 50, 100)

# Rows compared per block: block × n_candidates booleans stay around 64 MB for 10^4 candidates.
_BLOCK_ELEMENTS = 1 << 26


def ranks(scores: np.ndarray, *, ties: str = "pessimistic") -> np.ndarray:
    """1-based rank of the correct candidate (``c = q``) for every query ``q``.

    ``rank = 1 + #{c : s[q, c] > s[q, q]}`` plus, with ``ties="pessimistic"``, the number of
    OTHER candidates with ``s[q, c] == s[q, q]``. Needs at least as many candidates as queries
    (extra columns are distractors). NaN/inf scores are rejected. Exact comparisons, blocked
    over rows: O(Q·C) time and bounded memory, fine for 10^4 × 10^4.
    """
    if ties not in ("pessimistic", "optimistic"):
        raise ValueError(f"ties must be 'pessimistic' or 'optimistic', got {ties!r}")
    s = np.asarray(scores)
    if s.ndim != 2:
        raise ValueError(f"scores must be a 2-D (queries, candidates) matrix, got shape {s.shape}")
    n_q, n_c = s.shape
    if n_q == 0:
        raise ValueError("scores has no queries")
    if n_c < n_q:
        raise ValueError(f"need candidates >= queries (correct candidate of q is column q), got {s.shape}")
    if not np.issubdtype(s.dtype, np.number) or not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite numbers (no NaN/inf)")
    out = np.empty(n_q, dtype=np.int64)
    block = max(1, _BLOCK_ELEMENTS // max(n_c, 1))
    for start in range(0, n_q, block):
        stop = min(n_q, start + block)
        rows = s[start:stop]
        correct = rows[np.arange(stop - start), np.arange(start, stop)][:, None]
        if ties == "pessimistic":
            better = np.count_nonzero(rows >= correct, axis=1) - 1  # minus the correct one itself
        else:
            better = np.count_nonzero(rows > correct, axis=1)
        out[start:stop] = better + 1
    return out


def retrieval_metrics(
    scores: np.ndarray, ks: Sequence[int] = DEFAULT_KS, *, ties: str = "pessimistic"
) -> dict[str, float]:
    """``{"R@10", "R@50", "R@100", "MedR"}`` for ``scores[q, c]`` (correct candidate ``c = q``).

    ``R@K`` = fraction of queries whose correct candidate has rank ≤ K (1.0 whenever
    K ≥ number of candidates). ``MedR`` = ``np.median`` of the 1-based ranks (may end in .5
    for an even number of queries). See :func:`ranks` for the tie policy.
    """
    r = ranks(scores, ties=ties)
    out = {f"R@{int(k)}": float(np.mean(r <= int(k))) for k in ks}
    out["MedR"] = float(np.median(r))
    return out


def bidirectional_retrieval(
    scores: np.ndarray, ks: Sequence[int] = DEFAULT_KS, *, ties: str = "pessimistic"
) -> dict[str, float]:
    """Image→text and text→image retrieval from one square matrix ``scores[image, text]``.

    Image→text uses ``scores`` (rows are image queries), text→image uses ``scores.T``.
    Returns flat keys ``i2t/R@K``, ``i2t/MedR``, ``t2i/R@K``, ``t2i/MedR`` plus the paper's
    Table 1 summaries: ``Recall`` = mean of R@K over K and both directions, and ``MedR`` =
    mean of the two directions' MedR (Table 1's MedR matches the mean of Table 5's two
    columns: (151+146)/2 → 148, (123+107)/2 = 115, (106+102)/2 = 104).
    """
    s = np.asarray(scores)
    if s.ndim != 2 or s.shape[0] != s.shape[1]:
        raise ValueError(f"bidirectional retrieval needs a square (images, texts) matrix, got {s.shape}")
    i2t = retrieval_metrics(s, ks, ties=ties)
    t2i = retrieval_metrics(s.T, ks, ties=ties)
    out: dict[str, float] = {}
    for name, res in (("i2t", i2t), ("t2i", t2i)):
        out.update({f"{name}/{k}": v for k, v in res.items()})
    recalls = [res[f"R@{int(k)}"] for res in (i2t, t2i) for k in ks]
    out["Recall"] = float(np.mean(recalls))
    out["MedR"] = float((i2t["MedR"] + t2i["MedR"]) / 2.0)
    return out


# --------------------------------------------------------------------------- zero-shot


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
         "macro": {"AUC", "ACC", "AUC_CI", "ACC_CI", "AUC_classes", "AUC_left_out", "ACC_classes", "ACC_left_out"},
         "n_boot", "seed", "ci_level"}

    AUC is NaN for a class with one label value (then left out of the macro). The macro ACC is over the same
    classes as the macro AUC (``AUC_classes``, ``ACC_classes``): a class whose usable labels are all positive
    (or all negative) has a per-class ACC, the share of images predicted on that one side, but no place in a
    mean of accuracies over classes that can be told apart. ``n_boot=0``
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

    # both macros are over the classes whose AUC is defined (positives and negatives among the usable labels);
    # the others are named, so a four-class mean never passes for a five-class one
    in_macro = np.isfinite(aucs)
    kept = [c for c, ok in zip(names, in_macro) if ok]
    macro = {
        "AUC": _macro(aucs),
        "ACC": _macro(np.where(in_macro, accs, np.nan)),
        "AUC_CI": _ci(_macro_rows(boot_auc), ci_level),
        "ACC_CI": _ci(_macro_rows(np.where(in_macro, boot_acc, np.nan)), ci_level),
        "AUC_classes": kept,
        "AUC_left_out": [c for c, ok in zip(names, in_macro) if not ok],
        "ACC_classes": list(kept),
        "ACC_left_out": [c for c, ok in zip(names, in_macro) if not ok],
    }
    return {"per_class": per, "macro": macro, "n_boot": int(n_boot), "seed": int(seed), "ci_level": float(ci_level)}
