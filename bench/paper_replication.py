"""The papers' comparisons, replicated on CXR-Phantom: writes docs/RESULTS.md and docs/img/results_*.png.

Every method trains under the same budget (same steps, batch, image size, data, LM and eta table;
only the loss differs), 3 seeds each, and is evaluated on the phantom's test split with
`medclr eval` (CheX5 zero-shot AUC/ACC, MS-CXR-format grounding CNR/mIoU, box-sentence
retrieval Recall/MedR). Then the papers' figures:

* the eta trade-off of the debiasing paper's Fig. 3 (constant-eta DCL against eta, with InfoNCE,
  DCL-eta_LM and the DCL-eta_True oracle as references);
* the class-imbalance sweep of its Fig. 2: the training split with every non-normal study kept
  with probability r (the phantom's CIFAR10-r), the true class probabilities recomputed;
* NUCLR's learned popularity zeta against the true class frequency (its Fig. 5, as a Spearman
  correlation);
* eta_LM against the true class probability (`medclr lm calibrate`).

Each run's output is cached under WORK (a killed replication resumes where it stopped; a run
interrupted mid-training is retrained). One JSON line per run on stdout.

    python bench/paper_replication.py --quick            # 2-core CPU, under an hour
    python bench/paper_replication.py --work /data/rep   # full preset, sized for one GPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from argparse import Namespace
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from medclr.app.demo import plan as demo_plan  # noqa: E402  (the demo's data steps: phantom, manifest, LM, eta)
from medclr.cli import main as medclr_main  # noqa: E402
from medclr.evaluation.report import SUMMARY_KEYS  # noqa: E402
from medclr.phantom.vocab import EVAL_PER_CLASS  # noqa: E402  (the evaluation sets: the test split)

# label -> (training config, extra overrides). Constant-eta DCL labels carry their eta for the curve.
METHODS = {
    "InfoNCE": ("infonce", []),
    "DCL eta=0.01": ("dcl", ["loss.eta=0.01"]),
    "DCL eta=0.05": ("dcl", ["loss.eta=0.05"]),
    "DCL eta=0.1": ("dcl", ["loss.eta=0.1"]),
    "DCL eta=0.2": ("dcl", ["loss.eta=0.2"]),
    "DCL-eta_LM": ("dcl_lm", []),
    "DCL-eta_True": ("dcl_true", []),
    "SogCLR": ("sogclr", []),
    "NUCLR": ("nuclr", []),
    "DeCL": ("decl", []),
    "t-InfoNCE": ("t_infonce", []),
}
DCL_ETAS = {"DCL eta=0.01": 0.01, "DCL eta=0.05": 0.05, "DCL eta=0.1": 0.1, "DCL eta=0.2": 0.2}

PRESETS = {
    # 2-core CPU: the cpu_small preset's model at 80 px, batch 32 (~0.5 s a step), a shared disk cache
    # of the resized images; 150 steps (2 epochs) per run keeps 37 runs within the hour.
    "quick": {"n": 3000, "seeds": [0, 1, 2], "steps": 150, "sweep_r": [0.3, 0.1], "sweep_methods": ["InfoNCE", "DCL-eta_LM"],
              "methods": list(METHODS), "train": ["preset=cpu_small", "train.batch_size=32", "data.resize=90", "data.crop=80",
                                                  "data.cache=disk", "data.cache_dir={work}/image_cache"],
              "eval": ["--tasks", "zeroshot,grounding,retrieval", "--n-boot", "200", "--no-figures"]},
    # One GPU: the gpu_small preset (the cpu_small model with the negation-aware recipe, LSE+NL head on an
    # 8x8 grid), the setting measured to learn grounding and retrieval on the phantom (docs/training.md:
    # CNR 1.39, Recall 0.19 over 3 seeds at 2,500 steps where 200 steps stay at the controls). Three such
    # runs side by side took 4.4 min of training on one H100; one run alone takes no longer (not timed
    # alone), so the 33 method runs, one after another, take at most ~2.5 h and the 60 sweep runs ~4.5 h.
    "full": {"n": 3000, "seeds": [0, 1, 2], "steps": 2500, "sweep_r": [0.5, 0.2, 0.1, 0.05],
             "sweep_methods": ["InfoNCE", "DCL eta=0.1", "DCL-eta_LM", "DCL-eta_True", "NUCLR"], "methods": list(METHODS),
             "train": ["preset=gpu_small", "log.every=50", "ckpt.every=2500", "val.every=null"],
             "eval": ["--tasks", "zeroshot,grounding,retrieval", "--n-boot", "1000", "--no-figures"]},
}
METRICS = list(SUMMARY_KEYS)
READING_MARK = "<!-- reading: kept when the script rewrites this file -->"


def run_cli(argv: list[str]) -> None:
    code = medclr_main(argv)
    if code != 0:
        raise SystemExit(f"`medclr {' '.join(argv[:2])}` failed (exit {code})")


def prepare_data(work: Path, n: int, seed: int) -> None:
    """Phantom -> manifest -> domain LM -> eta table, as `medclr demo` builds them (cached)."""
    for step in demo_plan(work, Namespace(n=n, seed=seed, eval_per_class=EVAL_PER_CLASS, preset="cpu_small"))[:4]:
        if not step.output.exists():
            print(f"== {step.name}", file=sys.stderr, flush=True)
            run_cli(step.argv)


def imbalanced_manifest(work: Path, r: float, seed: int) -> Path:
    """Training split with each non-normal study kept with probability r; class probabilities recomputed."""
    from medclr.data.manifest import read_manifest, write_manifest

    out = work / f"manifest_r{r:g}.parquet"
    if out.exists():
        return out
    df = read_manifest(work / "manifest.parquet")
    rng = np.random.default_rng(seed)
    train = df["split"] == "train"
    drop = train & (df["latent_class"] != "normal") & (rng.random(len(df)) >= r)
    kept = df[~drop].copy()
    tr = kept["split"] == "train"
    freq = kept.loc[tr, "latent_class"].value_counts(normalize=True)
    kept.loc[tr, "latent_class_prob"] = kept.loc[tr, "latent_class"].map(freq).to_numpy()
    write_manifest(kept, out, df.attrs["root"])
    return out


def train_and_eval(work: Path, run: Path, label: str, seed: int, manifest: Path, cfg: dict) -> dict:
    """Train one method/seed (skipped when its metrics exist) and return its summary row."""
    metrics = run / "eval" / "metrics.json"
    start = time.perf_counter()
    if not metrics.exists():
        if not (run / "model.safetensors").exists():
            shutil.rmtree(run, ignore_errors=True)  # a half-trained run is retrained from scratch
            config, extra = METHODS[label]
            run_cli(["train", "--config", config, *[o.format(work=work) for o in cfg["train"]], f"train.max_steps={cfg['steps']}",
                     "train.max_minutes=null", "log.progress=false", f"seed={seed}", f"data.manifest={manifest}",
                     f"data.eta={work / 'eta.parquet'}", f"model.text={work / 'lm'}", f"out={run}", *extra,
                     *(["loss.freeze_zeta_epochs=0.25"] if config == "nuclr" else [])])
        run_cli(["eval", "--checkpoint", str(run), "--data", str(work / "manifest.parquet"), "--out", str(run / "eval"),
                 "--seed", str(seed), *cfg["eval"]])
    timing = run / "seconds.txt"  # the run's own train + eval time, kept for reruns that reuse it
    if not timing.exists():
        timing.write_text(f"{time.perf_counter() - start:.1f}\n")
    result = json.loads(metrics.read_text())
    summary, per_class = result["summary"], result.get("zeroshot", {}).get("per_class", {})
    row = {"method": label, "seed": seed, **{m: summary.get(m) for m in METRICS},
           **{f"AUC {c}": v.get("AUC") for c, v in per_class.items()}, "seconds": float(timing.read_text())}
    print(json.dumps(row), flush=True)
    return row


def nuclr_popularity(work: Path, runs: list[Path]) -> dict:
    """Spearman of NUCLR's learned zeta (per training sample) with log true class frequency."""
    from safetensors.numpy import load_file
    from scipy.stats import spearmanr

    from medclr.data.manifest import read_manifest

    truth = read_manifest(work / "manifest.parquet").set_index("index")["latent_class_prob"]
    out, points = {}, None
    for run in runs:
        state = load_file(str(run / "loss_state.safetensors"))
        rho = np.log(truth.loc[state["sample_manifest_index"]].to_numpy(dtype=np.float64))
        for m in ("txt", "img"):
            zeta = state[f"zeta_{m}"].astype(np.float64)
            out.setdefault(m, []).append(float(spearmanr(zeta, rho)[0]))
        if points is None:
            points = (rho, state["zeta_txt"].astype(np.float64))
    return {"spearman": {m: (float(np.mean(v)), float(np.std(v))) for m, v in out.items()}, "points": points}


def eta_calibration(work: Path) -> dict:
    out = work / "calibration"
    if not (out / "calibration.json").exists():
        run_cli(["lm", "calibrate", "--manifest", str(work / "manifest.parquet"), "--eta", str(work / "eta.parquet"),
                 "--out", str(out)])
    return json.loads((out / "calibration.json").read_text())


def count_test_positives(work: Path) -> dict[str, int]:
    """CheX5 positives per class in the phantom's test split (how much a per-class AUC can be trusted)."""
    from medclr.data.labels import CHEX5
    from medclr.data.manifest import read_manifest

    df = read_manifest(work / "manifest.parquet")
    test = df[df["split"] == "test"]
    return {c: int((test[c] == 1).sum()) for c in CHEX5}


# --------------------------------------------------------------------------- plots and report


def mean_sd(rows: pd.DataFrame) -> pd.DataFrame:
    g = rows.groupby("method", sort=False)[METRICS]
    return g.mean().join(g.std(ddof=1), rsuffix="_sd").assign(n=g.size())


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def plot_eta_tradeoff(table: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    etas = [e for lab, e in DCL_ETAS.items() if lab in table.index]
    for ax, m in zip(axes, ["AUC", "CNR", "Recall"]):
        dcl = table.loc[[lab for lab in DCL_ETAS if lab in table.index]]
        ax.errorbar(etas, dcl[m], yerr=dcl[f"{m}_sd"], marker="o", capsize=3, label="DCL, constant eta")
        for lab, color, ls in (("InfoNCE", "k", "--"), ("DCL-eta_LM", "C1", "-"), ("DCL-eta_True", "C2", ":")):
            if lab in table.index:
                ax.axhline(table.loc[lab, m], color=color, ls=ls, label=lab)
        if etas:
            ax.set_xscale("log")
        ax.set_xlabel("eta (class prior of a negative)")
        ax.set_title(m)
    axes[0].legend(fontsize=7)
    save(fig, path)


def plot_imbalance(sweep: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, m in zip(axes, ["AUC", "Recall"]):
        for lab, g in sweep.groupby("method", sort=False):
            g = g.sort_values("r")
            ax.plot(g["r"], g[m], marker="o", label=lab)
        ax.set_xscale("log")
        ax.set_xlabel("r (fraction of non-normal training studies kept)")
        ax.set_title(m)
    axes[0].legend(fontsize=7)
    save(fig, path)


def plot_popularity(points: tuple[np.ndarray, np.ndarray], rho: float, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 3.4))
    ax.scatter(points[0], points[1], s=4, alpha=0.4)
    ax.set_xlabel("log true class frequency of the training pair")
    ax.set_ylabel("learned zeta (text side)")
    ax.set_title(f"NUCLR popularity, Spearman {rho:+.2f}", fontsize=9)
    save(fig, path)


def fmt(table: pd.DataFrame, m: str, label: str) -> str:
    v, sd = table.loc[label, m], table.loc[label, f"{m}_sd"]
    digits = 1 if m == "MedR" else 3
    return f"{v:.{digits}f} ± {sd:.{digits}f}" if np.isfinite(sd) else f"{v:.{digits}f}"


def write_results(path: Path, preset: str, cfg: dict, table: pd.DataFrame, per_class: pd.DataFrame,
                  positives: dict[str, int], sweep: pd.DataFrame, pop: dict | None, calib: dict, minutes: float) -> None:
    old = path.read_text() if path.exists() else ""
    reading = old.split(READING_MARK, 1)[1] if READING_MARK in old else "\n## Reading\n\n(not written yet)\n"
    batch = next(o.split("=")[1] for o in cfg["train"] if o.startswith("train.batch_size="))
    lines = ["# Results: the papers' comparisons on CXR-Phantom", "",
             f"Produced by `python bench/paper_replication.py {'--quick' if preset == 'quick' else ''}`".rstrip() +
             f" (preset `{preset}`: {cfg['n']} phantom studies, {cfg['steps']} steps of batch {batch} per run, "
             f"seeds {cfg['seeds']}, every method under the same budget; the {len(table.index) * len(cfg['seeds'])} "
             f"runs and {len(sweep)} sweep rows took {minutes:.0f} min of train + eval on this machine). "
             "Test split of the phantom; mean ± sd over seeds. The evaluation protocol is docs/evaluation.md's.", "",
             "## Table 1 shape", "",
             "| Method | CheX5 AUC | ACC | CNR | mIoU | Recall | MedR |", "|---|---|---|---|---|---|---|"]
    for label in table.index:
        lines.append(f"| {label} | " + " | ".join(fmt(table, m, label) for m in METRICS) + " |")
    classes = [c for c in per_class.columns]
    lines += ["", "Zero-shot AUC per CheX5 class (mean ± sd over seeds; n positives in the test split: "
              + ", ".join(f"{c} {n}" for c, n in positives.items()) + "):", "",
              "| Method | " + " | ".join(c.removeprefix("AUC ") for c in classes) + " |", "|---|" + "---|" * len(classes)]
    for label, g in per_class.groupby(level=0, sort=False):
        cells = [f"{g[c].mean():.2f} ± {g[c].std(ddof=1):.2f}" if len(g) > 1 else f"{g[c].mean():.2f}" for c in classes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "![eta trade-off](img/results_eta_tradeoff.png)", "",
              "*The debiasing paper's Fig. 3 on the phantom: constant-eta DCL against eta; lines: InfoNCE, "
              "DCL-eta_LM, the DCL-eta_True oracle.*", "", "## Class imbalance (the paper's Fig. 2)", "",
              "| r | " + " | ".join(sweep["method"].unique()) + " |", "|---|" + "---|" * sweep["method"].nunique()]
    for r, g in sweep.groupby("r", sort=False):
        cells = [f"{g.loc[g['method'] == lab, 'AUC'].mean():.3f} / {g.loc[g['method'] == lab, 'Recall'].mean():.3f}"
                 for lab in sweep["method"].unique()]
        lines.append(f"| {r:g} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: CheX5 AUC / Recall (seed 0; r = 1 is the full training split).", "",
              "![imbalance](img/results_imbalance.png)", ""]
    if pop:
        (mt, st), (mi, si) = pop["spearman"]["txt"], pop["spearman"]["img"]
        lines += ["## NUCLR popularity against the true class frequency (its Fig. 5)", "",
                  f"Spearman(zeta, log true class frequency) over the training pairs: text side {mt:+.3f} ± {st:.3f}, "
                  f"image side {mi:+.3f} ± {si:.3f} (mean ± sd over seeds).", "",
                  "![popularity](img/results_nuclr_popularity.png)", ""]
    s, st = calib.get("sentence", {}), calib.get("study", {})
    lines += ["## eta_LM against the true class probability", "",
              f"Spearman(log p_LM, log rho): per sentence {s.get('spearman_logp_logrho', float('nan')):+.3f}, "
              f"per study {st.get('spearman_logp_logrho', float('nan')):+.3f} (`medclr lm calibrate`; "
              "docs/lm.md explains the two levels).", "", "![eta_LM calibration](img/results_eta_lm.png)", "",
              READING_MARK]
    path.write_text("\n".join(lines) + reading)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the 2-core CPU preset (under an hour)")
    ap.add_argument("--work", type=Path, default=None, help="cache of data and runs (default /tmp/medclr_replication_PRESET)")
    ap.add_argument("--docs", type=Path, default=REPO / "docs", help="where RESULTS.md and img/ go")
    ap.add_argument("--methods", default=None, help="comma-separated subset of: " + ", ".join(METHODS))
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (overrides the preset)")
    args = ap.parse_args()
    preset = "quick" if args.quick else "full"
    cfg = dict(PRESETS[preset])
    if args.methods:
        cfg["methods"] = [m.strip() for m in args.methods.split(",")]
        unknown = [m for m in cfg["methods"] if m not in METHODS]
        if unknown:
            ap.error(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
        cfg["sweep_methods"] = [m for m in cfg["sweep_methods"] if m in cfg["methods"]]
    if args.seeds:
        cfg["seeds"] = [int(s) for s in args.seeds.split(",")]
    if args.steps:
        cfg["steps"] = args.steps
    work = args.work or Path(f"/tmp/medclr_replication_{preset}")
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    prepare_data(work, cfg["n"], seed=0)

    rows = []
    for label in cfg["methods"]:
        for seed in cfg["seeds"]:
            slug = label.replace(" ", "_").replace("=", "")
            rows.append(train_and_eval(work, work / "runs" / f"{slug}_s{seed}", label, seed, work / "manifest.parquet", cfg))
    rows = pd.DataFrame(rows)
    table = mean_sd(rows)

    sweep = [dict(r=1.0, **row) for row in rows[rows["seed"] == cfg["seeds"][0]].to_dict("records")
             if row["method"] in cfg["sweep_methods"]]
    for r in cfg["sweep_r"]:
        manifest = imbalanced_manifest(work, r, seed=0)
        for label in cfg["sweep_methods"]:
            slug = label.replace(" ", "_").replace("=", "")
            row = train_and_eval(work, work / "sweep" / f"{slug}_r{r:g}", label, cfg["seeds"][0], manifest, cfg)
            sweep.append(dict(r=r, **row))
    sweep = pd.DataFrame(sweep)

    nuclr_runs = [work / "runs" / f"NUCLR_s{s}" for s in cfg["seeds"] if (work / "runs" / f"NUCLR_s{s}").exists()]
    pop = nuclr_popularity(work, nuclr_runs) if nuclr_runs else None
    calib = eta_calibration(work)

    img = args.docs / "img"
    img.mkdir(parents=True, exist_ok=True)
    plot_eta_tradeoff(table, img / "results_eta_tradeoff.png")
    plot_imbalance(sweep, img / "results_imbalance.png")
    if pop:
        plot_popularity(pop["points"], pop["spearman"]["txt"][0], img / "results_nuclr_popularity.png")
    shutil.copyfile(work / "calibration" / "calibration.png", img / "results_eta_lm.png")
    rows.to_csv(work / "runs.csv", index=False)
    sweep.to_csv(work / "sweep.csv", index=False)
    minutes = (rows["seconds"].sum() + sweep.loc[sweep["r"] != 1.0, "seconds"].sum()) / 60
    per_class = rows.set_index("method")[[c for c in rows.columns if c.startswith("AUC ")]]
    write_results(args.docs / "RESULTS.md", preset, cfg, table, per_class, count_test_positives(work), sweep, pop, calib, minutes)
    print(json.dumps({"results": str(args.docs / "RESULTS.md"), "runs": len(rows), "sweep_runs": len(sweep),
                      "minutes": round(minutes, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
