"""Check every eta variant against the two quantities it is read as, where both are known (CXR-Phantom).

A training step pairs an image with one sentence of its report; DCL-eta's eta(x) of a text anchor x
estimates rho(c_x), the chance that a negative drawn from the data is a false negative of x. Two ground-truth
quantities are measured per training (report, sentence) pair, as training draws them
(``medclr.phantom.sentence_keys``), and every variant is reported against both, as measured (no variant is
fitted to either):

* ``q``, DCL's false-negative rate (the oracle, DCL-eta_True): the probability that a negative image, drawn as
  training draws studies, is one the sentence is true of (``false_negative_rate``: the sentence's
  ground-truth key read against each study's latent class and its own report's keys). Reported raw: q can
  exceed eta_max (~0.8 for "No cardiomegaly."), which no clipped eta reaches;
* ``rho_sent``: how often the sentence's ground-truth key occurs among the (report, sentence) pairs (every
  report once per epoch, one sentence uniformly, unless ``sampling`` says otherwise). A different quantity:
  "No cardiomegaly." is a few per cent of the pairs but true of most images.

Per variant and oracle (``y``: q or rho_sent, over the drawn pairs):

* ``mean_ratio``: E[eta] / E[y] (the scale: 1 = right on average);
* ``spearman``: Spearman(eta, y) over the pairs (the ranking; the same for every a, k with k > 0,
  since eta is monotone in log p, except for ties made by the eta_max clip or k = 0);
* ``median_abs_log_ratio``: the pair-weighted median of |log eta - log y| (1 = a factor e);
* ``misspecification``: E |1/(1 - eta) - 1/(1 - y)|, the eta term of the paper's Proposition 1 (infinite
  where q = 1).

Variants: ``table`` (the table's own eta, what ``medclr lm score`` wrote), ``paper`` (a = 0.2, k = 0.35),
the label-free calibrations of ``medclr.lm.eta_fit`` recomputed here (``rule``: medclr's DCL-eta_rule, the
isotonic map of the rule-read meaning's pooled likelihood; ``sentence_fit``: a * p^k on the sentence's PLL,
fitted to the same rule-key frequency), and the constants 0.05 and 0.1.

Outputs in DIR: ``calibration.json``; ``calibration.png``: the reliability plot (pairs binned by eta, the mean
q, left, and the mean rho_sent, right, of each bin against its mean eta, for table, paper and rule);
``per_key.csv`` (one row per ground-truth key: q, rho, pairs, median eta). The manifest's ``latent_class``
is required (``--ground-truth`` joins it); with the study's ``latent_class_prob`` (the study prior, another
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
from medclr.lm.eta_fit import eta_of_table, fit_eta_meaning, fit_eta_sentence

log = logging.getLogger(__name__)

GROUND_TRUTH = ("latent_class", "latent_class_prob")
QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)
RELIABILITY_BINS = 10
ORACLES = {"q": "q", "rho_sent": "rho"}  # oracle name in the json -> its column in sentence_pairs
STAT_KEYS = ("mean_ratio", "spearman", "median_abs_log_ratio", "misspecification")


# How `lm calibrate --ground-truth` joins a phantom's table (medclr.data.groundtruth.attach_ground_truth):
# latent_class / latent_class_prob on dicom_id, else study_id; rows without ground truth get NaN, but some must match.
GROUND_TRUTH_JOIN = {"columns": GROUND_TRUTH, "keys": ("dicom_id", "study_id"), "require": "any"}


def misspecification(eta, rho, weights=None) -> float:
    """E |1/(1 - eta) - 1/(1 - rho)| (Proposition 1's eta term), optionally weighted."""
    eta, rho = np.asarray(eta, dtype=np.float64), np.asarray(rho, dtype=np.float64)
    with np.errstate(divide="ignore"):  # rho = 1 (q of a statement true of every study): infinite, as it is
        return float(np.average(np.abs(1.0 / (1.0 - eta) - 1.0 / (1.0 - rho)), weights=weights))


def weighted_median(x, w) -> float:
    order = np.argsort(x)
    x, cw = np.asarray(x)[order], np.cumsum(np.asarray(w, dtype=np.float64)[order])
    return float(x[np.searchsorted(cw, 0.5 * cw[-1])])


def _latent_classes(manifest: pd.DataFrame, index, split: str) -> list[str]:
    """The ``latent_class`` of the manifest rows ``index`` (manifest_sentences' ``index``); one MedclrError line
    when the column or a value is missing."""
    if "latent_class" not in manifest:
        raise MedclrError("manifest has no 'latent_class' column, which q needs (a CXR-Phantom manifest has it; "
                          "or pass --ground-truth phantom/phantom_ground_truth.parquet)")
    idx = manifest["index"] if "index" in manifest else pd.Series(np.arange(len(manifest)), index=manifest.index)
    cls = pd.Series(manifest["latent_class"].to_numpy(), index=idx.to_numpy()).reindex(index)
    if cls.isna().any():
        raise MedclrError(f"{int(cls.isna().sum())} of the {len(cls)} manifest rows of split '{split}' with "
                          "sentences have no latent_class")
    return [str(c) for c in cls]


def sentence_pairs(manifest: pd.DataFrame, eta_table: pd.DataFrame, norm: str, split: str,
                   sampling: dict | None = None) -> pd.DataFrame:
    """One row per (report, sentence) of the ``split`` rows: index, sentence_hash, pll, n_scored, logp,
    weight (its draw probability under ``sampling``, uniform by default), key (ground truth), rho (rho_sent),
    q (DCL's false-negative rate of the sentence, studies drawn as ``sampling``'s study_sampling and
    study_balance draw them). Pairs without a PLL in the table are left out after q and rho are counted."""
    from medclr.data.pairs import pair_probabilities, study_weights
    from medclr.lm.eta_fit import SAMPLING_DEFAULTS
    from medclr.phantom.sentence_keys import false_negative_rate, rho_sent, sentence_key

    st = manifest_sentences(manifest, split)
    rows = [g for _, g in st.groupby("index", sort=False)]
    sentences = [g["sentence"].tolist() for g in rows]
    classes = _latent_classes(manifest, [int(g["index"].iloc[0]) for g in rows], split)
    out = pd.concat(rows, ignore_index=True)
    sampling = {**SAMPLING_DEFAULTS, **(sampling or {})}
    out["weight"] = np.concatenate(pair_probabilities(sentences, **sampling))
    out["rho"] = np.concatenate(rho_sent(sentences, **sampling))
    keys = [[sentence_key(s) for s in row] for row in sentences]
    out["key"] = [k for row in keys for k in row]
    study = study_weights(sentences, sampling["study_sampling"], sampling["study_balance"])
    study = np.ones(len(rows)) if study is None else np.asarray(study, dtype=np.float64)
    q = false_negative_rate(out["key"], classes, [frozenset(row) for row in keys], study / study.sum())
    out["q"] = out["key"].map(q).astype(np.float64)
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


def _spearman(x, y) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y)[0]) if np.ptp(x) > 0 and np.ptp(y) > 0 else float("nan")


def oracle_stats(eta, y, w) -> dict:
    """One eta against one oracle ``y`` over pairs of draw weight ``w`` (module docstring: the four numbers)."""
    def ln(v):
        return np.log(np.maximum(v, 1e-300))  # q = 0 (a statement true of no study): a huge ratio, not a NaN

    return {"mean_ratio": float(np.average(eta, weights=w) / np.average(y, weights=w)),
            "spearman": _spearman(eta, y),
            "median_abs_log_ratio": weighted_median(np.abs(ln(eta) - ln(y)), w),
            "misspecification": misspecification(eta, y, w)}


def variant_stats(p: pd.DataFrame, eta: np.ndarray, **params) -> dict:
    """One eta (aligned with the pairs ``p``) against q and against rho_sent, as measured."""
    w = p["weight"].to_numpy()
    return {**params,
            "eta_quantiles": {f"{x:g}": float(np.quantile(eta, x)) for x in QUANTILES},
            "mean_eta": float(np.average(eta, weights=w)),
            **{name: oracle_stats(eta, p[col].to_numpy(), w) for name, col in ORACLES.items()}}


def reliability(eta, p: pd.DataFrame, bins: int = RELIABILITY_BINS) -> pd.DataFrame:
    """Pairs binned by eta (bins of equal pair weight): the weighted mean eta, q and rho_sent of each bin and
    its weight."""
    w = p["weight"].to_numpy()
    order = np.argsort(eta, kind="stable")
    b = np.minimum((np.cumsum(w[order]) / w.sum() * bins).astype(int), bins - 1)
    values = pd.DataFrame({"eta": np.asarray(eta)[order],
                           **{name: p[col].to_numpy()[order] for name, col in ORACLES.items()}})
    g = values.mul(w[order], axis=0).groupby(b)
    weight = pd.Series(w[order]).groupby(b).sum()
    return g.sum().div(weight, axis=0).assign(weight=weight)


def calibrate(manifest: pd.DataFrame, eta_table: pd.DataFrame, out_dir: str | os.PathLike, *,
              eta_meta: dict | None = None, norm: str | None = None, fit_split: str = "train",
              sampling: dict | None = None) -> dict:
    """Write calibration.json / calibration.png / per_key.csv to ``out_dir``; return the json dict.
    ``sampling``: how training draws pairs (``medclr.data.pairs.pair_probabilities`` keywords); default: the
    eta table's own (its fit's ``sampling``), else uniform."""
    meta = eta_meta or {}
    norm = norm or meta.get("norm", "sum")
    eta_max = float(meta.get("eta_max", DEFAULT_ETA_MAX))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if sampling is None:
        sampling = meta.get("eta_params", {}).get("fit", {}).get("sampling")
    p = sentence_pairs(manifest, eta_table, norm, fit_split, sampling)
    x, q, rho, w = p["logp"].to_numpy(), p["q"].to_numpy(), p["rho"].to_numpy(), p["weight"].to_numpy()

    def power(a, k):
        return eta_from_pll(p["pll"], p["n_scored"], a=a, k=k, norm=norm, eta_max=eta_max)

    table_eta = eta_table.drop_duplicates("sentence_hash").set_index("sentence_hash")["eta"]
    rule = fit_eta_meaning(eta_table, manifest, split=fit_split, norm=norm, eta_max=eta_max,
                           sampling=sampling)  # label-free: the words only
    sentence = fit_eta_sentence(eta_table, manifest, split=fit_split, norm=norm, sampling=sampling)
    rule_eta = pd.Series(eta_of_table(eta_table, {"source": "meaning", "fit": rule}, norm=norm,
                                      eta_max=eta_max)[0], index=eta_table["sentence_hash"].to_numpy())
    rule_eta = rule_eta[~rule_eta.index.duplicated()].reindex(p["sentence_hash"]).to_numpy()
    result: dict = {
        "norm": norm, "split": fit_split, "sampling": sampling, "eta_max": eta_max,
        "oracles": {"q": "DCL's false-negative rate of the sentence (the DCL-eta_True oracle): the probability that "
                         "a negative image, drawn as training draws the split's studies, is one the sentence is true "
                         "of (medclr.phantom.sentence_keys.false_negative_rate); raw, not capped at eta_max",
                    "rho_sent": "frequency of the sentence's ground-truth key (medclr.phantom.sentence_keys) among the "
                                "split's (report, sentence) pairs as training draws them"},
        "n_pairs": int(len(p)), "n_keys": int(p["key"].nunique()),
        "mean_q": float(np.average(q, weights=w)), "mean_rho": float(np.average(rho, weights=w)),
        "spearman_q_rho": _spearman(q, rho),
        "share_q_above_eta_max": float(np.average(q > eta_max, weights=w)),
        "eta_table": {k: meta.get(k) for k in ("model", "pll_variant", "a", "k", "eta_max")},
        "spearman_logp_q": _spearman(x, q), "spearman_logp_rho": _spearman(x, rho),
        "rule_fit": rule,
        "sentence_fit": sentence,
    }
    etas = {"table": table_eta.reindex(p["sentence_hash"]).to_numpy(dtype=np.float64),
            "paper": power(DEFAULT_A, DEFAULT_K), "rule": rule_eta,
            "sentence_fit": power(sentence["a"], sentence["k"]),
            "constant 0.05": np.full(len(p), 0.05), "constant 0.1": np.full(len(p), 0.1)}
    params = {"table": {k: meta.get(k) for k in ("a", "k")} | {"source": meta.get("eta_params", {}).get("source")},
              "paper": {"a": DEFAULT_A, "k": DEFAULT_K}, "sentence_fit": {"a": sentence["a"], "k": sentence["k"]}}
    result["variants"] = {name: variant_stats(p, eta, **params.get(name, {})) for name, eta in etas.items()}
    if all(c in manifest for c in GROUND_TRUTH):
        study = p.groupby("index").agg(pll=("pll", "sum"), n_scored=("n_scored", "sum"))
        prior = pd.to_numeric(manifest.set_index("index")["latent_class_prob"], errors="coerce").reindex(study.index)
        ok = prior.notna().to_numpy()
        if ok.sum() > 2:
            result["study"] = {"target": "latent_class_prob (the study's class prior)", "n_studies": int(ok.sum()),
                               "spearman_logp_prior": _spearman(log_p(study["pll"], study["n_scored"], norm)[ok],
                                                                prior[ok])}
    log.info("over %d pairs (%d keys): E[q] %.4f, E[rho_sent] %.4f, Spearman(q, rho_sent) %+.3f; q > eta_max %.2f "
             "of the pairs", len(p), result["n_keys"], result["mean_q"], result["mean_rho"], result["spearman_q_rho"],
             result["share_q_above_eta_max"])
    for name, v in result["variants"].items():
        for oracle in ORACLES:
            s = v[oracle]
            log.info("%-14s vs %-8s E[eta]/E[y] %6.2f  Spearman %+.3f  median |log eta/y| %.2f  "
                     "E|1/(1-eta)-1/(1-y)| %.4f", name, oracle, s["mean_ratio"], s["spearman"],
                     s["median_abs_log_ratio"], s["misspecification"])
    p["eta_table"] = etas["table"]
    per_key = p.groupby("key").agg(q=("q", "first"), rho=("rho", "first"), pairs=("weight", "size"),
                                   weight=("weight", "sum"), eta_median=("eta_table", "median"))
    per_key.sort_values("weight", ascending=False).to_csv(out / "per_key.csv")
    curves = {name: reliability(etas[name], p) for name in ("table", "paper", "rule")}
    result["reliability"] = {name: c.round(6).to_dict(orient="list") for name, c in curves.items()}
    _plot(curves, result, out / "calibration.png")
    (out / "calibration.json").write_text(json.dumps(result, indent=2) + "\n")
    v = result["variants"]["table"]
    log.info("eta of the table over %d pairs: against q E[eta]/E[q] %.2f, Spearman %.3f; against rho_sent "
             "E[eta]/E[rho] %.2f, Spearman %.3f; wrote %s", len(p), v["q"]["mean_ratio"], v["q"]["spearman"],
             v["rho_sent"]["mean_ratio"], v["rho_sent"]["spearman"], out)
    return result


def _plot(curves: dict, result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.8), dpi=90)
    labels = {"table": "this table's eta", "paper": "paper's a=0.2, k=0.35", "rule": "DCL-eta_rule"}
    values = np.concatenate([c[col].to_numpy() for c in curves.values() for col in ("eta", *ORACLES)])
    pos = values[values > 0]
    lo, hi = (max(pos.min() * 0.7, 1e-4), pos.max() * 1.4) if pos.size else (1e-4, 1.0)
    for ax, oracle in zip(axes, ORACLES):
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label=f"eta = {oracle}")
        for (name, c), marker in zip(curves.items(), "os^"):
            s = result["variants"][name][oracle]
            ax.plot(np.maximum(c["eta"], lo), np.maximum(c[oracle], lo), marker + "-", ms=5,
                    label=f"{labels[name]}: E[eta]/E[{oracle}] {s['mean_ratio']:.2f}, "
                          f"med |log| {s['median_abs_log_ratio']:.2f}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"mean eta in the bin ({RELIABILITY_BINS} bins of equal pair weight)")
        ax.set_ylabel(f"mean {oracle} in the bin")
        ax.legend(loc="lower right", fontsize=7)
    axes[0].set_title(f"against q, DCL's false-negative rate (E[q] {result['mean_q']:.3f})")
    axes[1].set_title(f"against rho_sent, the key's share of pairs (E[rho_sent] {result['mean_rho']:.3f})")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
