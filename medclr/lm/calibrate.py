"""Check eta_LM against the true class probability rho(c) where it is known (CXR-Phantom), and fit a, k.

The paper assumes log eta = log a + k * log p_LM(x) approximates log rho(c_x)
and could not check it (real reports have no class labels). A phantom
manifest has ``latent_class`` and ``latent_class_prob`` (= rho) per study, so:

* rank agreement: Spearman between log p_LM (hence log eta, monotone) and log rho;
* a least-squares fit of log rho = log a + k * log p on the training rows
  (reported with R^2, and evaluated on the other rows);
* the misspecification term of the paper's Proposition 1,
  E |1/(1 - eta) - 1/(1 - rho)|, for the eta in the table, the fitted (a, k),
  constant eta = 0.05 / 0.1 (the paper's DCL-eta baselines) and eta = 0 (InfoNCE).

Two levels: ``sentence`` pairs every (row, sentence) with its row's rho (what
training uses: eta is per sentence); ``study`` uses the report's log p = the sum
of its sentences' log p (sentences treated as independent).

Beside the table's own (a, k), ``eta_variants`` compares the paper's (0.2, 0.35),
the label-free corpus fit (``medclr.lm.eta_fit``, recomputed here from the
manifest's training sentences) and the fit on rho above: eta quantiles, Spearman
of eta against rho per sentence pair and per study (mean eta of its sentences),
the misspecification term and the median |log eta - log rho| on held-out rows.
Per sentence pair, Spearman is the same for every (a, k) with k > 0 (eta is
monotone in log p) except for ties made by the eta_max clip.

Outputs in DIR: ``calibration.json``, ``calibration.png`` (log eta against
log rho, all pairs and per-class medians), ``per_class.csv``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd

from medclr.errors import MedclrError
from medclr.lm.eta import DEFAULT_A, DEFAULT_ETA_MAX, DEFAULT_K, eta_from_pll, eta_long, log_p
from medclr.lm.eta_fit import fit_eta_corpus, loglog_least_squares

log = logging.getLogger(__name__)

GROUND_TRUTH = ("latent_class", "latent_class_prob")
QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)


def attach_ground_truth(manifest: pd.DataFrame, path: str | os.PathLike) -> pd.DataFrame:
    """Add latent_class / latent_class_prob from a ground-truth parquet (or a phantom folder), joined on
    dicom_id (else study_id); rows without ground truth get NaN, but some row must match.
    :func:`medclr.phantom.groundtruth.attach_ground_truth` with calibration's parameters."""
    from medclr.phantom.groundtruth import attach_ground_truth as attach

    return attach(manifest, path, columns=GROUND_TRUTH, keys=("dicom_id", "study_id"), require="any")


def misspecification(eta, rho) -> float:
    """E |1/(1 - eta) - 1/(1 - rho)| (Proposition 1's eta term)."""
    eta, rho = np.asarray(eta, dtype=np.float64), np.asarray(rho, dtype=np.float64)
    return float(np.mean(np.abs(1.0 / (1.0 - eta) - 1.0 / (1.0 - rho))))


def fit_loglog(logp, rho) -> dict:
    """Least squares log rho = log a + k log p; returns a, k, r2, n."""
    return loglog_least_squares(logp, np.log(np.asarray(rho, dtype=np.float64)))


def variant_stats(p: pd.DataFrame, held: np.ndarray, a: float, k: float, *, norm: str, eta_max: float,
                  fit_split: str) -> dict:
    """One (a, k) on the sentence pairs: eta quantiles (fit_split pairs), Spearman(eta, rho) per sentence pair
    and per study (a study's eta = the mean of its sentences' eta, what a training step draws on average),
    and on the held-out pairs E|1/(1-eta) - 1/(1-rho)| and the median |log eta - log rho|."""
    from scipy.stats import spearmanr

    def rank_corr(x, y) -> float:  # NaN, not a warning, for a constant eta (k = 0)
        return float(spearmanr(x, y)[0]) if np.ptp(x) > 0 and np.ptp(y) > 0 else float("nan")

    eta = eta_from_pll(p["pll"], p["n_scored"], a=a, k=k, norm=norm, eta_max=eta_max)
    rho = p["rho"].to_numpy()
    train = (p["split"] == fit_split).to_numpy()
    q = eta[train] if train.any() else eta
    study = pd.DataFrame({"index": p["index"], "eta": eta, "rho": rho}).groupby("index").agg(
        eta=("eta", "mean"), rho=("rho", "first"))
    return {"a": float(a), "k": float(k),
            "eta_quantiles": {f"{x:g}": float(np.quantile(q, x)) for x in QUANTILES},
            "spearman_sentence": rank_corr(eta, rho),
            "spearman_study_mean_eta": rank_corr(study["eta"], study["rho"]),
            "misspecification_heldout": misspecification(eta[held], rho[held]),
            "median_abs_log_error_heldout": float(np.median(np.abs(np.log(np.maximum(eta[held], 1e-300))
                                                                   - np.log(rho[held]))))}


def pairs(manifest: pd.DataFrame, eta_table: pd.DataFrame, norm: str, level: str) -> pd.DataFrame:
    """One row per (row, sentence) or per study: index, split, latent_class, rho, logp, eta_table."""
    missing = [c for c in GROUND_TRUTH if c not in manifest]
    if missing:
        raise MedclrError(f"manifest has no {' / '.join(missing)} column; calibration needs ground truth "
                          "(a CXR-Phantom manifest from `medclr phantom`)")
    long = eta_long(manifest, eta_table, column="eta")
    tab = eta_table.drop_duplicates("sentence_hash").set_index("sentence_hash")
    long["logp"] = log_p(tab["pll"].reindex(long["sentence_hash"]).to_numpy(),
                         tab["n_scored"].reindex(long["sentence_hash"]).to_numpy(), norm)
    long["pll"] = tab["pll"].reindex(long["sentence_hash"]).to_numpy()
    long["n_scored"] = tab["n_scored"].reindex(long["sentence_hash"]).to_numpy()
    info = manifest.set_index("index")[["split", *GROUND_TRUTH]]
    if level == "study":
        g = long.groupby("index")
        long = pd.DataFrame({"pll": g["pll"].sum(), "n_scored": g["n_scored"].sum()}).reset_index()
        long["logp"] = log_p(long["pll"], long["n_scored"], norm)
        long["eta"] = np.nan
    elif level != "sentence":
        raise MedclrError(f"level={level!r}; expected 'sentence' or 'study'")
    out = long.join(info, on="index").rename(columns={"latent_class_prob": "rho"})
    rho = pd.to_numeric(out["rho"], errors="coerce")
    bad = ~((rho > 0) & (rho < 1))
    if bad.all():
        raise MedclrError("latent_class_prob has no values in (0, 1); expected the true class probability per study")
    if bad.any():
        log.warning("%d pairs have latent_class_prob outside (0, 1) or missing; they are left out", int(bad.sum()))
    out["rho"] = rho
    return out[~bad].reset_index(drop=True)


def calibrate(manifest: pd.DataFrame, eta_table: pd.DataFrame, out_dir: str | os.PathLike, *,
              eta_meta: dict | None = None, norm: str | None = None, fit_split: str = "train") -> dict:
    """Write calibration.json / calibration.png / per_class.csv to ``out_dir``; return the json dict."""
    from scipy.stats import pearsonr, spearmanr

    meta = eta_meta or {}
    norm = norm or meta.get("norm", "sum")
    eta_max = float(meta.get("eta_max", DEFAULT_ETA_MAX))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"norm": norm, "eta_table": {k: meta.get(k) for k in ("model", "pll_variant", "a", "k", "eta_max")}}
    for level in ("sentence", "study"):
        p = pairs(manifest, eta_table, norm, level)
        fit_rows = p["split"] == fit_split
        if fit_rows.sum() < 3:
            log.warning("fewer than 3 pairs in split '%s'; fitting a, k on all rows", fit_split)
            fit_rows[:] = True
        held = ~fit_rows if (~fit_rows).sum() >= 3 else fit_rows
        fit = fit_loglog(p.loc[fit_rows, "logp"], p.loc[fit_rows, "rho"])
        eta_fit = np.minimum(fit["a"] * np.exp(fit["k"] * p["logp"]), eta_max)
        a0, k0 = float(meta.get("a", 0.2)), float(meta.get("k", 0.35))
        eta_tab = eta_from_pll(p["pll"], p["n_scored"], a=a0, k=k0, norm=norm, eta_max=eta_max)
        rho = p["rho"].to_numpy()
        sp = spearmanr(p["logp"], np.log(rho))
        pe = pearsonr(p["logp"], np.log(rho)) if np.ptp(p["logp"]) > 0 else (np.nan, np.nan)
        h = held.to_numpy()
        result[level] = {
            "n_pairs": int(len(p)), "n_classes": int(p["latent_class"].nunique()),
            "spearman_logp_logrho": float(sp[0]), "spearman_p": float(sp[1]),
            "pearson_logp_logrho": float(pe[0]),
            "spearman_heldout": float(spearmanr(p.loc[h, "logp"], np.log(rho[h]))[0]),
            "fit": {**fit, "fit_split": fit_split if fit_rows.sum() < len(p) else "all"},
            "misspecification_heldout": {
                f"table (a={a0:g}, k={k0:g})": misspecification(eta_tab[h], rho[h]),
                f"fitted (a={fit['a']:.3g}, k={fit['k']:.3g})": misspecification(eta_fit[h], rho[h]),
                "constant 0.05": misspecification(np.full(h.sum(), 0.05), rho[h]),
                "constant 0.1": misspecification(np.full(h.sum(), 0.1), rho[h]),
                "infonce (eta = 0)": misspecification(np.zeros(h.sum()), rho[h]),
            },
        }
        if level == "sentence":
            p["log_eta"] = np.log(eta_tab)
            per_class = p.groupby("latent_class").agg(
                rho=("rho", "first"), n=("rho", "size"), log_eta_median=("log_eta", "median"),
                log_eta_q25=("log_eta", lambda s: s.quantile(0.25)),
                log_eta_q75=("log_eta", lambda s: s.quantile(0.75)),
                logp_median=("logp", "median")).reset_index()
            per_class.to_csv(out / "per_class.csv", index=False)
            sentence_pairs, sentence_fit, sentence_held = p, fit, h
            result["sentence"]["spearman_per_class_median"] = float(
                spearmanr(per_class["log_eta_median"], np.log(per_class["rho"]))[0]) if len(per_class) > 2 else None
    corpus = fit_eta_corpus(eta_table, manifest, split=fit_split, norm=norm)  # label-free: split + sentences only
    result["corpus_fit"] = corpus
    choices = {"paper": (DEFAULT_A, DEFAULT_K), "table": (a0, k0), "corpus_fit": (corpus["a"], corpus["k"]),
               "ground_truth_fit": (sentence_fit["a"], sentence_fit["k"])}
    result["eta_variants"] = {name: variant_stats(sentence_pairs, sentence_held, a, k, norm=norm, eta_max=eta_max,
                                                  fit_split=fit_split) for name, (a, k) in choices.items()}
    for name, v in result["eta_variants"].items():
        log.info("%-16s a=%-8.3g k=%-7.3g eta 10/50/90%%: %.2g / %.2g / %.2g; Spearman vs rho sentence %.3f, "
                 "study %.3f; held out E|1/(1-eta)-1/(1-rho)| %.4f, median |log eta/rho| %.2f", name, v["a"], v["k"],
                 v["eta_quantiles"]["0.1"], v["eta_quantiles"]["0.5"], v["eta_quantiles"]["0.9"],
                 v["spearman_sentence"], v["spearman_study_mean_eta"], v["misspecification_heldout"],
                 v["median_abs_log_error_heldout"])
    _plot(sentence_pairs, per_class, sentence_fit, a0, k0, eta_max, norm, out / "calibration.png", result["sentence"],
          corpus)
    (out / "calibration.json").write_text(json.dumps(result, indent=2) + "\n")
    s = result["sentence"]
    log.info("sentence level: Spearman(log p, log rho) = %.3f over %d pairs (%d classes); fitted a = %.3g, k = %.3g "
             "(R^2 %.2f); wrote %s", s["spearman_logp_logrho"], s["n_pairs"], s["n_classes"], s["fit"]["a"],
             s["fit"]["k"], s["fit"]["r2"], out)
    return result


def _plot(p, per_class, fit, a0, k0, eta_max, norm, path, stats, corpus) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ln10 = np.log(10.0)
    x, y = p["log_eta"] / ln10, np.log10(p["rho"])
    ylo, yhi = float(y.min()) - 0.3, float(y.max()) + 0.3
    xlo, xhi = float(np.percentile(x, 1)) - 0.3, float(x.max()) + 0.3
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.6), dpi=90)
    ax = axes[0]
    keep = x >= xlo
    hb = ax.hexbin(x[keep], y[keep], gridsize=(45, 25), bins="log", cmap="viridis", mincnt=1,
                   extent=(xlo, xhi, ylo, yhi))
    fig.colorbar(hb, ax=ax, label="(row, sentence) pairs")
    xs = np.linspace(xlo, xhi, 50)
    ax.plot(xs, xs, "k--", lw=1, label="eta = rho")
    logp = (xs * ln10 - np.log(a0)) / k0 if k0 > 0 else np.zeros_like(xs)  # the table's eta back to log p
    ax.plot(xs, (np.log(fit["a"]) + fit["k"] * logp) / ln10, "r-", lw=1.5,
            label=f"least squares on rho (train): a={fit['a']:.3g}, k={fit['k']:.3g}")
    ax.plot(xs, (np.log(corpus["a"]) + corpus["k"] * logp) / ln10, "m-", lw=1.5,
            label=f"corpus fit (no labels): a={corpus['a']:.3g}, k={corpus['k']:.3g}")
    ax.set_xlim(xlo, xhi)
    ax.set_ylim(ylo, yhi)
    ax.set_xlabel(f"log10 eta_LM (a={a0:g}, k={k0:g}, {norm} PLL); lowest 1% not shown")
    ax.set_ylabel("log10 rho (true class probability)")
    ax.set_title(f"every (row, sentence); Spearman {stats['spearman_logp_logrho']:.2f}")
    ax.legend(loc="upper left", fontsize=7)
    ax = axes[1]
    med = per_class["log_eta_median"] / ln10
    ax.scatter(med, np.log10(per_class["rho"]), s=np.clip(per_class["n"], 4, 200), alpha=0.5, lw=0)
    lo2, hi2 = max(float(med.min()), xlo) - 0.3, float(med.max()) + 0.3
    ax.plot([lo2, hi2], [lo2, hi2], "k--", lw=1)
    ax.set_xlim(lo2, hi2)
    ax.set_ylim(ylo, yhi)
    ax.set_xlabel("median log10 eta_LM of the class's sentences (size: sentences)")
    ax.set_ylabel("log10 rho")
    sp = stats.get("spearman_per_class_median")
    ax.set_title("per latent class" + (f"; Spearman {sp:.2f}" if sp is not None else ""))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
