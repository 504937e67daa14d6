"""Linear probe on frozen features (1 % / 10 % / 100 % of the training labels) and t-SNE plots.

Labels come in two forms:

* 1-D integer class ids (e.g. the phantom's ``latent_class``): one multinomial
  ``LogisticRegression``; reported per-class one-vs-rest AUC, macro AUC and accuracy;
* 2-D (N, C) CheXpert-style 1/0/−1/NaN: one binary ``LogisticRegression`` per class, fitted
  on the rows where that class is 1 or 0 (−1/NaN ignored, as in zero-shot); per-class AUC
  and macro AUC on the test rows with a 1/0 label.

Features are standardised on the training subset (``StandardScaler``) before the L2-regularised
logistic regression (lbfgs). The subset for a fraction f is drawn by :func:`subsample_indices`:
stratified, seeded, and topped up so that every class keeps ≥ 1 positive (and, for 2-D labels,
≥ 1 negative) whenever the full training set has one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from .plots import new_figure, save_png

__all__ = ["DEFAULT_FRACTIONS", "linear_probe", "plot_tsne", "subsample_indices", "tsne_embedding"]

DEFAULT_FRACTIONS: tuple[float, ...] = (0.01, 0.1, 1.0)


def _fraction_key(f: float) -> str:
    return f"{100.0 * f:g}%"


def _strata(labels: np.ndarray) -> np.ndarray:
    """Stratum per row: the class id (1-D) or the set of positive classes (2-D)."""
    if labels.ndim == 1:
        return labels.astype(str)
    pos = labels == 1  # NaN == 1 is False
    return np.array(["".join("1" if b else "0" for b in row) for row in pos])


def subsample_indices(labels: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """Sorted row indices of a seeded, stratified ``fraction`` of the rows.

    ``k = max(1, round(fraction · N))`` rows are drawn with ``train_test_split(stratify=…)`` on
    the class id (1-D) or the positive-label pattern (2-D; patterns seen once are pooled); when
    stratification is impossible (too few rows per stratum) it falls back to a seeded random
    draw. Then, for every class that has a positive in the full set but none in the subset
    (or, 2-D, no negative), the first such row of a seeded permutation is added, so the subset
    can exceed k by at most (number of classes) rows (1-D) or 2 × classes (2-D).
    ``fraction >= 1`` returns every row.
    """
    y = np.asarray(labels)
    n = y.shape[0]
    if not 0.0 < fraction:
        raise ValueError(f"fraction must be > 0, got {fraction}")
    if fraction >= 1.0 or n == 0:
        return np.arange(n)
    k = max(1, int(round(fraction * n)))
    if k >= n:
        return np.arange(n)
    rows = np.arange(n)
    key = _strata(y)
    uniq, counts = np.unique(key, return_counts=True)
    key = np.where(np.isin(key, uniq[counts < 2]), "__rare__", key)
    try:
        chosen, _ = train_test_split(rows, train_size=k, stratify=key, random_state=seed)
    except ValueError:
        chosen = np.random.default_rng(seed).choice(n, size=k, replace=False)
    selected = np.zeros(n, dtype=bool)
    selected[chosen] = True

    order = np.random.default_rng(seed + 1).permutation(n)
    if y.ndim == 1:
        wants = [y == c for c in np.unique(y)]
    else:
        wants = [y[:, j] == v for j in range(y.shape[1]) for v in (1, 0)]
    for want in wants:
        if want.any() and not (want & selected).any():
            selected[order[np.flatnonzero(want[order])[0]]] = True
    return np.flatnonzero(selected)


def _model(seed: int, C: float, max_iter: int, standardize: bool):
    lr = LogisticRegression(C=C, max_iter=max_iter, random_state=seed)
    return make_pipeline(StandardScaler(), lr) if standardize else lr


def _auc(y: np.ndarray, s: np.ndarray) -> float:
    return float(roc_auc_score(y, s)) if 0 < y.sum() < y.size else math.nan


def _nanmean(values) -> float:
    v = np.asarray(list(values), dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def linear_probe(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    test_features: np.ndarray,
    test_labels: np.ndarray,
    classes: Sequence[str] | None = None,
    *,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seed: int = 0,
    C: float = 1.0,
    max_iter: int = 2000,
    standardize: bool = True,
) -> dict[str, dict[str, object]]:
    """Fit a logistic-regression probe on each label fraction; score the full test set.

    Returns ``{"1%": {"fraction", "n_train", "per_class": {cls: AUC}, "macro_AUC"
    [, "accuracy"]}, "10%": …, "100%": …}``. Class names default to the class ids (1-D) or
    ``class_0 …`` (2-D). A class whose training subset or test set lacks a label value gets
    AUC NaN and is left out of the macro.
    """
    xtr = np.asarray(train_features, dtype=np.float64)
    xte = np.asarray(test_features, dtype=np.float64)
    ytr = np.asarray(train_labels)
    yte = np.asarray(test_labels)
    if xtr.ndim != 2 or xte.ndim != 2 or xtr.shape[1] != xte.shape[1]:
        raise ValueError(f"features must be (N, D) with the same D, got {xtr.shape} and {xte.shape}")
    if ytr.shape[0] != xtr.shape[0] or yte.shape[0] != xte.shape[0] or ytr.ndim != yte.ndim:
        raise ValueError(f"labels {ytr.shape}/{yte.shape} do not match features {xtr.shape}/{xte.shape}")
    multilabel = ytr.ndim == 2
    if multilabel:
        ytr, yte = ytr.astype(np.float64), yte.astype(np.float64)
        ids = list(range(ytr.shape[1]))
    else:
        ids = np.unique(np.concatenate([ytr, yte])).tolist()
    if classes is not None:
        names = [str(c) for c in classes]
    else:
        names = [f"class_{j}" for j in ids] if multilabel else [str(c) for c in ids]
    if len(names) != len(ids):
        raise ValueError(f"{len(names)} class names for {len(ids)} classes")

    results: dict[str, dict[str, object]] = {}
    for f in fractions:
        idx = subsample_indices(ytr, float(f), seed)
        x_sub, y_sub = xtr[idx], ytr[idx]
        per: dict[str, float] = {}
        entry: dict[str, object] = {"fraction": float(f), "n_train": int(idx.size)}
        if multilabel:
            for j, name in enumerate(names):
                v = np.isin(y_sub[:, j], (0.0, 1.0))
                vt = np.isin(yte[:, j], (0.0, 1.0))
                yj = y_sub[v, j].astype(int)
                if not (0 < yj.sum() < yj.size) or not vt.any():
                    per[name] = math.nan
                    continue
                model = _model(seed, C, max_iter, standardize).fit(x_sub[v], yj)
                per[name] = _auc(yte[vt, j].astype(int), model.predict_proba(xte[vt])[:, 1])
        else:
            present = np.unique(y_sub)
            if present.size < 2:
                per = {name: math.nan for name in names}
                entry["accuracy"] = math.nan
            else:
                model = _model(seed, C, max_iter, standardize).fit(x_sub, y_sub)
                proba = model.predict_proba(xte)
                col = {c: i for i, c in enumerate(present.tolist())}
                for c, name in zip(ids, names):
                    per[name] = _auc((yte == c).astype(int), proba[:, col[c]]) if c in col else math.nan
                entry["accuracy"] = float(accuracy_score(yte, model.predict(xte)))
        entry["per_class"] = per
        entry["macro_AUC"] = _nanmean(per.values())
        results[_fraction_key(float(f))] = entry
    return results


# --------------------------------------------------------------------------- t-SNE


def tsne_embedding(features: np.ndarray, seed: int = 0, perplexity: float = 30.0) -> np.ndarray:
    """Seeded 2-D t-SNE (``sklearn.manifold.TSNE``, PCA init, automatic learning rate).
    The perplexity is capped at (N − 1) / 3 so small sets work."""
    from sklearn.manifold import TSNE  # slow import (seconds); only needed here

    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 3:
        raise ValueError(f"t-SNE needs (N, D) features with N >= 3, got shape {x.shape}")
    perp = float(min(perplexity, max(1.0, (x.shape[0] - 1) / 3.0)))
    tsne = TSNE(n_components=2, perplexity=perp, init="pca", learning_rate="auto", random_state=seed)
    return tsne.fit_transform(x)


def plot_tsne(
    features: np.ndarray | None,
    labels: Sequence[object] | np.ndarray,
    path: str | Path | None = None,
    *,
    embedding: np.ndarray | None = None,
    seed: int = 0,
    perplexity: float = 30.0,
    title: str | None = None,
    label_name: str = "class",
) -> tuple[Figure, np.ndarray]:
    """Scatter of the t-SNE embedding coloured by ``labels`` (a label or the latent class).

    Pass a precomputed ``embedding`` (N, 2) to skip t-SNE. Up to 20 distinct label values are
    drawn as categories with a legend (tab10/tab20); more, numeric values get a continuous
    colour bar. Returns ``(figure, embedding)``; writes a PNG when ``path`` is given.
    """
    emb = tsne_embedding(features, seed=seed, perplexity=perplexity) if embedding is None else np.asarray(embedding)
    lab = np.asarray(labels)
    if emb.ndim != 2 or emb.shape[1] != 2 or lab.shape[0] != emb.shape[0]:
        raise ValueError(f"embedding {emb.shape} and labels {lab.shape} must be (N, 2) and (N,)")
    fig = new_figure(6.0, 5.0)
    ax = fig.subplots()
    values = np.unique(lab)
    if values.size <= 20 or not np.issubdtype(lab.dtype, np.number):
        palette = colormaps["tab10" if values.size <= 10 else "tab20"]
        for i, v in enumerate(values):
            sel = lab == v
            ax.scatter(emb[sel, 0], emb[sel, 1], s=8, color=palette(i % palette.N), label=str(v), alpha=0.8)
        ax.legend(title=label_name, fontsize=7, markerscale=2, loc="best")
    else:
        sc = ax.scatter(emb[:, 0], emb[:, 1], s=8, c=lab.astype(np.float64), cmap="viridis", alpha=0.8)
        fig.colorbar(sc, ax=ax, label=label_name)
    ax.set(xticks=[], yticks=[], title=title or f"t-SNE coloured by {label_name}")
    if path is not None:
        save_png(fig, path)
    return fig, emb
