"""Label-free choice of a, k in eta = a * p^k for the LM at hand: a fit to the corpus's sentence frequencies.

The paper's a = 0.2, k = 0.35 were tuned for CXR-BERT's PLL scale. Another LM puts PLLs on another
scale (the small domain LM of ``medclr lm fit`` gives most sentences PLLs of -10 to -60), and the same
a, k then send eta to ~0, i.e. DCL-eta_LM becomes InfoNCE for most pairs. This module fits a, k on
the corpus itself, without class labels.

Target. eta(x) estimates rho(c_x), the probability that another study is of x's class. The nearest
quantity a corpus gives without labels is how often x itself occurs:

    f(x) = n(x) / N,   n(x) = occurrences of x in the ``split`` rows (default train),
                       N = number of those rows that have a sentence (reports).

Fit. Least squares in eta's own functional form, in log space, weighted by n(x):

    log f(x) ~ log a + k * log p(x)      (log p = PLL, or PLL per piece with norm="mean")

One term per (report, sentence) pair, the unit a training step draws; the result is the best
prediction of log frequency from log p within eta's family (the conditional mean in log space, so a
weak predictor gives a flat map rather than an overconfident one). A slope k < 0 (an LM that ranks
rare sentences first) is clamped to k = 0: a constant eta, the weighted geometric mean of f.

Only the manifest's ``split`` and ``sentences`` columns and the table's ``sentence_hash``, ``pll``,
``n_scored`` are read: ground truth (``latent_class``, ``latent_class_prob``) never enters.
:func:`loglog_least_squares` is also the fit ``medclr lm calibrate`` uses against the true rho.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from medclr.errors import MedclrError
from medclr.lm.eta import DEFAULT_A, DEFAULT_ETA_MAX, DEFAULT_K, check_eta_params, log_p, manifest_sentences

log = logging.getLogger(__name__)

METHODS = ("corpus", "paper")  # how `medclr lm score` picks a, k when they are not given


def loglog_least_squares(x, log_y, weights=None) -> dict:
    """Weighted least squares log_y = log a + k * x (closed form, float64): a, k, r2 (weighted), n."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(log_y, dtype=np.float64)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    if not (x.shape == y.shape == w.shape):
        raise MedclrError(f"log-log fit: x {x.shape}, log y {y.shape} and weights {w.shape} differ in shape")
    ok = np.isfinite(x) & np.isfinite(y) & np.isfinite(w) & (w > 0)
    x, y, w = x[ok], y[ok], w[ok]
    if len(x) < 3 or np.ptp(x) == 0:
        raise MedclrError("too few distinct log-likelihoods to fit a and k (need at least 3)")
    w = w / w.sum()
    mx, my = w @ x, w @ y
    dx, dy = x - mx, y - my
    k = float((w * dx) @ dy / ((w * dx) @ dx))
    log_a = float(my - k * mx)
    resid = y - (log_a + k * x)
    r2 = 1.0 - float((w @ resid**2) / max(w @ dy**2, 1e-300))
    return {"a": float(np.exp(log_a)), "k": k, "r2": r2, "n": int(len(x))}


def corpus_counts(manifest: pd.DataFrame, split: str | None = "train") -> tuple[pd.Series, int, str]:
    """(occurrences per sentence_hash in the ``split`` rows, number of those rows with a sentence, rows used).

    A manifest without rows of ``split`` falls back to all rows (logged)."""
    used = "all" if split in (None, "all") else split
    if used != "all" and ("split" not in manifest or not (manifest["split"] == used).any()):
        log.warning("the manifest has no rows with split == %r; eta is fitted on the sentences of all rows", used)
        used = "all"
    st = manifest_sentences(manifest, None if used == "all" else used)
    return st["sentence_hash"].value_counts(), int(st["index"].nunique()), used


def fit_eta_corpus(eta_table: pd.DataFrame, manifest: pd.DataFrame, *, split: str | None = "train",
                   norm: str = "sum") -> dict:
    """Fit a, k of eta = a * p^k to the sentence frequencies of the manifest's ``split`` rows (label-free).

    Returns the dict recorded under ``eta_fit`` in the eta table's metadata: a, k, method, the rows and
    counts used, weighted R^2, the residual sd (nats of log frequency), Spearman(log p, log f) over the
    distinct sentences, and whether k was clamped at 0. Sentences without a PLL in the table are left out.
    """
    from scipy.stats import spearmanr

    counts, n_reports, used = corpus_counts(manifest, split)
    tab = eta_table[eta_table["pll"].notna()].drop_duplicates("sentence_hash").set_index("sentence_hash")
    counts = counts[counts.index.isin(tab.index)]
    n = counts.to_numpy(dtype=np.float64)
    x = log_p(tab["pll"].reindex(counts.index).to_numpy(), tab["n_scored"].reindex(counts.index).to_numpy(), norm)
    y = np.log(n / n_reports)
    fit = loglog_least_squares(x, y, n)
    k_clamped = fit["k"] < 0
    if k_clamped:
        log.warning("the LM gives frequent sentences lower log p (fitted k = %.3g < 0); eta set constant", fit["k"])
        fit = {**fit, "a": float(np.exp(np.average(y, weights=n))), "k": 0.0}
    w = n / n.sum()
    resid = y - (np.log(fit["a"]) + fit["k"] * x)
    return {
        "method": "corpus", "a": fit["a"], "k": fit["k"], "norm": norm,
        "target": "occurrences of the sentence / reports, in the split rows",
        "weights": "occurrences", "split": used, "n_reports": n_reports, "n_sentences": int(len(n)),
        "n_pairs": int(n.sum()), "r2": fit["r2"] if not k_clamped else 0.0,
        "resid_sd": float(np.sqrt(w @ (resid - w @ resid) ** 2)),
        "spearman_logp_logfreq": float(spearmanr(x, y)[0]) if np.ptp(y) > 0 else float("nan"),
        "k_clamped": bool(k_clamped),
    }


def check_eta_choice(method: str, a: float | None, k: float | None, eta_max: float = DEFAULT_ETA_MAX) -> None:
    """The rules for choosing a, k: a known method, a and k given together (then valid), a valid eta_max."""
    if method not in METHODS:
        raise MedclrError(f"eta fit {method!r}; expected one of {METHODS}")
    if (a is None) != (k is None):
        raise MedclrError("give both a and k (eta = a * p^k), or neither to use the eta fit")
    check_eta_params(DEFAULT_A if a is None else a, DEFAULT_K if k is None else k, eta_max)


def resolve_eta_params(eta_table: pd.DataFrame, manifest: pd.DataFrame, *, method: str = "corpus",
                       a: float | None = None, k: float | None = None, split: str | None = "train",
                       norm: str = "sum") -> tuple[float, float, dict]:
    """(a, k, record) for ``medclr lm score``: given a and k win, else ``method`` (corpus fit or the paper's).

    The record (``eta_params`` in the table's metadata) says where a, k came from (``source``: given,
    corpus or paper) and holds the corpus fit whenever it could be computed, also when it is not used.
    A corpus fit that cannot be made (fewer than 3 distinct log p) falls back to the paper's a, k (logged).
    """
    check_eta_choice(method, a, k)
    try:
        fit = fit_eta_corpus(eta_table, manifest, split=split, norm=norm)
    except MedclrError as exc:
        fit = {"method": "corpus", "error": str(exc)}
    if a is not None:
        return float(a), float(k), {"source": "given", "corpus_fit": fit}
    if method == "corpus" and "error" not in fit:
        return fit["a"], fit["k"], {"source": "corpus", "corpus_fit": fit}
    if method == "corpus":
        log.warning("no corpus fit of eta (%s); using the paper's a = %g, k = %g", fit["error"], DEFAULT_A, DEFAULT_K)
    return DEFAULT_A, DEFAULT_K, {"source": "paper", "corpus_fit": fit}
