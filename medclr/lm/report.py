"""Describe an eta table: does the LM rank frequent sentences above rare ones? (``medclr lm report``).

Writes to DIR:

* ``lm_pll_distribution.png``: left, the PLL distribution over distinct
  sentences and over occurrences (a frequent sentence counts each time it
  appears, as in training), with eta on the top axis; right, PLL by how often
  the sentence occurs in the manifest, with the most frequent sentences listed;
* ``lm_report.json``: Spearman(PLL, log count), PLL by frequency band, the
  top and bottom sentences, and the rank of the most frequent sentence.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd

from medclr.errors import MedclrError

log = logging.getLogger(__name__)

BANDS = [(1, 1), (2, 4), (5, 19), (20, 99), (100, None)]


def _band_name(lo, hi):
    return f"{lo}" if lo == hi else (f">={lo}" if hi is None else f"{lo}-{hi}")


def describe(eta_table: pd.DataFrame, out_dir: str | os.PathLike, *, meta: dict | None = None,
             label_top: int = 6) -> dict:
    from scipy.stats import spearmanr

    t = eta_table[eta_table["count"] > 0].copy()
    if len(t) < 3:
        raise MedclrError("the eta table has fewer than 3 sentences with count > 0; score a manifest first")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t = t.sort_values("pll", ascending=False).reset_index(drop=True)
    t["rank"] = np.arange(1, len(t) + 1)
    bands = {}
    for lo, hi in BANDS:
        sel = (t["count"] >= lo) & (t["count"] <= (hi if hi is not None else np.inf))
        if sel.any():
            bands[_band_name(lo, hi)] = {
                "sentences": int(sel.sum()), "pll_median": float(t.loc[sel, "pll"].median()),
                "pll_per_token_median": float(t.loc[sel, "pll_per_token"].median()),
                "eta_median": float(t.loc[sel, "eta"].median()),
                "rank_percentile_median": float((t.loc[sel, "rank"] / len(t) * 100).median())}
    top_by_count = t.sort_values(["count", "pll"], ascending=[False, False]).head(10)
    cols = ["sentence", "count", "n_tokens", "pll", "pll_per_token", "eta", "rank"]
    result = {
        "model": (meta or {}).get("model"), "distinct_sentences": int(len(t)), "occurrences": int(t["count"].sum()),
        "spearman_pll_logcount": float(spearmanr(t["pll"], np.log(t["count"]))[0]),
        "spearman_pll_per_token_logcount": float(spearmanr(t["pll_per_token"], np.log(t["count"]))[0]),
        "by_count": bands,
        "most_frequent": top_by_count[cols].to_dict("records"),
        "highest_pll": t.head(10)[cols].to_dict("records"),
        "lowest_pll": t.tail(10)[cols].to_dict("records"),
    }
    _plot(t, out / "lm_pll_distribution.png", result, label_top, meta or {})
    (out / "lm_report.json").write_text(json.dumps(result, indent=2) + "\n")
    log.info("%d distinct sentences: Spearman(PLL, log count) = %.3f; wrote %s", len(t),
             result["spearman_pll_logcount"], out)
    return result


def _plot(t: pd.DataFrame, path: Path, result: dict, label_top: int, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), dpi=90)
    ax = axes[0]
    bins = np.linspace(float(t["pll"].min()), 0.0, 60)
    ax.hist(t["pll"], bins=bins, alpha=0.6, label=f"distinct sentences ({len(t):,})")
    ax.hist(t["pll"], bins=bins, weights=t["count"], alpha=0.5, label=f"occurrences ({int(t['count'].sum()):,})")
    ax.set_yscale("log")
    ax.set_xlabel("PLL (sum of log p over word pieces)")
    ax.set_ylabel("sentences")
    ax.set_title("PLL distribution")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[1]
    names, data = [], []
    for lo, hi in BANDS:
        sel = (t["count"] >= lo) & (t["count"] <= (hi if hi is not None else np.inf))
        if sel.any():
            names.append(f"{_band_name(lo, hi)}\n(n={int(sel.sum()):,})")
            data.append(t.loc[sel, "pll"].to_numpy())
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), names, fontsize=8)
    ax.set_xlabel("occurrences of the sentence in the manifest")
    ax.set_ylabel("PLL")
    ax.set_title(f"PLL by sentence frequency; Spearman(PLL, log count) {result['spearman_pll_logcount']:.2f}")
    lines = [f"{r['count']}x  PLL {r['pll']:.2f}  rank {r['rank']}/{len(t):,}  {r['sentence'][:38]}"
             for r in result["most_frequent"][:label_top]]
    a, k = meta.get("a"), meta.get("k")
    # eta of the same PLL on the right axis, where eta is a * p^k of it (not so for a meaning-calibrated table)
    if a is not None and k is not None and meta.get("norm", "sum") == "sum":
        a, k = float(a), float(k)
        right = ax.twinx()
        right.set_ylim(ax.get_ylim())
        ticks = [v for v in (-100, -50, -20, -10, -5, 0) if ax.get_ylim()[0] <= v <= ax.get_ylim()[1]]
        right.set_yticks(ticks, [f"{a * np.exp(k * v):.2g}" for v in ticks], fontsize=8)
        right.set_ylabel(f"eta = {a:g} * exp({k:g} * PLL)", fontsize=8)
    ax.text(0.30, 0.03, "most frequent:\n" + "\n".join(lines), transform=ax.transAxes, fontsize=6.5,
            family="monospace", va="bottom", bbox={"facecolor": "white", "alpha": 0.85, "lw": 0.3})
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
