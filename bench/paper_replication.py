"""The papers' claims, tested on CXR-Phantom: writes docs/RESULTS.md and docs/img/results_*.png.

Every method trains through the LSE+NL head (the debiasing paper's setup; the default preset's model)
under the same budget (same steps, batch, image size, data, LM and eta table; only the loss differs),
3 seeds each, and is evaluated on the phantom's test split with `medclr eval` (CheX5 zero-shot AUC/ACC
with the paper's prompts, MS-CXR-format grounding CNR/mIoU, box-sentence retrieval Recall/MedR). Then:

* the claims, each as a paired difference over seeds with a Student-t 95 % CI and a verdict:
  DCL-eta_LM >= the best constant eta (AUC, CNR, mIoU, Recall); DCL-eta_True >= DCL-eta_LM >= InfoNCE;
  NUCLR >= SogCLR on retrieval; NUCLR's zeta rank-correlates with the true class frequency;
* the eta trade-off of the debiasing paper's Fig. 3 (constant-eta DCL against eta, with InfoNCE,
  DCL-eta_LM and the DCL-eta_True oracle as references);
* the class-imbalance sweep of its Fig. 2: the training split with every non-normal study kept
  with probability r (the phantom's CIFAR10-r), the true class probabilities recomputed;
* NUCLR's learned popularity zeta against the true class frequency (its Fig. 5), keyed by the
  sentences each sample was actually paired with (replayed from the run's seed) and by the study;
* NUCLR against SogCLR on retrieval; eta_LM against the true class probability (`medclr lm calibrate`).

Runs go `workers` at a time as `medclr` subprocesses (logs under WORK/logs). Each run's output is
cached under WORK: a killed replication resumes where it stopped (a run interrupted mid-training is
retrained). One JSON line per run on stdout, then one per claim.

    python bench/paper_replication.py --quick            # 2-core CPU, under an hour from a clean clone (49 min)
    python bench/paper_replication.py --work /data/rep   # full preset, sized for one GPU
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

from medclr.app.demo import plan as demo_plan  # noqa: E402  (the demo's data steps: phantom, manifest, LM, eta)
from medclr.cli import main as medclr_main  # noqa: E402
from medclr.evaluation.report import SUMMARY_KEYS  # noqa: E402
from medclr.evaluation.seeds import paired_difference, pooled  # noqa: E402
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
# The methods the papers' claims are about; DeCL and t-InfoNCE are baselines no claim names.
CLAIM_METHODS = [m for m in METHODS if m not in ("DeCL", "t-InfoNCE")]

PRESETS = {
    # 2-core CPU, under an hour from a clean clone: the default preset's model (cpu_small: ResNet-18 to
    # layer3 at 64 px, LSE+NL head on an 8x8 grid, finding sentences, the demo's LM), batch 32 for 240
    # steps (~3 epochs; on this machine batch 32 trains the head further per second than batch 64: CNR
    # 0.95 at 300 steps of 32 against 0.82 at 150 steps of 64, the same three minutes), two runs at a time
    # with one thread each (1.25x the throughput of one two-thread run; a run's numerics do not depend on
    # the other's load). 9 methods x 3 seeds + the imbalance sweep at r = 0.1 (InfoNCE, DCL-eta_LM, 3
    # seeds): 33 runs of 145-184 s each; measured from a clean clone: 48.8 min with 4.9 min for the data
    # (docs/RESULTS.md).
    "quick": {"n": 3000, "seeds": [0, 1, 2], "steps": 240, "workers": 2, "threads": 1, "sweep_r": [0.1],
              "sweep_methods": ["InfoNCE", "DCL-eta_LM"], "sweep_seeds": [0, 1, 2], "methods": CLAIM_METHODS,
              "train": ["preset=cpu_small", "train.batch_size=32", "ckpt.every={steps}", "val.every=null",
                        "data.cache=disk", "data.cache_dir={work}/image_cache", "data.cache_workers=1"],
              "eval": ["--tasks", "zeroshot,grounding,retrieval", "--n-boot", "200", "--no-figures"]},
    # One GPU: the gpu_small preset (the cpu_small model on the whole ResNet-18 at 128 px with the
    # negation-aware recipe), the setting measured to learn grounding and retrieval on the phantom
    # (docs/training.md: CNR 1.39, Recall 0.19 over 3 seeds at 2,500 steps). Three such runs side by side
    # took 4.4 min of training on one H100, so the 33 method runs one after another take at most ~2.5 h
    # and the 60 sweep runs ~4.5 h (not run on a GPU yet).
    "full": {"n": 3000, "seeds": [0, 1, 2], "steps": 2500, "workers": 1, "threads": 0, "sweep_r": [0.5, 0.2, 0.1, 0.05],
             "sweep_methods": ["InfoNCE", "DCL eta=0.1", "DCL-eta_LM", "DCL-eta_True", "NUCLR"], "sweep_seeds": [0, 1, 2],
             "methods": list(METHODS), "train": ["preset=gpu_small", "log.every=50", "ckpt.every={steps}", "val.every=null"],
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
                             f"seed={seed}", f"data.manifest={manifest}", f"data.eta={work / 'eta.parquet'}",
                             f"model.text={work / 'lm'}", f"out={run}", *extra,
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
    return label.replace(" ", "_").replace("=", "")


def sentence_classes(work: Path) -> dict[int, dict[str, str]]:
    """manifest index -> {finding sentence: its finding's latent-class token} from the phantom's ground
    truth; a sentence stating no rendered finding (normal statements, negations) is class "other"."""
    from medclr.data.groundtruth import read_ground_truth
    from medclr.data.manifest import read_manifest

    gt = read_ground_truth(work / "phantom", ["dicom_id", "findings"]).set_index("dicom_id")["findings"]
    out = {}
    for index, dicom_id in read_manifest(work / "manifest.parquet")[["index", "dicom_id"]].itertuples(index=False):
        out[int(index)] = {f["sentence"]: f["name"] + (f":{f['side']}" if f["side_stated"] else "")
                           for f in gt.get(dicom_id, []) if f["rendered"] and f["sentence"]}
    return out


def paired_sentence_key(run: Path, classes: dict[int, dict[str, str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(zeta_txt, key, manifest index) per training sample of a NUCLR run, key = the zeta-step-weighted mean, over the
    sample's visits after the freeze, of log(frequency of the class of the sentence paired at that visit).

    zeta_j moves by -lr_t * g_j at every visit (an accumulated sum, not a moving average), and g_j at a
    visit is about the sentence drawn then, so the truth zeta estimates is the popularity of the
    sentences it was paired with, weighted by the step size of each visit. The visits are replayed from
    the run's config: the sampler and the sentence draw are pure functions of (seed, epoch, index)."""
    import yaml
    from safetensors.numpy import load_file

    from medclr.losses.nuclr import cosine_after_freeze
    from medclr.training.data import PairDataset, load_table, study_weights
    from medclr.training.sampler import GlobalBatchSampler

    cfg = yaml.safe_load((run / "train_config.yaml").read_text())
    cfg["data"]["cache"] = "none"  # sentences only: no image is read
    table = load_table(cfg, eta=False)
    state = load_file(str(run / "loss_state.safetensors"))
    if not np.array_equal(state["sample_manifest_index"], table.manifest_index):
        raise SystemExit(f"{run}: its loss state does not match its manifest's training rows")
    ds = PairDataset(table, cfg)
    weighted = cfg["data"]["study_sampling"] != "uniform"
    weights = study_weights(table.sentences, cfg["data"]["study_sampling"], float(cfg["data"]["study_balance"]))
    sampler = GlobalBatchSampler(len(table), int(cfg["train"]["batch_size"]), seed=int(cfg["seed"]), weights=weights)
    total = int(cfg["train"]["max_steps"])
    freeze = int(round(float(cfg["loss"].get("freeze_zeta_epochs") or 0) * sampler.steps_per_epoch))
    visits = []  # (sample, class, weight)
    for step in range(freeze, total):
        lr = cosine_after_freeze(step, 1.0, freeze, total) if cfg["loss"].get("zeta_lr_schedule") == "cosine" else 1.0
        epoch = sampler.position(step)[0]
        for i in sampler.global_batch_indices(step):
            _, sentence = ds.training_sentence(step if weighted else epoch, int(i))
            visits.append((int(i), classes[int(table.manifest_index[i])].get(sentence, "other"), lr))
    v = pd.DataFrame(visits, columns=["i", "cls", "w"])
    log_freq = np.log(v.groupby("cls")["w"].sum() / v["w"].sum())
    v["wl"] = v["w"] * v["cls"].map(log_freq)
    g = v.groupby("i")[["wl", "w"]].sum()
    key = np.full(len(table), np.nan)
    key[g.index.to_numpy()] = (g["wl"] / g["w"]).to_numpy()
    return state["zeta_txt"].astype(np.float64), key, table.manifest_index


def nuclr_popularity(work: Path, runs: list[Path]) -> dict:
    """Spearman of NUCLR's learned zeta_txt with the true class frequency, per seed, under two keys:
    the sentences actually paired with each sample (paired_sentence_key) and the study's latent class."""
    from scipy.stats import spearmanr

    from medclr.data.manifest import read_manifest

    classes = sentence_classes(work)
    study = read_manifest(work / "manifest.parquet").set_index("index")["latent_class_prob"]
    out, points = {"sentence": [], "study": []}, None
    for run in runs:
        zeta, key, index = paired_sentence_key(run, classes)
        ok = np.isfinite(key)
        out["sentence"].append(float(spearmanr(zeta[ok], key[ok])[0]))
        out["study"].append(float(spearmanr(zeta, np.log(study.loc[index].to_numpy(dtype=np.float64)))[0]))
        if points is None:
            points = (key[ok], zeta[ok])
    return {"spearman": out, "points": points}


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
        for key in ("sentence", "study"):
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
                  verdicts: list[dict], pop: dict | None, calib: dict, positives: dict[str, int], wall_min: float) -> None:
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
             f"**{wall_min:.0f} min wall time** for the whole script including the data ({run_min:.0f} min of "
             "train + eval summed over runs). Evaluated on the phantom's test split (CheX5 zero-shot AUC with the "
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
    lines += ["", "![eta trade-off](img/results_eta_tradeoff.png)", "",
              "*The debiasing paper's Fig. 3 on the phantom: constant-eta DCL against eta (± sd over seeds); lines: "
              "InfoNCE, DCL-eta_LM, the DCL-eta_True oracle.*", ""]
    if cfg["sweep_r"]:
        lines += imbalance_section(sweep, cfg["sweep_seeds"])
    if pop:
        s, st = pop["spearman"]["sentence"], pop["spearman"]["study"]
        lines += ["## NUCLR popularity against the true class frequency (its Fig. 5)", "",
                  "Spearman(zeta_txt, log true class frequency) over the training samples, per seed: keyed by the "
                  "sentences actually paired with each sample (the class of the finding the drawn sentence states, "
                  "from the phantom's ground truth, averaged over the sample's visits after the freeze with the zeta "
                  "step size as weight) " + ", ".join(f"{x:+.3f}" for x in s) + "; keyed by the study's latent class "
                  + ", ".join(f"{x:+.3f}" for x in st) + ".", "",
                  "![popularity](img/results_nuclr_popularity.png)", ""]
    if {"NUCLR", "SogCLR"} <= set(rows["method"]):
        lines += ["## NUCLR against SogCLR on retrieval", "", "![retrieval](img/results_retrieval.png)", ""]
    sent, study = calib.get("sentence", {}), calib.get("study", {})
    lines += ["## eta_LM against the true class probability", "",
              f"Spearman(log p_LM, log rho): per sentence {sent.get('spearman_logp_logrho', float('nan')):+.3f}, "
              f"per study {study.get('spearman_logp_logrho', float('nan')):+.3f} (`medclr lm calibrate`; "
              "docs/lm.md explains the two levels).", "", "![eta_LM calibration](img/results_eta_lm.png)", "",
              READING_MARK]
    path.write_text("\n".join(lines) + reading)


def shown_command(args: argparse.Namespace) -> str:
    """The command line as RESULTS.md shows it: the options that change a number, no local paths
    (rebuilt from the parsed options, so an abbreviated --wo PATH is left out too)."""
    opts = ["--quick"] if args.quick else []
    for name in ("methods", "seeds", "steps", "sweep_r"):
        if getattr(args, name) is not None:
            opts += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return shlex.join(["python", "bench/paper_replication.py", *opts])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the 2-core CPU preset (under an hour: 49 min measured)")
    ap.add_argument("--work", type=Path, default=None, help="cache of data and runs (default /tmp/medclr_replication_PRESET)")
    ap.add_argument("--docs", type=Path, default=REPO / "docs", help="where RESULTS.md and img/ go")
    ap.add_argument("--methods", default=None, help="comma-separated subset of: " + ", ".join(METHODS))
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (overrides the preset)")
    ap.add_argument("--workers", type=int, default=None, help="runs at a time (quick: 2, one thread each)")
    ap.add_argument("--sweep-r", default=None,
                    help="comma-separated fractions r of the imbalance sweep (quick: 0.1; full: 0.5,0.2,0.1,0.05); "
                         "'none' skips the sweep")
    args = ap.parse_args()
    t0 = time.perf_counter()
    preset = "quick" if args.quick else "full"
    cfg = dict(PRESETS[preset])
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
    if args.sweep_r:
        try:
            cfg["sweep_r"] = [] if args.sweep_r == "none" else [float(r) for r in args.sweep_r.split(",")]
        except ValueError:
            ap.error(f"--sweep-r {args.sweep_r!r}: give fractions such as 0.5,0.1, or 'none'")
        if not all(0 < r < 1 for r in cfg["sweep_r"]):
            ap.error(f"--sweep-r {args.sweep_r!r}: each r is the fraction of non-normal studies kept, 0 < r < 1")
    work = args.work or Path(f"/tmp/medclr_replication_{preset}")
    (work / "logs").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    prepare_data(work, cfg["n"], seed=0)

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

    nuclr_runs = [work / "runs" / f"NUCLR_s{s}" for s in cfg["seeds"] if "NUCLR" in cfg["methods"]]
    pop = nuclr_popularity(work, nuclr_runs) if nuclr_runs else None
    calib = eta_calibration(work)
    table = mean_sd(rows)
    verdicts = claims(rows, table, pop)

    img = args.docs / "img"
    img.mkdir(parents=True, exist_ok=True)
    plot_eta_tradeoff(table, img / "results_eta_tradeoff.png")
    if cfg["sweep_r"]:
        plot_imbalance(sweep, img / "results_imbalance.png")
    if pop:
        plot_popularity(pop["points"], pop["spearman"]["sentence"][0], img / "results_nuclr_popularity.png")
    if {"NUCLR", "SogCLR"} <= set(rows["method"]):
        plot_retrieval(rows, img / "results_retrieval.png")
    shutil.copyfile(work / "calibration" / "calibration.png", img / "results_eta_lm.png")
    all_rows.to_csv(work / "runs.csv", index=False)
    wall = (time.perf_counter() - t0) / 60
    write_results(args.docs / "RESULTS.md", preset, shown_command(args), cfg, rows, sweep, verdicts, pop, calib,
                  count_test_positives(work), wall)
    for v in verdicts:
        print(json.dumps({"claim": v["claim"], "metric": v["metric"], "diff": v["mean"], "ci_low": v["ci_low"],
                          "ci_high": v["ci_high"], "verdict": v["verdict"]}))
    print(json.dumps({"results": str(args.docs / "RESULTS.md"), "runs": len(all_rows), "wall_minutes": round(wall, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
