"""medclr's own eta, DCL-eta_rule: eta on the scale of how often a sentence's rule-read meaning occurs.

Not the paper's method. The paper's eta_LM = a * p_LM(x)^k (a = 0.2, k = 0.35, ``--eta-fit paper``, the
default of ``medclr lm score``) reads nothing but the LM's pseudo-log-likelihood; its a, k were tuned for
CXR-BERT's PLL scale, and the small domain LM of ``medclr lm fit`` (PLLs of -10 to -60) gives a mean eta
of ~0.01 with them. This module is medclr's alternative: it reads a *meaning key* from each sentence by
rules (``medclr.data.hard_negatives.meaning_key``: a regex list of findings, negation and hedge cues,
side, pooled normal statements) and calibrates eta to how often that key occurs. It reads no class
labels, but the key is a rule-based class labeller, which the paper's method avoids: so it trains as
DCL-eta_rule, beside DCL-eta_LM, never under that name.

Target. eta(x) estimates rho(c_x): how often a training pair's sentence states what x states. The
nearest label-free quantity is the frequency of x's *meaning* among the pairs a training step draws:

    f(x) = sum of P(report i, sentence j) over every pair whose sentence has x's meaning key,

with the key read from the words (``medclr.data.hard_negatives.meaning_key``: polarity, finding and
side; paraphrases of a normal statement pooled) and P the draw probabilities of training
(``medclr.data.pairs``; uniform by default, the papers' setup, or the run's own sampling). The frequency
of the exact string is not it: "No pneumothorax." and "There is no pneumothorax." split one meaning,
and most sentences occur once, so their string frequency sits ~10x below rho.

Methods (``medclr lm score --eta-fit``):

* ``meaning`` (DCL-eta_rule): the LM's probability of the *meaning*, p_LM(c) = sum of p_LM(x') over the
  distinct scored sentences x' with x's meaning key (log-sum-exp of their log p): the paper's
  likelihood, summed over the wordings of one statement instead of split between them. eta is an
  isotonic (monotone non-decreasing) map of log p_LM(c), fitted by weighted least squares to f in
  linear space (sklearn's IsotonicRegression, weights = the pairs' draw probabilities): the LM keeps
  the ranking, the corpus gives the scale, and the weighted mean of eta over the pairs equals that of f
  (isotonic regression preserves it, unless a value is clipped at eta_max). The map is recorded as its knots.
* ``sentence``: the paper's form eta = a * p_LM(x)^k on the sentence's own log p, a and k fitted by
  weighted least squares to f in linear space (so the mean eta lands on the mean f; a fit in log space
  lands on the geometric mean, ~10x lower for these heavy-tailed frequencies).
* ``paper``: a = 0.2, k = 0.35 (no fit; the paper's DCL-eta_LM).

How each compares with DCL's false-negative rate q and with rho_sent on a phantom: ``medclr lm calibrate``
(docs/RESULTS.md holds the table).

Only the manifest's ``split`` and ``sentences`` columns and the table's ``sentence_hash``, ``sentence``,
``pll``, ``n_scored`` are read: ground truth never enters.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from medclr.errors import MedclrError
from medclr.lm.eta import DEFAULT_A, DEFAULT_ETA_MAX, DEFAULT_K, check_eta_override, log_p, manifest_sentences

log = logging.getLogger(__name__)

METHODS = ("paper", "meaning", "sentence")  # what `medclr lm score` makes eta when a, k are not given (paper: default)
SAMPLING_DEFAULTS = {"sentence_sampling": "uniform", "other_weight": 0.1, "study_sampling": "uniform",
                     "study_balance": 0.5}


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


def linear_power_fit(x, y, weights) -> dict:
    """Weighted least squares y ~ a * exp(k * x) in linear space with a > 0, k >= 0 (float64): a, k, r2, n.

    Started from the log-space fit (k clamped to >= 0) and refined by scipy's bounded least squares
    (the power law has no closed form in linear space)."""
    from scipy.optimize import least_squares

    x, y, w = (np.asarray(v, dtype=np.float64) for v in (x, y, weights))
    if not (x.shape == y.shape == w.shape):
        raise MedclrError(f"power fit: x {x.shape}, y {y.shape} and weights {w.shape} differ in shape")
    ok = np.isfinite(x) & np.isfinite(y) & (y > 0) & np.isfinite(w) & (w > 0)
    x, y, w = x[ok], y[ok], w[ok]
    if len(x) < 3 or np.ptp(x) == 0:
        raise MedclrError("too few distinct log-likelihoods to fit a and k (need at least 3)")
    w = w / w.sum()
    x0 = float(w @ x)  # centred: a then scales eta at the mean log p, which keeps the problem well posed
    start = loglog_least_squares(x, np.log(y), w)
    k0 = max(start["k"], 0.0)
    c0 = np.log(max(float(w @ y), 1e-12))
    sw = np.sqrt(w)

    def resid(theta):
        return sw * (np.exp(theta[0] + theta[1] * (x - x0)) - y)

    res = least_squares(resid, x0=[c0, k0], bounds=([-np.inf, 0.0], [np.inf, np.inf]), method="trf",
                        x_scale="jac", max_nfev=500)
    c, k = float(res.x[0]), float(res.x[1])
    if k < 1e-6:  # the bounded solver stops just inside k >= 0; at k = 0 the optimum is the weighted mean
        c, k = float(np.log(w @ y)), 0.0
    pred = np.exp(c + k * (x - x0))
    my = float(w @ y)
    r2 = 1.0 - float(w @ (y - pred) ** 2) / max(float(w @ (y - my) ** 2), 1e-300)
    return {"a": float(np.exp(c - k * x0)), "k": k, "r2": r2, "n": int(len(x))}


def meaning_frequency(manifest: pd.DataFrame, split: str | None = "train",
                      sampling: dict | None = None) -> tuple[pd.DataFrame, str]:
    """(one row per (report, sentence) of the ``split`` rows: ``sentence_hash``, ``weight`` = its draw
    probability, ``target`` = the frequency of its meaning key among the drawn pairs, ``key``; the rows used).

    ``sampling``: keyword arguments of ``medclr.data.pairs.pair_probabilities`` (training's draws; default
    uniform). A manifest without rows of ``split`` falls back to all rows (logged)."""
    from medclr.data.hard_negatives import meaning_key
    from medclr.data.pairs import key_frequency, pair_probabilities

    used = "all" if split in (None, "all") else split
    if used != "all" and ("split" not in manifest or not (manifest["split"] == used).any()):
        log.warning("the manifest has no rows with split == %r; eta is fitted on the sentences of all rows", used)
        used = "all"
    st = manifest_sentences(manifest, None if used == "all" else used)
    rows = [g for _, g in st.groupby("index", sort=False)]
    sentences = [g["sentence"].tolist() for g in rows]
    pairs = pair_probabilities(sentences, **{**SAMPLING_DEFAULTS, **(sampling or {})})
    keys = [[meaning_key(s) for s in row] for row in sentences]
    freq = key_frequency(keys, pairs)
    out = pd.DataFrame({"sentence_hash": np.concatenate([g["sentence_hash"].to_numpy() for g in rows]),
                        "weight": np.concatenate(pairs), "target": np.concatenate(freq),
                        "key": [k for row in keys for k in row]})
    return out, used


def meaning_log_p(eta_table: pd.DataFrame, norm: str = "sum") -> pd.Series:
    """Per ``sentence_hash``: log of the LM's probability of the sentence's meaning, the log-sum-exp of log p
    over every distinct scored sentence of the table with the same meaning key (NaN without a PLL)."""
    from scipy.special import logsumexp

    from medclr.data.hard_negatives import meaning_key

    lp = _sentence_log_p(eta_table, norm)
    sentence_of = eta_table.drop_duplicates("sentence_hash").set_index("sentence_hash")["sentence"]
    keys = pd.Series([meaning_key(s) for s in sentence_of.reindex(lp.index)], index=lp.index)
    pooled = lp.groupby(keys).agg(lambda v: float(logsumexp(v.to_numpy())))
    return keys.map(pooled).reindex(eta_table["sentence_hash"].drop_duplicates().to_numpy())


def _fit_pairs(eta_table, manifest, split, norm, sampling, x_of):
    pairs, used = meaning_frequency(manifest, split, sampling)
    x_all = x_of(eta_table, norm)
    pairs = pairs[pairs["sentence_hash"].isin(x_all.dropna().index)]
    x = x_all.reindex(pairs["sentence_hash"]).to_numpy()
    return pairs, used, x, pairs["target"].to_numpy(), pairs["weight"].to_numpy()


def _sentence_log_p(eta_table: pd.DataFrame, norm: str) -> pd.Series:
    tab = eta_table[eta_table["pll"].notna()].drop_duplicates("sentence_hash")
    return pd.Series(log_p(tab["pll"].to_numpy(), tab["n_scored"].to_numpy(), norm), index=tab["sentence_hash"].to_numpy())


def _record(method, pairs, used, manifest, x, y, w, eta, norm, sampling, **extra) -> dict:
    from scipy.stats import spearmanr

    w = w / w.sum()
    return {"method": method, **extra, "norm": norm,
            "target": "frequency of the sentence's meaning key (medclr.data.hard_negatives.meaning_key) among the "
                      "split's (report, sentence) pairs as training draws them",
            "sampling": {**SAMPLING_DEFAULTS, **(sampling or {})}, "weights": "pair draw probability",
            "split": used,
            "n_reports": int(manifest_sentences(manifest, None if used == "all" else used)["index"].nunique()),
            "n_pairs": int(len(y)), "n_keys": int(pairs["key"].nunique()),
            "mean_target": float(w @ y), "mean_eta": float(w @ eta),
            "spearman_logp_target": float(spearmanr(x, y)[0]) if np.ptp(y) > 0 and np.ptp(x) > 0 else float("nan")}


def fit_eta_meaning(eta_table: pd.DataFrame, manifest: pd.DataFrame, *, split: str | None = "train",
                    norm: str = "sum", sampling: dict | None = None, eta_max: float = DEFAULT_ETA_MAX) -> dict:
    """The ``meaning`` calibration: an isotonic map from the meaning's pooled log p (:func:`meaning_log_p`) to
    the meaning frequency of the ``split`` rows' pairs (label-free). Returns the record kept under
    ``eta_params.fit`` in the table's metadata: the map's knots (``knots_log_p``, ``knots_eta``), the pairs and
    keys used, the mean target and the mean fitted eta over the drawn pairs, Spearman(log p, target)."""
    from sklearn.isotonic import IsotonicRegression

    pairs, used, x, y, w = _fit_pairs(eta_table, manifest, split, norm, sampling, meaning_log_p)
    if len(x) < 3 or np.ptp(x) == 0:
        raise MedclrError("too few distinct log-likelihoods to calibrate eta (need at least 3)")
    iso = IsotonicRegression(y_min=1e-6, y_max=eta_max, increasing=True, out_of_bounds="clip").fit(x, y, sample_weight=w)
    eta = iso.predict(x)
    return _record("meaning", pairs, used, manifest, x, y, w, eta, norm, sampling,
                   knots_log_p=iso.X_thresholds_.tolist(), knots_eta=iso.y_thresholds_.tolist())


def fit_eta_sentence(eta_table: pd.DataFrame, manifest: pd.DataFrame, *, split: str | None = "train",
                     norm: str = "sum", sampling: dict | None = None) -> dict:
    """The ``sentence`` calibration: a, k of eta = a * p^k on the sentence's own log p, fitted in linear space
    to the meaning frequency of the ``split`` rows' pairs (label-free); the record holds a, k and R^2."""
    pairs, used, x, y, w = _fit_pairs(eta_table, manifest, split, norm, sampling, _sentence_log_p)
    fit = linear_power_fit(x, y, w)
    eta = np.minimum(fit["a"] * np.exp(fit["k"] * x), DEFAULT_ETA_MAX)
    return _record("sentence", pairs, used, manifest, x, y, w, eta, norm, sampling, a=fit["a"], k=fit["k"],
                   r2=fit["r2"], k_zero=bool(fit["k"] == 0.0))


def eta_of_table(eta_table: pd.DataFrame, params: dict, *, norm: str, eta_max: float) -> tuple[np.ndarray, int]:
    """(eta per table row, how many were clipped at eta_max) under ``params`` (the ``eta_params`` record:
    the meaning map's knots, or a and k)."""
    fit = params.get("fit", {})
    if params["source"] == "meaning":
        x = meaning_log_p(eta_table, norm).reindex(eta_table["sentence_hash"]).to_numpy()
        eta = np.interp(x, fit["knots_log_p"], fit["knots_eta"])  # flat beyond the ends (clip)
        return np.minimum(eta, eta_max), int((eta > eta_max).sum())
    raw = params["a"] * np.exp(params["k"] * log_p(eta_table["pll"], eta_table["n_scored"], norm))
    return np.minimum(raw, eta_max), int((raw > eta_max).sum())


def check_eta_choice(method: str, a: float | None, k: float | None, eta_max: float = DEFAULT_ETA_MAX) -> None:
    """The rules for choosing eta: a known method, a and k given together (then valid), a valid eta_max."""
    if method not in METHODS:
        raise MedclrError(f"eta fit {method!r}; expected one of {METHODS}")
    check_eta_override(a, k, eta_max)


# Below this Spearman (the LM's log p of a meaning against how often the corpus states it) the fit is warned
# about: the demo's LM reaches 0.5-0.6 (docs/experiments/2026-11-26-eta-rule-calibration.md); a near-flat eta makes
# DCL-eta_rule a plain DCL.
WEAK_FIT_SPEARMAN = 0.3


def resolve_eta_params(eta_table: pd.DataFrame, manifest: pd.DataFrame, *, method: str = "paper",
                       a: float | None = None, k: float | None = None, split: str | None = "train",
                       norm: str = "sum", sampling: dict | None = None, eta_max: float = DEFAULT_ETA_MAX) -> dict:
    """The ``eta_params`` record for ``medclr lm score``: given a and k win, else ``method``.

    ``source`` says what eta is: ``given`` / ``paper`` / ``sentence`` (eta = a * p^k with the record's ``a``,
    ``k``) or ``meaning`` (the isotonic map in ``fit``). ``fit`` holds the method's fit (the meaning fit when
    a, k are given or the paper's are asked for), also when it is not used. A fit that cannot be made (fewer
    than 3 distinct log p) falls back to the paper's a, k (logged).
    """
    check_eta_choice(method, a, k, eta_max)
    fitter = fit_eta_sentence if method == "sentence" else fit_eta_meaning
    kwargs = {"split": split, "norm": norm, "sampling": sampling}
    try:
        fit = fitter(eta_table, manifest, **kwargs, **({"eta_max": eta_max} if fitter is fit_eta_meaning else {}))
    except MedclrError as exc:
        fit = {"method": method, "error": str(exc)}
    if a is not None:
        return {"source": "given", "a": float(a), "k": float(k), "fit": fit}
    if method != "paper" and "error" not in fit:
        weak = fit.get("spearman_logp_target", float("nan"))
        if not weak >= WEAK_FIT_SPEARMAN:
            log.warning("the LM ranks the sentences' meanings weakly (Spearman of log p with their frequency %.2f, "
                        "below %.1f): eta_LM will be nearly a constant, and DCL-eta_LM nearly DCL. Fit the LM longer "
                        "(`medclr lm fit --epochs`), or pass --eta-a/--eta-k (docs/lm.md)", weak, WEAK_FIT_SPEARMAN)
        return {"source": method, **({"a": fit["a"], "k": fit["k"]} if method == "sentence" else {}), "fit": fit}
    if method != "paper":
        log.warning("no %s fit of eta (%s); using the paper's a = %g, k = %g", method, fit["error"], DEFAULT_A, DEFAULT_K)
    return {"source": "paper", "a": DEFAULT_A, "k": DEFAULT_K, "fit": fit}
