"""Check eta_LM against the class probability it estimates, rho_sent, where it is known (CXR-Phantom).

A training step pairs an image with one sentence of its report, and the debiased loss's eta(x) estimates
rho(c_x): how often another pair's sentence states what x states. On a phantom that is known per sentence:
rho_sent = the frequency of the sentence's ground-truth key among the training split's (report, sentence)
pairs as training draws them (``medclr.phantom.sentence_keys``: every report once per epoch, one sentence
uniformly). Each eta variant is compared with it over the training pairs:

* ``mean_ratio``: E[eta] / E[rho] over the drawn pairs (the scale: 1 = right on average);
* ``spearman``: Spearman(eta, rho) over the pairs (the ranking; the same for every a, k with k > 0,
  since eta is monotone in log p, except for ties made by the eta_max clip or k = 0);
* ``median_abs_log_ratio``: the pair-weighted median of |log eta - log rho| (1 = a factor e);
* ``misspecification``: E |1/(1 - eta) - 1/(1 - rho)|, the eta term of the paper's Proposition 1.

Variants: the table's own eta (what ``medclr lm score`` wrote), the paper's (0.2, 0.35), the label-free
calibrations of ``medclr.lm.eta_fit`` recomputed here (``meaning_fit``: the isotonic map of the meaning's
pooled likelihood, the default; ``sentence_fit``: a * p^k on the sentence's PLL, linear space), the earlier
label-free fit (``string_fit``: log-space least squares on the exact string's frequency, medclr's default
before), the best a * p^k on the sentence's PLL for rho itself (``ground_truth_power``: how far the
paper's form can go with this LM's ranking), and the paper's constants 0.05 and 0.1.

Outputs in DIR: ``calibration.json``; ``calibration.png``: the reliability plot (pairs binned by eta, the
mean rho of each bin against its mean eta, for the table's, the paper's and the string-fit eta) beside
log eta against log rho for every pair; ``per_key.csv`` (one row per ground-truth key: rho, pairs,
median eta). When the manifest has the study's ``latent_class_prob`` (the study prior, a different
quantity), Spearman of the report's log p against it is reported under ``study``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd

from medclr.errors import MedclrError
from medclr.lm.eta import DEFAULT_A, DEFAULT_ETA_MAX, DEFAULT_K, eta_from_pll, log_p, manifest_sentences
from medclr.lm.eta_fit import (
    eta_of_table,
    fit_eta_meaning,
    fit_eta_sentence,
    linear_power_fit,
    loglog_least_squares,
)

log = logging.getLogger(__name__)

GROUND_TRUTH = ("latent_class", "latent_class_prob")
QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)
RELIABILITY_BINS = 10


# How `lm calibrate --ground-truth` joins a phantom's table (medclr.data.groundtruth.attach_ground_truth):
# latent_class / latent_class_prob on dicom_id, else study_id; rows without ground truth get NaN, but some must match.
GROUND_TRUTH_JOIN = {"columns": GROUND_TRUTH, "keys": ("dicom_id", "study_id"), "require": "any"}


def misspecification(eta, rho, weights=None) -> float:
    """E |1/(1 - eta) - 1/(1 - rho)| (Proposition 1's eta term), optionally weighted."""
    eta, rho = np.asarray(eta, dtype=np.float64), np.asarray(rho, dtype=np.float64)
    return float(np.average(np.abs(1.0 / (1.0 - eta) - 1.0 / (1.0 - rho)), weights=weights))


def weighted_median(x, w) -> float:
    order = np.argsort(x)
    x, cw = np.asarray(x)[order], np.cumsum(np.asarray(w, dtype=np.float64)[order])
    return float(x[np.searchsorted(cw, 0.5 * cw[-1])])


def sentence_pairs(manifest: pd.DataFrame, eta_table: pd.DataFrame, norm: str, split: str,
                   sampling: dict | None = None) -> pd.DataFrame:
    """One row per (report, sentence) of the ``split`` rows: index, sentence_hash, pll, n_scored, logp,
    weight (its draw probability under ``sampling``, uniform by default), key (ground truth), rho (rho_sent),
    string_freq (occurrences of the exact sentence / reports)."""
    from medclr.data.pairs import pair_probabilities
    from medclr.lm.eta_fit import SAMPLING_DEFAULTS
    from medclr.phantom.sentence_keys import rho_sent, sentence_key

    st = manifest_sentences(manifest, split)
    rows = [g for _, g in st.groupby("index", sort=False)]
    sentences = [g["sentence"].tolist() for g in rows]
    out = pd.concat(rows, ignore_index=True)
    sampling = {**SAMPLING_DEFAULTS, **(sampling or {})}
    out["weight"] = np.concatenate(pair_probabilities(sentences, **sampling))
    out["rho"] = np.concatenate(rho_sent(sentences, **sampling))
    out["key"] = [sentence_key(s) for row in sentences for s in row]
    out["string_freq"] = out["sentence_hash"].map(out["sentence_hash"].value_counts()) / len(rows)
    tab = eta_table[eta_table["pll"].notna()].drop_duplicates("sentence_hash").set_index("sentence_hash")
    out["pll"] = tab["pll"].reindex(out["sentence_hash"]).to_numpy()
    out["n_scored"] = tab["n_scored"].reindex(out["sentence_hash"]).to_numpy()
    lost = out["pll"].isna()
    if lost.all():
        raise MedclrError("no sentence of the manifest's rows is in the eta table; run `medclr lm score` on it")
    if lost.any():
        log.warning("%d of %d pairs have no PLL in the eta table; they are left out", int(lost.sum()), len(out))
    out = out[~lost].reset_index(drop=True)
    out["logp"] = log_p(out["pll"], out["n_scored"], norm)
    return out


def variant_stats(p: pd.DataFrame, eta: np.ndarray, **params) -> dict:
    """One eta (aligned with the pairs ``p``) against rho_sent."""
    from scipy.stats import spearmanr

    rho, w = p["rho"].to_numpy(), p["weight"].to_numpy()
    return {**params,
            "eta_quantiles": {f"{q:g}": float(np.quantile(eta, q)) for q in QUANTILES},
            "mean_eta": float(np.average(eta, weights=w)),
            "mean_ratio": float(np.average(eta, weights=w) / np.average(rho, weights=w)),
            "spearman": float(spearmanr(eta, rho)[0]) if np.ptp(eta) > 0 else float("nan"),
            "median_abs_log_ratio": weighted_median(np.abs(np.log(np.maximum(eta, 1e-300)) - np.log(rho)), w),
            "misspecification": misspecification(eta, rho, w)}


def reliability(eta, rho, w, bins: int = RELIABILITY_BINS) -> pd.DataFrame:
    """Pairs binned by eta (bins of equal pair weight): mean eta, mean rho and the weight of each bin."""
    order = np.argsort(eta, kind="stable")
    cw = np.cumsum(np.asarray(w)[order]) / np.sum(w)
    b = np.minimum((cw * bins).astype(int), bins - 1)
    df = pd.DataFrame({"bin": b, "eta": np.asarray(eta)[order], "rho": np.asarray(rho)[order],
                       "w": np.asarray(w)[order]})
    g = df.groupby("bin")
    return pd.DataFrame({"eta": g.apply(lambda d: np.average(d["eta"], weights=d["w"]), include_groups=False),
                         "rho": g.apply(lambda d: np.average(d["rho"], weights=d["w"]), include_groups=False),
                         "weight": g["w"].sum()})


def calibrate(manifest: pd.DataFrame, eta_table: pd.DataFrame, out_dir: str | os.PathLike, *,
              eta_meta: dict | None = None, norm: str | None = None, fit_split: str = "train",
              sampling: dict | None = None) -> dict:
    """Write calibration.json / calibration.png / per_key.csv to ``out_dir``; return the json dict.
    ``sampling``: how training draws pairs (``medclr.data.pairs.pair_probabilities`` keywords); default: the
    eta table's own (its fit's ``sampling``), else uniform."""
    from scipy.stats import spearmanr

    meta = eta_meta or {}
    norm = norm or meta.get("norm", "sum")
    eta_max = float(meta.get("eta_max", DEFAULT_ETA_MAX))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if sampling is None:
        sampling = meta.get("eta_params", {}).get("fit", {}).get("sampling")
    p = sentence_pairs(manifest, eta_table, norm, fit_split, sampling)
    x, rho, w = p["logp"].to_numpy(), p["rho"].to_numpy(), p["weight"].to_numpy()

    def power(a, k):
        return eta_from_pll(p["pll"], p["n_scored"], a=a, k=k, norm=norm, eta_max=eta_max)

    table_eta = eta_table.drop_duplicates("sentence_hash").set_index("sentence_hash")["eta"]
    meaning = fit_eta_meaning(eta_table, manifest, split=fit_split, norm=norm, eta_max=eta_max,
                              sampling=sampling)  # label-free: the words only
    sentence = fit_eta_sentence(eta_table, manifest, split=fit_split, norm=norm, sampling=sampling)
    meaning_eta = pd.Series(eta_of_table(eta_table, {"source": "meaning", "fit": meaning}, norm=norm,
                                         eta_max=eta_max)[0], index=eta_table["sentence_hash"].to_numpy())
    meaning_eta = meaning_eta[~meaning_eta.index.duplicated()].reindex(p["sentence_hash"]).to_numpy()
    string = loglog_least_squares(x, np.log(p["string_freq"].to_numpy()), w)
    string_k = max(string["k"], 0.0)
    truth = linear_power_fit(x, rho, w)
    result: dict = {
        "norm": norm, "split": fit_split, "sampling": sampling,
        "target": "rho_sent: frequency of the sentence's ground-truth key (medclr.phantom.sentence_keys) among the "
                  "split's (report, sentence) pairs as training draws them",
        "n_pairs": int(len(p)), "n_keys": int(p["key"].nunique()), "mean_rho": float(np.average(rho, weights=w)),
        "eta_table": {k: meta.get(k) for k in ("model", "pll_variant", "a", "k", "eta_max")},
        "spearman_logp_rho": float(spearmanr(x, rho)[0]),
        "meaning_fit": meaning,
        "sentence_fit": sentence,
    }
    etas = {"table": table_eta.reindex(p["sentence_hash"]).to_numpy(dtype=np.float64),
            "paper": power(DEFAULT_A, DEFAULT_K), "meaning_fit": meaning_eta,
            "sentence_fit": power(sentence["a"], sentence["k"]), "string_fit": power(string["a"], string_k),
            "ground_truth_power": power(truth["a"], truth["k"]),
            "constant 0.05": np.full(len(p), 0.05), "constant 0.1": np.full(len(p), 0.1)}
    params = {"table": {k: meta.get(k) for k in ("a", "k")} | {"source": meta.get("eta_params", {}).get("source")},
              "paper": {"a": DEFAULT_A, "k": DEFAULT_K}, "sentence_fit": {"a": sentence["a"], "k": sentence["k"]},
              "string_fit": {"a": string["a"], "k": string_k}, "ground_truth_power": {"a": truth["a"], "k": truth["k"]}}
    result["variants"] = {name: variant_stats(p, eta, **params.get(name, {})) for name, eta in etas.items()}
    if all(c in manifest for c in GROUND_TRUTH):
        study = p.groupby("index").agg(pll=("pll", "sum"), n_scored=("n_scored", "sum"))
        prior = pd.to_numeric(manifest.set_index("index")["latent_class_prob"], errors="coerce").reindex(study.index)
        ok = prior.notna().to_numpy()
        if ok.sum() > 2:
            result["study"] = {"target": "latent_class_prob (the study's class prior)", "n_studies": int(ok.sum()),
                               "spearman_logp_prior": float(spearmanr(log_p(study["pll"], study["n_scored"], norm)[ok],
                                                                      prior[ok])[0])}
    for name, v in result["variants"].items():
        log.info("%-16s E[eta]/E[rho] %6.2f  Spearman %+.3f  median |log eta/rho| %.2f  E|1/(1-eta)-1/(1-rho)| "
                 "%.4f", name, v["mean_ratio"], v["spearman"], v["median_abs_log_ratio"], v["misspecification"])
    p["eta_table"] = etas["table"]
    per_key = p.groupby("key").agg(rho=("rho", "first"), pairs=("weight", "size"), weight=("weight", "sum"),
                                   eta_median=("eta_table", "median")).sort_values("weight", ascending=False)
    per_key.to_csv(out / "per_key.csv")
    curves = {name: reliability(etas[name], rho, w) for name in ("table", "sentence_fit", "string_fit", "paper")}
    result["reliability"] = {name: c.round(6).to_dict(orient="list") for name, c in curves.items()}
    _plot(p, curves, result, out / "calibration.png")
    (out / "calibration.json").write_text(json.dumps(result, indent=2) + "\n")
    v = result["variants"]["table"]
    log.info("eta of the table against rho_sent over %d pairs (%d keys): E[eta]/E[rho] %.2f, Spearman %.3f, median "
             "|log eta/rho| %.2f; wrote %s", len(p), result["n_keys"], v["mean_ratio"], v["spearman"],
             v["median_abs_log_ratio"], out)
    return result


def _plot(p: pd.DataFrame, curves: dict, result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.8), dpi=90)
    ax = axes[0]
    labels = {"table": "this table's eta", "sentence_fit": "a*p^k on the sentence, linear fit",
              "string_fit": "a*p^k, exact-string log fit (before)", "paper": "paper's a=0.2, k=0.35"}
    lo = max(min(min(c["eta"].min(), c["rho"].min()) for c in curves.values()) * 0.7, 1e-4)
    hi = max(max(c["eta"].max(), c["rho"].max()) for c in curves.values()) * 1.4
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="eta = rho")
    for (name, c), marker in zip(curves.items(), "os^v"):
        v = result["variants"][name]
        ax.plot(c["eta"], c["rho"], marker + "-", ms=5,
                label=f"{labels[name]}: E[eta]/E[rho] {v['mean_ratio']:.2f}, med |log| {v['median_abs_log_ratio']:.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("mean eta in the bin (10 bins of equal pair weight)")
    ax.set_ylabel("mean rho_sent in the bin")
    ax.set_title("reliability: is eta the frequency it claims?")
    ax.legend(loc="lower right", fontsize=7)
    ax = axes[1]
    ln10 = np.log(10.0)
    xe, yr = np.log(np.maximum(p["eta_table"], 1e-12)) / ln10, np.log(p["rho"]) / ln10
    hb = ax.hexbin(xe, yr, gridsize=(40, 25), bins="log", cmap="viridis", mincnt=1)
    fig.colorbar(hb, ax=ax, label="(report, sentence) pairs")
    ax.plot([yr.min(), yr.max()], [yr.min(), yr.max()], "k--", lw=1)
    ax.set_xlabel("log10 eta (this table)")
    ax.set_ylabel("log10 rho_sent")
    ax.set_title(f"every training pair; Spearman {result['variants']['table']['spearman']:.2f}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
