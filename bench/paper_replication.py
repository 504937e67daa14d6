"""The papers' claims, tested on CXR-Phantom: writes docs/RESULTS.md and docs/img/results_*.png.

Every method trains through the LSE+NL head (the debiasing paper's setup) under the same budget (same
steps, batch, image size, data, LM and eta table; only the loss differs), and is evaluated on the
phantom's test split with `medclr eval` (CheX5 zero-shot AUC/ACC with the paper's prompts, MS-CXR-format
grounding CNR/mIoU, box-sentence retrieval Recall/MedR). InfoNCE is anchored on the text like DCL
(InfoNCE = DCL with eta = 0), so a difference between them isolates eta. Then:

* the claims, each as a paired difference over seeds with a Student-t 95 % CI and a verdict:
  DCL-eta_LM >= the best constant eta (AUC, CNR, mIoU, Recall); DCL-eta_True >= DCL-eta_LM >= InfoNCE;
  NUCLR >= SogCLR on retrieval; NUCLR's zeta rank-correlates with the true frequency of its sentence;
* how far eta moves the loss on a model that has learned: the mean per-pair |loss(DCL-eta_LM) -
  loss(InfoNCE)| on the InfoNCE run's batches (drawn as training draws them, and uniformly), with the
  InfoNCE batch loss there and the batches' false-negative floor;
* the eta trade-off of the debiasing paper's Fig. 3 (constant-eta DCL against eta);
* optionally the class-imbalance sweep of its Fig. 2 (--sweep-r);
* eta_LM against rho_sent, the class probability it estimates (`medclr lm calibrate`).

Presets (budgets where models learn: InfoNCE's batch loss falls below 3.0 at batch 64):

    python bench/paper_replication.py --preset cpu           # 2 cores: InfoNCE, DCL-eta_LM, DCL-eta_True, 1 seed, ~2.5 h
    python bench/paper_replication.py --preset gpu           # one GPU: 7 methods x 3 seeds side by side
    python bench/paper_replication.py --preset gpu --dry-run # the same pipeline at toy size, minutes on a CPU

Runs go `workers` at a time as `medclr` subprocesses (logs under WORK/logs). Each run's output is
cached under WORK: a killed replication resumes where it stopped (a run interrupted mid-training is
retrained). One JSON line per run on stdout, then one per claim.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from medclr.cli import main as medclr_main  # noqa: E402
from medclr.evaluation.report import SUMMARY_KEYS  # noqa: E402
from medclr.evaluation.seeds import paired_difference, pooled  # noqa: E402
from medclr.jobs.demo import plan as demo_plan  # noqa: E402  (the demo's data steps: phantom, manifest, LM, eta)
from medclr.phantom.vocab import EVAL_PER_CLASS  # noqa: E402  (the evaluation sets: the test split)

# label -> (training config, extra overrides). Constant-eta DCL labels carry their eta for the curve.
METHODS = {
    "InfoNCE": ("infonce", ["loss.anchor=text"]),
    "DCL eta=0.01": ("dcl", ["loss.eta=0.01"]),
    "DCL eta=0.05": ("dcl", ["loss.eta=0.05"]),
    "DCL eta=0.1": ("dcl", ["loss.eta=0.1"]),
    "DCL eta=0.2": ("dcl", ["loss.eta=0.2"]),
    "DCL-eta_LM": ("dcl_lm", []),
    "DCL-eta_True": ("dcl_true", []),
    "SogCLR": ("sogclr", []),
    "NUCLR": ("nuclr", []),
    # the two earlier forms of NUCLR's zeta: the uncentred step (the paper's), and zeta_txt keyed by the study
    "NUCLR (paper zeta step)": ("nuclr", ["loss.zeta_step=paper"]),
    "NUCLR (study zeta)": ("nuclr", ["loss.zeta_key=study", "loss.zeta_step=paper"]),
    "DeCL": ("decl", []),
    "t-InfoNCE": ("t_infonce", []),
}
DCL_ETAS = {"DCL eta=0.01": 0.01, "DCL eta=0.05": 0.05, "DCL eta=0.1": 0.1, "DCL eta=0.2": 0.2}
# The methods the papers' claims are about; DeCL and t-InfoNCE are baselines no claim names.
CLAIM_METHODS = [m for m in METHODS if m not in ("DeCL", "t-InfoNCE", "NUCLR (paper zeta step)", "NUCLR (study zeta)")]

PRESETS = {
    # 2 CPU cores: the cpu_zeroshot recipe (cpu_small's model: ResNet-18 to layer3 at 64 px, LSE+NL on an 8x8
    # grid; finding-balanced study draws, short forms, the rule hard-negative term) at batch 64 for its own
    # 1,000 steps, where InfoNCE's training-batch loss reaches ~3.0 (docs/RESULTS.md), the three methods that
    # test eta, one seed, one run at a time on both cores: ~45-50 minutes a run in float32, about 2.5 hours.
    "cpu": {"n": 3000, "eval_per_class": 250, "seeds": [0], "steps": 1000, "workers": 1, "threads": 2, "sweep_r": [],
            "sweep_methods": [], "sweep_seeds": [0], "methods": ["InfoNCE", "DCL-eta_LM", "DCL-eta_True"],
            "eta_sampling": ["--sentence-sampling", "findings", "--study-sampling", "findings", "--study-balance", "1"],
            "train": ["preset=cpu_zeroshot", "ckpt.every={steps}", "val.every=null", "data.cache=disk",
                      "data.cache_dir={work}/image_cache", "data.cache_workers=1"],
            "eval": ["--tasks", "zeroshot,grounding,retrieval", "--n-boot", "200", "--no-figures"]},
    # One GPU (sized for an H100 with 16 cores): the gpu_small recipe (docs/training.md: CNR 1.39, Recall
    # 0.19 over 3 seeds at 2,500 steps), 7 methods x 3 seeds, all 21 runs side by side (the models are
    # small: the GPU is fed by 21 processes at 1 loader thread each, the phantom's images cached once on
    # disk and shared). Not yet run on a GPU: its wall time is unmeasured.
    "gpu": {"n": 3000, "eval_per_class": 250, "seeds": [0, 1, 2], "steps": 2500, "workers": 21, "threads": 1,
            "sweep_r": [], "sweep_methods": ["InfoNCE", "DCL eta=0.1", "DCL-eta_LM", "DCL-eta_True", "NUCLR"],
            "sweep_seeds": [0, 1, 2],
            "methods": ["InfoNCE", "DCL eta=0.05", "DCL eta=0.1", "DCL-eta_LM", "DCL-eta_True", "SogCLR", "NUCLR"],
            "eta_sampling": ["--sentence-sampling", "findings"],
            "train": ["preset=gpu_small", "log.every=50", "ckpt.every={steps}", "val.every=null", "data.cache=disk",
                      "data.cache_dir={work}/image_cache", "data.num_workers=1"],
            "eval": ["--tasks", "zeroshot,grounding,retrieval", "--n-boot", "1000", "--no-figures"]},
}
# --dry-run: the preset's pipeline end to end at toy size (a 240-study phantom, 10 evaluation studies a
# class, 6 steps of batch 16 at 32 px on the CPU): it checks that every step runs, not what it measures.
DRY_RUN = {"n": 240, "eval_per_class": 10, "steps": 6, "workers": 2, "threads": 1,
           "extra_train": ["train.batch_size=16", "data.resize=36", "data.crop=32", "train.device=cpu"]}
METRICS = list(SUMMARY_KEYS)
DRAWS = ("sampler", "uniform")  # bench_eta_fit --draw: studies as training draws them, or uniformly
READING_MARK = "<!-- reading: kept when the script rewrites this file -->"


def run_cli(argv: list[str]) -> None:
    code = medclr_main(argv)
    if code != 0:
        raise SystemExit(f"`medclr {' '.join(argv[:2])}` failed (exit {code})")


def prepare_data(work: Path, n: int, seed: int, eval_per_class: int = EVAL_PER_CLASS) -> None:
    """Phantom -> manifest -> domain LM -> eta table, as `medclr demo` builds them (cached)."""
    for step in demo_plan(work, Namespace(n=n, seed=seed, eval_per_class=eval_per_class, preset="cpu_small"))[:4]:
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


# One process per run: train then eval, so torch and transformers are imported once a run, not twice.
RUN_COMMANDS = """import json, sys
from medclr.cli import main
for argv in json.loads(sys.argv[1]):
    code = main(argv)
    if code:
        sys.exit(f"`medclr {argv[0]}` failed (exit {code})")
"""


def medclr_process(commands: list[list[str]], log: Path, threads: int) -> None:
    """`medclr ARGV` for each ARGV in order, in one process of its own (runs go side by side), output to
    LOG; one line on failure."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(log, "w") as fh:
        code = subprocess.run([sys.executable, "-c", RUN_COMMANDS, json.dumps(commands)], stdout=fh,
                              stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"run {log.stem} failed (exit {code}): {tail[0]}")


def train_and_eval(work: Path, run: Path, label: str, seed: int, manifest: Path, cfg: dict) -> dict:
    """Train one method/seed (skipped when its metrics exist) and return its summary row."""
    metrics = run / "eval" / "metrics.json"
    start = time.perf_counter()
    if not metrics.exists():
        commands = []
        if not (run / "model.safetensors").exists():
            shutil.rmtree(run, ignore_errors=True)  # a half-trained run is retrained from scratch
            config, extra = METHODS[label]
            commands.append(["train", "--config", config, *[o.format(work=work, steps=cfg["steps"]) for o in cfg["train"]],
                             f"train.max_steps={cfg['steps']}", "train.max_minutes=null", "log.progress=false",
                             f"seed={seed}", f"data.manifest={manifest}", f"data.eta={eta_path(work, cfg)}",
                             f"model.text={work / 'lm'}", f"out={run}", *extra, *cfg.get("extra_train", []),
                             *(["loss.freeze_zeta_epochs=0.25"] if config == "nuclr" else [])])
        commands.append(["eval", "--checkpoint", str(run), "--data", str(work / "manifest.parquet"), "--out",
                         str(run / "eval"), "--seed", str(seed), *cfg["eval"]])
        medclr_process(commands, work / "logs" / f"{run.parent.name}_{run.name}.log", cfg["threads"])
    timing = run / "seconds.txt"  # the run's own train + eval time, kept for reruns that reuse it
    if not timing.exists():
        timing.write_text(f"{time.perf_counter() - start:.1f}\n")
    result = json.loads(metrics.read_text())
    summary, per_class = result["summary"], result.get("zeroshot", {}).get("per_class", {})
    row = {"method": label, "seed": seed, **{m: summary.get(m) for m in METRICS},
           **{f"AUC {c}": v.get("AUC") for c, v in per_class.items()}, "seconds": float(timing.read_text())}
    sys.stdout.write(json.dumps(row) + "\n")  # one write: the worker threads print side by side
    sys.stdout.flush()
    return row


def slug(label: str) -> str:
    return label.replace(" ", "_").replace("=", "").replace("(", "").replace(")", "")


def zeta_against_frequency(run: Path) -> dict:
    """NUCLR's learned text popularity against the true frequency of what was paired (its Fig. 5).

    Sentence-keyed runs (loss.zeta_key: sentence): one point per distinct training sentence that training
    drew at least once after the freeze, zeta_txt against log rho_sent (the frequency of the sentence's
    ground-truth key among the pairs as the run's sampler draws them). Study-keyed runs: one point per
    study, zeta_txt against the draw-weighted mean log rho_sent of its sentences (what a study-keyed zeta
    can at best track). Returns Spearman, the sd of zeta_txt and the points."""
    import yaml
    from safetensors.numpy import load_file
    from scipy.stats import spearmanr

    from medclr.data.pairs import pair_probabilities
    from medclr.data.text import sentence_hash
    from medclr.inference.checkpoint import TEXT_HASH_KEY, hash_to_int
    from medclr.phantom.sentence_keys import rho_sent
    from medclr.training.data import load_table

    cfg = yaml.safe_load((run / "train_config.yaml").read_text())
    cfg["data"]["cache"] = "none"  # sentences only: no image is read
    table = load_table(cfg, eta=False)
    state = load_file(str(run / "loss_state.safetensors"))
    d = cfg["data"]
    sampling = dict(sentence_sampling=d["sentence_sampling"], other_weight=float(d["other_sentence_weight"]),
                    study_sampling=d["study_sampling"], study_balance=float(d["study_balance"]))
    rho = rho_sent(table.sentences, **sampling)
    zeta_init = np.float32(cfg["loss"].get("zeta_init", -0.05))  # the table's dtype: compare before widening
    moved_any = state["zeta_txt"] != zeta_init
    zeta = state["zeta_txt"].astype(np.float64)
    if TEXT_HASH_KEY in state:
        want = np.array([hash_to_int(sentence_hash(t)) for t in table.texts])
        if not np.array_equal(state[TEXT_HASH_KEY], want):
            raise SystemExit(f"{run}: its loss state's sentences do not match its manifest's training rows")
        log_rho = np.full(len(table.texts), np.nan)
        draw = np.zeros(len(table.texts))  # how often training draws each distinct sentence: its visit rate
        for ids, r, p in zip(table.text_ids, rho, pair_probabilities(table.sentences, **sampling)):
            log_rho[ids] = np.log(r)
            np.add.at(draw, ids, p)
        x, y, key = log_rho[moved_any], zeta[moved_any], "sentence"  # drawn at least once after the freeze
        visits = float(spearmanr(draw[moved_any], y)[0])
    else:
        pairs = pair_probabilities(table.sentences, **sampling)
        x = np.array([np.dot(p, np.log(r)) / p.sum() for p, r in zip(pairs, rho)])
        y, key = zeta, "study"
        visits = float(spearmanr([p.sum() for p in pairs], y)[0])
    return {"key": key, "spearman": float(spearmanr(x, y)[0]), "zeta_sd": float(np.std(y)), "n": int(len(y)),
            "spearman_draws": visits, "points": (x, y)}


def nuclr_popularity(runs: list[Path]) -> dict:
    """Spearman of NUCLR's learned zeta_txt with the true frequency of its texts, per seed."""
    per_run = [zeta_against_frequency(run) for run in runs]
    return {"spearman": {"sentence" if per_run[0]["key"] == "sentence" else "study": [r["spearman"] for r in per_run]},
            "zeta_sd": [r["zeta_sd"] for r in per_run], "spearman_draws": [r["spearman_draws"] for r in per_run],
            "points": per_run[0]["points"]}


def loss_effect(work: Path, run: Path, cfg: dict) -> list[dict]:
    """bench/bench_eta_fit.py on a trained run: how far each eta moves the per-pair loss from InfoNCE, on
    batches drawn as training draws them and on uniformly drawn studies."""
    effect = []
    for draw in DRAWS:
        out = subprocess.run([sys.executable, str(REPO / "bench" / "bench_eta_fit.py"), "--manifest",
                              str(work / "manifest.parquet"), "--eta", str(eta_path(work, cfg)), "--checkpoint",
                              str(run), "--n", "1024", "--batch", "64", "--draw", draw], capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"bench_eta_fit on {run} failed: {out.stderr.strip().splitlines()[-1:]}")
        effect += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return effect


def eta_path(work: Path, cfg: dict) -> Path:
    """The eta table the preset's runs train with: calibrated to the pairs as the preset's sampler draws them."""
    return work / f"eta_{cfg['name']}.parquet"


def prepare_eta(work: Path, cfg: dict) -> Path:
    """`medclr lm score` for the preset's sampling (the demo's PLLs are reused: only eta is refitted)."""
    out = eta_path(work, cfg)
    if not out.exists():
        shutil.copyfile(work / "eta.parquet", out)
        run_cli(["lm", "score", "--manifest", str(work / "manifest.parquet"), "--model", str(work / "lm"), "--out",
                 str(out), "--no-progress", *cfg["eta_sampling"]])
    return out


def eta_calibration(work: Path, cfg: dict) -> dict:
    """`medclr lm calibrate` of the preset's eta table against rho_sent under the same sampling."""
    out = work / f"calibration_{cfg['name']}"
    if not (out / "calibration.json").exists():
        run_cli(["lm", "calibrate", "--manifest", str(work / "manifest.parquet"), "--eta", str(eta_path(work, cfg)),
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
    return g.mean().join(g.std(ddof=1).add_suffix("_sd")).assign(n=g.size())


def per_seed(rows: pd.DataFrame, label: str, metric: str) -> pd.Series:
    return rows[rows["method"] == label].set_index("seed")[metric].sort_index()


def paired(rows: pd.DataFrame, a: str, b: str, metric: str) -> dict:
    """A − B over the seeds both ran (mean, Student-t 95 % CI)."""
    va, vb = per_seed(rows, a, metric), per_seed(rows, b, metric)
    seeds = va.index.intersection(vb.index)
    return {"a": a, "b": b, "metric": metric, **paired_difference(va[seeds].tolist(), vb[seeds].tolist())}


def verdict(d: dict, lower_is_better: bool = False) -> str:
    """The claim "A >= B" read from the CI of A − B."""
    lo, hi = (-d["ci_high"], -d["ci_low"]) if lower_is_better else (d["ci_low"], d["ci_high"])
    if not np.isfinite(lo):
        return "undecided (fewer than 2 seeds)"
    return "holds (CI above 0)" if lo > 0 else "refuted (CI below 0)" if hi < 0 else "undecided (CI spans 0)"


def claims(rows: pd.DataFrame, table: pd.DataFrame, pop: dict | None) -> list[dict]:
    """The seed papers' claims, each as a paired difference over seeds with its CI and verdict."""
    out = []
    consts = [lab for lab in DCL_ETAS if lab in table.index]
    for metric in ("AUC", "CNR", "mIoU", "Recall"):
        if consts and "DCL-eta_LM" in table.index:
            best = table.loc[consts, metric].idxmax()  # chosen on the same test split: favours the constant
            out.append({"claim": "DCL-eta_LM >= best constant eta", **paired(rows, "DCL-eta_LM", best, metric)})
    for a, b in (("DCL-eta_True", "DCL-eta_LM"), ("DCL-eta_LM", "InfoNCE")):
        if a in table.index and b in table.index:
            for metric in ("AUC", "CNR", "mIoU", "Recall"):
                out.append({"claim": f"{a} >= {b}", **paired(rows, a, b, metric)})
    if "NUCLR" in table.index and "SogCLR" in table.index:
        for metric in ("Recall", "MedR"):
            out.append({"claim": "NUCLR >= SogCLR on retrieval", **paired(rows, "NUCLR", "SogCLR", metric)})
    for row in out:
        row["verdict"] = verdict(row, lower_is_better=row["metric"] == "MedR")
    if pop:
        for key in pop["spearman"]:
            rho = pop["spearman"][key]
            d = pooled(rho)  # mean Spearman over seeds, Student-t CI
            out.append({"claim": f"zeta rank-correlates with class frequency ({key} key)", "a": "Spearman",
                        "b": "0", "metric": "rho", **d, "verdict": verdict(d)})
    return out


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def has_constant_eta(rows: pd.DataFrame) -> bool:
    return bool(set(DCL_ETAS) & set(rows["method"]))


def plot_eta_tradeoff(table: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    labels = [lab for lab in DCL_ETAS if lab in table.index]
    etas = [DCL_ETAS[lab] for lab in labels]
    for ax, m in zip(axes, ["AUC", "CNR", "Recall"]):
        dcl = table.loc[labels]
        ax.errorbar(etas, dcl[m], yerr=dcl[f"{m}_sd"], marker="o", capsize=3, label="DCL, constant eta (± sd)")
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
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for ax, m in zip(axes, ["AUC", "CNR", "Recall"]):
        for lab, g in sweep.groupby("method", sort=False):
            s = g.groupby("r")[m].agg(["mean", "std"]).sort_index()
            ax.errorbar(s.index, s["mean"], yerr=s["std"], marker="o", capsize=3, label=lab)
        ax.set_xscale("log")
        ax.set_xlabel("r (fraction of non-normal training studies kept)")
        ax.set_title(f"{m} (mean ± sd over seeds)")
    axes[0].legend(fontsize=7)
    save(fig, path)


def plot_popularity(points: tuple[np.ndarray, np.ndarray], rho: float, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 3.4))
    ax.scatter(points[0], points[1], s=4, alpha=0.4)
    ax.set_xlabel("log frequency of the paired sentences' class")
    ax.set_ylabel("learned zeta (text side)")
    ax.set_title(f"NUCLR popularity (seed 0), Spearman {rho:+.2f}", fontsize=9)
    save(fig, path)


def plot_retrieval(rows: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(6.4, 3.0))
    for ax, m in zip(axes, ["Recall", "MedR"]):
        for x, lab in enumerate(["SogCLR", "NUCLR"]):
            v = per_seed(rows, lab, m)
            ax.bar(x, v.mean(), color=f"C{x}", alpha=0.5)
            ax.scatter([x] * len(v), v, color="k", s=10, zorder=3)
        ax.set_xticks([0, 1], ["SogCLR", "NUCLR"])
        ax.set_title(f"{m} (bars: mean; dots: seeds)", fontsize=9)
    save(fig, path)


def fmt(table: pd.DataFrame, m: str, label: str) -> str:
    v, sd = table.loc[label, m], table.loc[label, f"{m}_sd"]
    digits = 1 if m == "MedR" else 3
    return f"{v:.{digits}f} ± {sd:.{digits}f}" if np.isfinite(sd) else f"{v:.{digits}f}"


def ci(d: dict, digits: int = 3) -> str:
    return f"{d['mean']:+.{digits}f} [{d['ci_low']:+.{digits}f}, {d['ci_high']:+.{digits}f}]"


def imbalance_section(sweep: pd.DataFrame, seeds: list[int]) -> list[str]:
    lines = ["## Class imbalance (the paper's Fig. 2)", "",
             "Training split with each non-normal study kept with probability r (the phantom's CIFAR10-r; the "
             "true class probabilities, and so DCL-eta_True's eta, recomputed), same steps, seeds "
             f"{seeds}; r = 1 is the runs above.", "",
             "| r | Method | AUC | CNR | Recall |", "|---|---|---|---|---|"]
    for (r, label), g in sweep.groupby(["r", "method"], sort=False):
        lines.append(f"| {r:g} | {label} | " + " | ".join(f"{g[m].mean():.3f} ± {g[m].std(ddof=1):.3f}"
                                                        for m in ("AUC", "CNR", "Recall")) + " |")
    if {"InfoNCE", "DCL-eta_LM"} <= set(sweep["method"]):
        lines += ["", "DCL-eta_LM − InfoNCE at each r (paired over seeds):", ""]
        for r, g in sweep.groupby("r", sort=False):
            cells = [f"{m} {ci(paired(g, 'DCL-eta_LM', 'InfoNCE', m))}" for m in ("AUC", "CNR", "Recall")]
            lines.append(f"- r = {r:g}: " + "; ".join(cells))
    return lines + ["", "![imbalance](img/results_imbalance.png)", ""]


def write_results(path: Path, preset: str, command: str, cfg: dict, rows: pd.DataFrame, sweep: pd.DataFrame,
                  verdicts: list[dict], pops: dict[str, dict], calib: dict, positives: dict[str, int], wall_min: float,
                  effect: list[dict]) -> None:
    old = path.read_text() if path.exists() else ""
    reading = old.split(READING_MARK, 1)[1] if READING_MARK in old else "\n## Reading\n\n(not written yet)\n"
    table = mean_sd(rows)
    train = [o.format(work="WORK", steps=cfg["steps"]) for o in cfg["train"] if not o.startswith(("data.cache", "ckpt", "val"))]
    run_min = (rows["seconds"].sum() + sweep.loc[sweep["r"] != 1.0, "seconds"].sum()) / 60
    lines = ["# Results: the papers' claims on CXR-Phantom", "",
             f"Produced by `{command}` (preset `{preset}`): "
             f"{cfg['n']} phantom studies; every method trained through the LSE+NL head for {cfg['steps']} steps "
             f"({' '.join(train)}), seeds {cfg['seeds']}, same data, LM and eta table, only the loss differs; "
             f"{len(rows) + int((sweep['r'] != 1.0).sum())} runs, {cfg['workers']} at a time; "
             f"**{wall_min:.0f} min wall time** for this invocation (runs cached by an earlier invocation of the "
             f"same WORK are not counted: see the reading) and {run_min:.0f} min of train + eval summed over runs. "
             "Evaluated on the phantom's test split (CheX5 zero-shot AUC with the "
             "paper's prompts, MS-CXR-format grounding CNR/mIoU, box-sentence retrieval Recall (mean of R@10/50/100) and MedR; "
             "docs/evaluation.md). Mean ± sd over seeds; paired differences are over the same seeds with a "
             "Student-t 95 % CI.", "",
             "## The claims", "",
             "| Claim | Metric | A − B | mean A − B [95 % CI] | Verdict |", "|---|---|---|---|---|"]
    for v in verdicts:
        lines.append(f"| {v['claim']} | {v['metric']} | {v['a']} − {v['b']} | {ci(v, 1 if v['metric'] == 'MedR' else 3)} "
                     f"| {v['verdict']} |")
    lines += ["", "\"Best constant eta\" is the constant with the best mean on that metric, picked on the same "
              "test split, which favours the constant. MedR: lower is better, the verdict reads the CI that way.", "",
              "## Table 1 shape", "", "| Method | CheX5 AUC | ACC | CNR | mIoU | Recall | MedR |",
              "|---|---|---|---|---|---|---|"]
    for label in table.index:
        lines.append(f"| {label} | " + " | ".join(fmt(table, m, label) for m in METRICS) + " |")
    classes = [c for c in rows.columns if c.startswith("AUC ")]
    lines += ["", "Zero-shot AUC per CheX5 class (mean ± sd over seeds; positives in the test split: "
              + ", ".join(f"{c} {n}" for c, n in positives.items()) + "):", "",
              "| Method | " + " | ".join(c.removeprefix("AUC ") for c in classes) + " |", "|---|" + "---|" * len(classes)]
    for label, g in rows.groupby("method", sort=False):
        lines.append(f"| {label} | " + " | ".join(f"{g[c].mean():.2f} ± {g[c].std(ddof=1):.2f}" for c in classes) + " |")
    lines.append("")
    if has_constant_eta(rows):
        lines += ["![eta trade-off](img/results_eta_tradeoff.png)", "",
                  "*The debiasing paper's Fig. 3 on the phantom: constant-eta DCL against eta (± sd over seeds); "
                  "lines: InfoNCE, DCL-eta_LM, the DCL-eta_True oracle.*", ""]
    if cfg["sweep_r"]:
        lines += imbalance_section(sweep, cfg["sweep_seeds"])
    if effect:
        by = {(e["metric"], e["eta"], e["anchor"], e["draw"]): e["value"] for e in effect}
        lines += ["## How far eta moves the loss on the trained InfoNCE model", "",
                  f"`bench/bench_eta_fit.py` on the InfoNCE run (seed {cfg['seeds'][0]}): {effect[0]['pairs']} training "
                  f"pairs in batches of {effect[0]['batch']}, tau {effect[0]['tau']}, drawn two ways: studies as "
                  "training draws them (`--draw sampler`: the preset's finding-balanced study draws) and uniformly "
                  "(`--draw uniform`: more look-alike normal reports). InfoNCE's text-anchored batch loss there "
                  f"{by[('batch_loss_infonce', 'paper', 'text', 'sampler')]:.3f} (sampler draws) and "
                  f"{by[('batch_loss_infonce', 'paper', 'text', 'uniform')]:.3f} (uniform draws), against the "
                  f"batches' false-negative floor {by[('batch_loss_floor', None, 'text', 'sampler')]:.3f} and "
                  f"{by[('batch_loss_floor', None, 'text', 'uniform')]:.3f} (log of how many images of its batch the "
                  "drawn sentence is true of: the least loss a model reaches that cannot tell those images apart).", "",
                  "| eta | mean eta | mean per-pair abs(loss(DCL-eta) - loss(InfoNCE)) (nat), text anchor: sampler draws "
                  "| uniform draws | symmetric, sampler draws | pairs moved > 0.01, text, sampler draws |",
                  "|---|---|---|---|---|---|"]
        for name in dict.fromkeys(e["eta"] for e in effect if e["eta"] is not None):
            lines.append(f"| {name} | {by[('eta_mean', name, 'text', 'sampler')]:.4f} | "
                         f"{by[('mean_abs_loss_diff_per_pair', name, 'text', 'sampler')]:.4f} | "
                         f"{by[('mean_abs_loss_diff_per_pair', name, 'text', 'uniform')]:.4f} | "
                         f"{by[('mean_abs_loss_diff_per_pair', name, 'symmetric', 'sampler')]:.4f} | "
                         f"{by[('pairs_abs_diff_over_0.01', name, 'text', 'sampler')]:.2f} |")
        lines.append("")
    if pops:
        lines += ["## NUCLR popularity against the true frequency (its Fig. 5)", "",
                  "Spearman(zeta_txt, log rho_sent) per seed (rho_sent: the frequency of the sentence's ground-truth "
                  "key among the pairs as training draws them; a study-keyed zeta is compared with the draw-weighted "
                  "mean log rho_sent of its study's sentences), the sd of zeta_txt, and Spearman(zeta_txt, how often "
                  "training draws the sentence or study): a zeta that tracks its visit count, not its popularity, "
                  "shows there:", "",
                  "| run | zeta keyed by | Spearman per seed | sd of zeta_txt | Spearman with the draw rate |",
                  "|---|---|---|---|---|"]
        for label, pop in pops.items():
            key = next(iter(pop["spearman"]))
            lines.append(f"| {label} | {key} | " + ", ".join(f"{x:+.3f}" for x in pop["spearman"][key]) + " | "
                         + ", ".join(f"{x:.4f}" for x in pop["zeta_sd"]) + " | "
                         + ", ".join(f"{x:+.3f}" for x in pop["spearman_draws"]) + " |")
        lines += ["", "![popularity](img/results_nuclr_popularity.png)", ""]
    if {"NUCLR", "SogCLR"} <= set(rows["method"]):
        lines += ["## NUCLR against SogCLR on retrieval", "", "![retrieval](img/results_retrieval.png)", ""]
    v = calib["variants"]
    lines += ["## eta_LM against rho_sent, the class probability it estimates", "",
              f"`medclr lm calibrate` over {calib['n_pairs']} training pairs (mean rho_sent {calib['mean_rho']:.4f}):", "",
              "| eta | a | k | E[eta]/E[rho] | Spearman | median abs(log eta/rho) | E abs(1/(1-eta) - 1/(1-rho)) |",
              "|---|---|---|---|---|---|---|"]
    def num(value) -> str:
        return "–" if value is None else f"{value:.4g}"

    for name in ("table", "meaning_fit", "sentence_fit", "string_fit", "paper", "ground_truth_power", "constant 0.05",
                 "constant 0.1"):
        x = v[name]
        lines.append(f"| {name} | {num(x.get('a'))} | {num(x.get('k'))} | {x['mean_ratio']:.2f} | "
                     f"{x['spearman']:+.3f} | {x['median_abs_log_ratio']:.2f} | {x['misspecification']:.4f} |")
    lines += ["", "![eta_LM calibration](img/results_eta_lm.png)", "", READING_MARK]
    path.write_text("\n".join(lines) + reading)


def shown_command(args: argparse.Namespace) -> str:
    """The command line as RESULTS.md shows it: the options that change a number, no local paths
    (rebuilt from the parsed options, so an abbreviated --wo PATH is left out too)."""
    opts = ["--preset", args.preset] + (["--dry-run"] if args.dry_run else [])
    for name in ("methods", "seeds", "steps", "sweep_r"):
        if getattr(args, name) is not None:
            opts += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return shlex.join(["python", "bench/paper_replication.py", *opts])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                    help="cpu: 2 cores, InfoNCE / DCL-eta_LM / DCL-eta_True, 1 seed (default); gpu: one GPU, 7 methods "
                         "x 3 seeds side by side")
    ap.add_argument("--dry-run", action="store_true",
                    help="the preset's pipeline end to end at toy size on the CPU (checks that it runs; writes to "
                         "WORK/docs, not to docs/)")
    ap.add_argument("--work", type=Path, default=None, help="cache of data and runs (default /tmp/medclr_replication_PRESET)")
    ap.add_argument("--docs", type=Path, default=REPO / "docs", help="where RESULTS.md and img/ go")
    ap.add_argument("--methods", default=None, help="comma-separated subset of: " + ", ".join(METHODS))
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (cpu: 0; gpu: 0,1,2)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (overrides the preset)")
    ap.add_argument("--workers", type=int, default=None, help="runs at a time (cpu: 1 on both cores; gpu: 21)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads a run (cpu: 2; gpu: 1, the runs share the cores)")
    ap.add_argument("--sweep-r", default=None,
                    help="comma-separated fractions r of the imbalance sweep (none by default; e.g. 0.5,0.2,0.1,0.05); "
                         "'none' skips the sweep")
    args = ap.parse_args()
    t0 = time.perf_counter()
    preset = args.preset
    cfg = dict(PRESETS[preset], name=preset)
    if args.dry_run:
        cfg.update(DRY_RUN, seeds=cfg["seeds"][:1], sweep_seeds=cfg["seeds"][:1])
    if args.methods:
        cfg["methods"] = [m.strip() for m in args.methods.split(",")]
        unknown = [m for m in cfg["methods"] if m not in METHODS]
        if unknown:
            ap.error(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
        cfg["sweep_methods"] = [m for m in cfg["sweep_methods"] if m in cfg["methods"]]
    if args.seeds:
        cfg["seeds"] = cfg["sweep_seeds"] = [int(s) for s in args.seeds.split(",")]
    if args.steps:
        cfg["steps"] = args.steps
    if args.workers:
        cfg["workers"] = args.workers
    if args.threads:
        cfg["threads"] = args.threads
    if args.sweep_r:
        try:
            cfg["sweep_r"] = [] if args.sweep_r == "none" else [float(r) for r in args.sweep_r.split(",")]
        except ValueError:
            ap.error(f"--sweep-r {args.sweep_r!r}: give fractions such as 0.5,0.1, or 'none'")
        if not all(0 < r < 1 for r in cfg["sweep_r"]):
            ap.error(f"--sweep-r {args.sweep_r!r}: each r is the fraction of non-normal studies kept, 0 < r < 1")
    work = args.work or Path(f"/tmp/medclr_replication_{preset}{'_dry' if args.dry_run else ''}")
    docs = work / "docs" if args.dry_run else args.docs
    (work / "logs").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    prepare_data(work, cfg["n"], seed=0, eval_per_class=cfg["eval_per_class"])
    prepare_eta(work, cfg)

    jobs = [(label, seed, work / "runs" / f"{slug(label)}_s{seed}", work / "manifest.parquet", 1.0)
            for label in cfg["methods"] for seed in cfg["seeds"]]
    jobs += [(label, seed, work / "sweep" / f"{slug(label)}_r{r:g}_s{seed}", imbalanced_manifest(work, r, seed=0), r)
             for r in cfg["sweep_r"] for label in cfg["sweep_methods"] for seed in cfg["sweep_seeds"]]
    print(f"== {len(jobs)} runs, {cfg['workers']} at a time (logs: {work / 'logs'})", file=sys.stderr, flush=True)
    with ThreadPoolExecutor(cfg["workers"]) as pool:
        done = list(pool.map(lambda j: dict(r=j[4], **train_and_eval(work, j[2], j[0], j[1], j[3], cfg)), jobs))
    all_rows = pd.DataFrame(done)
    rows = all_rows[all_rows["r"] == 1.0].drop(columns="r")
    sweep = pd.concat([all_rows[(all_rows["r"] == 1.0) & all_rows["method"].isin(cfg["sweep_methods"])
                                & all_rows["seed"].isin(cfg["sweep_seeds"])], all_rows[all_rows["r"] != 1.0]])

    pops = {label: nuclr_popularity([work / "runs" / f"{slug(label)}_s{s}" for s in cfg["seeds"]])
            for label in ("NUCLR", "NUCLR (paper zeta step)", "NUCLR (study zeta)") if label in cfg["methods"]}
    pop = pops.get("NUCLR")
    calib = eta_calibration(work, cfg)
    effect = loss_effect(work, work / "runs" / f"InfoNCE_s{cfg['seeds'][0]}", cfg) if "InfoNCE" in cfg["methods"] else []
    table = mean_sd(rows)
    verdicts = claims(rows, table, pop)

    img = docs / "img"
    img.mkdir(parents=True, exist_ok=True)
    if has_constant_eta(rows):  # its x axis is the constant eta: no such run, no figure
        plot_eta_tradeoff(table, img / "results_eta_tradeoff.png")
    if cfg["sweep_r"]:
        plot_imbalance(sweep, img / "results_imbalance.png")
    if pop:
        plot_popularity(pop["points"], next(iter(pop["spearman"].values()))[0], img / "results_nuclr_popularity.png")
    if {"NUCLR", "SogCLR"} <= set(rows["method"]):
        plot_retrieval(rows, img / "results_retrieval.png")
    shutil.copyfile(work / f"calibration_{cfg['name']}" / "calibration.png", img / "results_eta_lm.png")
    all_rows.to_csv(work / "runs.csv", index=False)
    wall = (time.perf_counter() - t0) / 60
    write_results(docs / "RESULTS.md", preset, shown_command(args), cfg, rows, sweep, verdicts, pops, calib,
                  count_test_positives(work), wall, effect)
    for v in verdicts:
        print(json.dumps({"claim": v["claim"], "metric": v["metric"], "diff": v["mean"], "ci_low": v["ci_low"],
                          "ci_high": v["ci_high"], "verdict": v["verdict"]}))
    for e in effect:
        if e["metric"] in ("mean_abs_loss_diff_per_pair", "batch_loss_infonce", "batch_loss_floor"):
            print(json.dumps({k: e[k] for k in ("metric", "eta", "anchor", "draw", "value")}))
    print(json.dumps({"results": str(docs / "RESULTS.md"), "runs": len(all_rows), "wall_minutes": round(wall, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
