"""The papers' claims on CXR-Phantom, decided over seeds: a campaign that outlives any one sitting.

Every method trains through the LSE+NL head (the debiasing paper's setup) under one budget (same steps,
batch, image size, data and LM; only the loss and its eta differ) and is evaluated on the phantom's test
split with `medclr eval` (CheX5 zero-shot AUC with the paper's prompts, MS-CXR-format grounding CNR/mIoU,
box-sentence retrieval Recall/MedR). InfoNCE is anchored on the text like DCL (InfoNCE = DCL with eta = 0).

The methods as the papers define them:

* DCL-eta_LM: the debiasing paper's eta = min(a * p_LM(x)^k, eta_max) from the domain LM's
  pseudo-log-likelihood, a = 0.2, k = 0.35 (`medclr lm score --eta-fit paper`); --eta-grid adds the
  paper's alternative, a small (a, k) grid trained and chosen on the validation split;
* DCL-eta_True: DCL's oracle, the false-negative rate q of the sentence a step shows (the probability
  that a negative image, drawn as the run's sampler draws, is one the sentence is true of);
* DCL eta=C: constant eta; the better of 0.05 and 0.1 is chosen on the validation split (zero-shot AUC: the
  phantom's validation split has no MS-CXR boxes);
* NUCLR (learned popularity zeta) against SogCLR (zeta = 0);
* DCL-eta_rule: medclr's own eta (`--eta-fit meaning`: the frequency of the sentence's rule-read
  meaning key), beside the paper's, never under its name.

The plan (preset `cpu`), in priority order, three seeds each: P1 InfoNCE, DCL-eta_LM, DCL eta=0.05 and
0.1; P2 DCL-eta_True; P3 NUCLR and SogCLR; P4 DCL-eta_rule. On 2 CPU cores every run is fine-tuned from
one shared warm start (InfoNCE, the cpu_zeroshot recipe, `warm_steps` steps, trained once), as the paper
fine-tunes from pretrained encoders: the whole plan costs about a third of training each run from scratch.
Runs go one at a time; each checkpoints every tenth of itself, so a run stopped mid-way resumes with at
most a tenth lost (resume is exact). Each finished run's metrics (a small JSON, never weights) go to
docs/replication/PRESET/runs/, and docs/RESULTS.md is rebuilt from what is there: commit them, and the
next start skips what is done. The plan's status (done / partial / missing) is printed at the start and
the end; each claim gets its verdict as soon as its runs exist.

    python bench/paper_replication.py --preset cpu --status   # the plan, each run done / partial / missing
    python bench/paper_replication.py --preset cpu            # work through the plan (hours; resumable)
    python bench/paper_replication.py --preset cpu --report   # rebuild RESULTS.md from the committed metrics
    python bench/paper_replication.py --preset gpu            # one GPU: every method x 3 seeds side by side
    python bench/paper_replication.py --preset tiny --docs D  # the whole pipeline at toy size (the test)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from medclr.cli import main as medclr_main  # noqa: E402
from medclr.evaluation.report import SUMMARY_KEYS  # noqa: E402
from medclr.evaluation.seeds import paired_difference, pooled  # noqa: E402
from medclr.jobs.demo import plan as demo_plan  # noqa: E402  (the demo's data steps: phantom, manifest, LM, PLLs)

# label -> (training config, extra overrides, eta table or None). Constant-eta DCL labels carry their eta.
METHODS = {
    "InfoNCE": ("infonce", ["loss.anchor=text"], None),
    "DCL eta=0.05": ("dcl", ["loss.eta=0.05"], None),
    "DCL eta=0.1": ("dcl", ["loss.eta=0.1"], None),
    "DCL-eta_LM": ("dcl_lm", [], "paper"),
    "DCL-eta_True": ("dcl_true", [], None),
    "SogCLR": ("sogclr", [], None),
    "NUCLR": ("nuclr", [], None),
    "DCL-eta_rule": ("dcl_lm", [], "rule"),
    "DeCL": ("decl", [], None),
    "t-InfoNCE": ("t_infonce", [], None),
}
DCL_ETAS = {"DCL eta=0.05": 0.05, "DCL eta=0.1": 0.1}
# The eta tables, from the demo's PLLs: the paper's a, k, and medclr's rule-key calibration.
ETA_TABLES = {"paper": ["--eta-fit", "paper"], "rule": ["--eta-fit", "meaning"]}
# (priority, methods): the order the campaign works in.
PLAN = [("P1", ["InfoNCE", "DCL-eta_LM", "DCL eta=0.05", "DCL eta=0.1"]), ("P2", ["DCL-eta_True"]),
        ("P3", ["NUCLR", "SogCLR"]), ("P4", ["DCL-eta_rule"])]
# The paper's alternative to its published a, k (--eta-grid): a small grid around them, chosen on validation.
ETA_GRID = [(0.2, 0.35), (0.5, 0.1), (0.5, 0.05), (0.2, 0.05)]

_CPU_TRAIN = ["preset=cpu_zeroshot", "val.every=null", "data.cache=disk", "data.cache_dir={work}/image_cache",
              "data.cache_workers=1"]
# "eval_normal": 0 keeps the test split the committed runs were measured on: it predates the phantom's normal
# test studies, which add negatives to every CheX5 AUC.
PRESETS = {
    # 2 CPU cores: the cpu_zeroshot recipe (ResNet-18 to layer3 at 64 px, LSE+NL on an 8x8 grid, finding-balanced
    # study draws, short forms, the rule hard-negative term) at batch 64. One InfoNCE warm start of 600 steps, then
    # each method x seed fine-tuned 300 steps from it (the recipe's LR schedule restarted): ~15 min a run.
    "cpu": {"n": 3000, "eval_per_class": 250, "eval_normal": 0, "seeds": [0, 1, 2], "warm_steps": 600, "steps": 300,
            "workers": 1, "keep_last": 1,
            "threads": 2, "plan": PLAN, "eta_sampling": ["--sentence-sampling", "findings", "--study-sampling",
                                                          "findings", "--study-balance", "1"],
            "train": _CPU_TRAIN, "eval": ["--tasks", "zeroshot,grounding,retrieval", "--n-boot", "200", "--no-figures"]},
    # One GPU (sized for an H100 with 16 cores): the gpu_small recipe from scratch for 2,500 steps, every method of
    # the plan x 3 seeds side by side (21+ small runs, 1 loader thread each, the images cached once on disk).
    "gpu": {"n": 3000, "eval_per_class": 250, "eval_normal": 0, "seeds": [0, 1, 2], "warm_steps": 0, "steps": 2500,
            "workers": 24, "keep_last": 1,
            "threads": 1, "plan": PLAN, "eta_sampling": ["--sentence-sampling", "findings"],
            "train": ["preset=gpu_small", "log.every=50", "val.every=null", "data.cache=disk",
                      "data.cache_dir={work}/image_cache", "data.num_workers=1"],
            "eval": ["--tasks", "zeroshot,grounding,retrieval", "--n-boot", "1000", "--no-figures"]},
    # The pipeline end to end at toy size on a CPU (a 240-study phantom, 6 + 6 steps of batch 16 at 32 px): it
    # checks that every step runs, not what it measures.
    "tiny": {"n": 240, "eval_per_class": 10, "eval_normal": 0, "seeds": [0, 1], "warm_steps": 6, "steps": 6, "workers": 1,
             "keep_last": 10,
             "threads": 1, "lm_fit": ["--epochs", "1", "--layers", "2", "--hidden", "64", "--heads", "2"],
             "plan": [("P1", ["InfoNCE", "DCL-eta_LM"])], "eta_sampling": ["--sentence-sampling", "findings"],
             "train": [*_CPU_TRAIN, "train.batch_size=16", "data.resize=36", "data.crop=32", "train.device=cpu"],
             "eval": ["--tasks", "zeroshot,grounding,retrieval", "--n-boot", "20", "--no-figures"]},
}
METRICS = list(SUMMARY_KEYS)
CLAIM_METRICS = ("AUC", "CNR", "mIoU", "Recall")
READING_MARK = "<!-- reading: kept when the script rewrites this file -->"


@dataclass(frozen=True)
class Run:
    priority: str
    label: str
    seed: int

    @property
    def name(self) -> str:
        return slug(self.label) + f"_s{self.seed}"


def slug(label: str) -> str:
    return label.replace(" ", "_").replace("=", "").replace("(", "").replace(")", "").replace(",", "_")


def run_cli(argv: list[str]) -> None:
    code = medclr_main(argv)
    if code != 0:
        raise SystemExit(f"`medclr {' '.join(argv[:2])}` failed (exit {code})")


# --------------------------------------------------------------------------- the data, the eta tables, the warm start


def prepare_data(work: Path, cfg: dict) -> None:
    """Phantom -> manifest -> domain LM -> PLLs, as `medclr demo` builds them (cached)."""
    args = Namespace(n=cfg["n"], seed=0, eval_per_class=cfg["eval_per_class"], eval_normal=cfg["eval_normal"],
                     preset="cpu_small")
    for step in demo_plan(work, args)[:4]:
        if not step.output.exists():
            print(f"== {step.name}", file=sys.stderr, flush=True)
            run_cli(step.argv + (cfg.get("lm_fit", []) if step.argv[:2] == ["lm", "fit"] else []))


def eta_table(work: Path, name: str) -> Path:
    return work / f"eta_{name}.parquet"


def prepare_eta(work: Path, cfg: dict) -> None:
    """One eta table per kind, from the demo's PLLs (`medclr lm score` only recomputes eta), each for the preset's
    draws (the rule calibration weighs the pairs as training draws them)."""
    import shutil

    for name, flags in ETA_TABLES.items():
        out = eta_table(work, name)
        if not out.exists():
            shutil.copyfile(work / "eta.parquet", out)
            run_cli(["lm", "score", "--manifest", str(work / "manifest.parquet"), "--model", str(work / "lm"), "--out",
                     str(out), "--no-progress", *flags, *cfg["eta_sampling"]])


def medclr_process(commands: list[list[str]], log: Path, threads: int) -> None:
    """`medclr ARGV` for each ARGV in order, in one process of its own (torch imported once), output to LOG."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    script = ("import json, sys\nfrom medclr.cli import main\nfor argv in json.loads(sys.argv[1]):\n"
              "    code = main(argv)\n    if code:\n        sys.exit(f'`medclr {argv[0]}` failed (exit {code})')\n")
    with open(log, "a") as fh:
        code = subprocess.run([sys.executable, "-c", script, json.dumps(commands)], stdout=fh,
                              stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"{log.stem} failed (exit {code}): {tail[0]}")


def train_command(work: Path, out: Path, cfg: dict, config: str, seed: int, steps: int, extra: list[str]) -> list[str]:
    """`medclr train` of one run; `--resume` when an earlier invocation left checkpoints (exact resume)."""
    resume = ["--resume"] if (out / "checkpoints").is_dir() and any((out / "checkpoints").glob("step-*")) else []
    return ["train", "--config", config, *[o.format(work=work) for o in cfg["train"]], f"train.max_steps={steps}",
            f"ckpt.every={max(1, steps // 10)}", f"ckpt.keep_last={cfg['keep_last']}", "train.max_minutes=null",
            "log.progress=false", f"seed={seed}", f"data.manifest={work / 'manifest.parquet'}",
            f"model.text={work / 'lm'}", f"out={out}", *extra, *resume]


def trained(out: Path) -> bool:
    """Whether the run in OUT trained all its steps (every checkpoint publishes its weights to OUT, so their
    presence says nothing)."""
    path = out / "trainer_state.json"
    if not path.is_file():
        return False
    state = json.loads(path.read_text())
    return int(state["step"]) >= int(state["total_steps"])


def warm_start(work: Path, cfg: dict) -> Path | None:
    """The shared warm start (InfoNCE, seed 0) every run fine-tunes from; None when the preset trains from scratch."""
    if not cfg["warm_steps"]:
        return None
    out = work / "warm"
    commands = [] if trained(out) else [train_command(work, out, cfg, "infonce", 0, cfg["warm_steps"], ["loss.anchor=text"])]
    if not (out / "eval_test" / "metrics.json").exists():  # where every run starts: what fine-tuning adds is read off it
        commands.append(eval_command(out, work, cfg, 0, "test"))
    if commands:
        print(f"== warm start: InfoNCE, {cfg['warm_steps']} steps", file=sys.stderr, flush=True)
        medclr_process(commands, work / "logs" / "warm.log", cfg["threads"])
    return out


# --------------------------------------------------------------------------- one run


def plan_runs(cfg: dict) -> list[Run]:
    return [Run(p, label, seed) for p, labels in cfg["plan"] for seed in cfg["seeds"] for label in labels]


def metrics_path(docs: Path, preset: str, name: str) -> Path:
    return docs / "replication" / preset / "runs" / f"{name}.json"


def status(work: Path, docs: Path, preset: str, run: Run) -> str:
    """done (its metrics are under docs/), partial (checkpoints in WORK: it resumes), or missing."""
    if metrics_path(docs, preset, run.name).exists():
        return "done"
    steps = sorted((work / "runs" / run.name / "checkpoints").glob("step-*"))
    if trained(work / "runs" / run.name):
        return "partial (trained, not evaluated)"
    return f"partial (step {int(steps[-1].name.split('-')[1])})" if steps else "missing"


def print_plan(work: Path, docs: Path, preset: str, cfg: dict) -> None:
    runs = plan_runs(cfg)
    states = [status(work, docs, preset, r) for r in runs]
    print(f"== plan ({preset}): {sum(s == 'done' for s in states)} of {len(runs)} runs done", file=sys.stderr)
    for r, s in zip(runs, states):
        print(f"   {r.priority}  {r.label:<14} seed {r.seed}  {s}", file=sys.stderr)
    sys.stderr.flush()


def run_train_args(work: Path, run: Run, cfg: dict, warm: Path | None, eta_override: list[str] | None = None) -> list[str]:
    config, extra, table = METHODS[run.label] if run.label in METHODS else ("dcl_lm", [], "paper")
    extra = [*extra, *(eta_override or [])]
    if table is not None:
        extra.append(f"data.eta={eta_table(work, table)}")
    if config == "nuclr":
        extra.append("loss.freeze_zeta_epochs=0.25")
    if warm is not None:
        extra.append(f"model.init={warm}")
    return train_command(work, work / "runs" / run.name, cfg, config, run.seed, cfg["steps"], extra)


# The phantom's validation split has no MS-CXR boxes: it is read by zero-shot AUC alone, which chooses the constant
# eta (and the --eta-grid's a, k) for every metric.
VALIDATION_METRIC = "AUC"


def eval_command(run_dir: Path, work: Path, cfg: dict, seed: int, split: str) -> list[str]:
    opts = list(cfg["eval"])
    if split == "validate":
        opts[opts.index("--tasks") + 1] = "zeroshot"
    return ["eval", "--checkpoint", str(run_dir), "--data", str(work / "manifest.parquet"), "--out",
            str(run_dir / f"eval_{split}"), "--split", split, "--seed", str(seed), *opts]


def evaluated(path: Path) -> dict:
    result = json.loads(path.read_text())
    per_class = result.get("zeroshot", {}).get("per_class", {})
    return {**{m: result["summary"].get(m) for m in METRICS}, **{f"AUC {c}": v.get("AUC") for c, v in per_class.items()}}


def do_run(work: Path, docs: Path, preset: str, run: Run, cfg: dict, warm: Path | None,
           eta_override: list[str] | None = None, splits: tuple[str, ...] | None = None) -> dict:
    """Train (or resume) and evaluate one run, and write its metrics JSON under docs/ (skipped when there)."""
    target = metrics_path(docs, preset, run.name)
    if target.exists():
        return json.loads(target.read_text())
    run_dir = work / "runs" / run.name
    splits = splits or (("validate", "test") if run.label in DCL_ETAS else ("test",))
    start = time.perf_counter()
    commands = [] if trained(run_dir) else [run_train_args(work, run, cfg, warm, eta_override)]
    commands += [eval_command(run_dir, work, cfg, run.seed, s) for s in splits
                 if not (run_dir / f"eval_{s}" / "metrics.json").exists()]
    if commands:
        print(f"== {run.priority} {run.label} seed {run.seed}", file=sys.stderr, flush=True)
        medclr_process(commands, work / "logs" / f"{run.name}.log", cfg["threads"])
    state = json.loads((run_dir / "trainer_state.json").read_text())
    record = {"method": run.label, "seed": run.seed, "priority": run.priority, "preset": preset,
              "steps": cfg["steps"], "warm_start": None if warm is None else warm_record(warm),
              "config": state["config"]["loss"], "eta_table": state["config"]["data"].get("eta") and
              Path(state["config"]["data"]["eta"]).name, "last_loss": state.get("last_loss"),
              "train_seconds": state.get("elapsed_s"), "seconds": round(time.perf_counter() - start, 1),
              "commit": git_commit(), **{s: evaluated(run_dir / f"eval_{s}" / "metrics.json") for s in splits}}
    if METHODS.get(run.label, ("",))[0] == "nuclr":
        record["zeta"] = {k: v for k, v in zeta_against_frequency(run_dir).items() if k != "points"}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=1, default=float) + "\n")
    print(json.dumps({"run": run.name, **{m: record["test"][m] for m in ("AUC", "CNR", "Recall")}}), flush=True)
    return record


def warm_record(warm: Path) -> dict:
    from medclr.inference.checkpoint import weights_sha256

    state = json.loads((warm / "trainer_state.json").read_text())
    return {"steps": state["step"], "loss": state["config"]["loss"]["name"], "seed": state["seed"],
            "weights_sha256": weights_sha256(warm), "test": evaluated(warm / "eval_test" / "metrics.json")}


def git_commit() -> str | None:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None


# --------------------------------------------------------------------------- NUCLR's zeta against popularity


def zeta_against_frequency(run: Path) -> dict:
    """NUCLR's learned text popularity against the true frequency of what was paired (its Fig. 5): one point per
    distinct text that training drew at least once after the freeze, zeta_txt against log rho_sent (how often the
    text's ground-truth key occurs among the pairs as the run's sampler draws them). Spearman, the sd of zeta_txt,
    Spearman with the draw rate, and the points."""
    import yaml
    from safetensors.numpy import load_file
    from scipy.stats import spearmanr

    from medclr.data.pairs import pair_probabilities
    from medclr.data.text import sentence_hash
    from medclr.inference.checkpoint import TEXT_HASH_KEY, hash_to_int
    from medclr.training.data import load_table

    cfg = yaml.safe_load((run / "train_config.yaml").read_text())
    cfg["data"]["cache"] = "none"  # sentences only: no image is read
    cfg["data"]["eta_max"], cfg["loss"]["eta_source"] = 1.0, "rho_sent"  # training's own rho_sent per text, uncapped
    table = load_table(cfg)
    state = load_file(str(run / "loss_state.safetensors"))
    want = np.array([hash_to_int(sentence_hash(t)) for t in table.texts])
    if TEXT_HASH_KEY not in state or not np.array_equal(state[TEXT_HASH_KEY], want):
        raise SystemExit(f"{run}: its loss state's texts do not match its manifest's training rows")
    d = cfg["data"]
    pairs = pair_probabilities(table.sentences, sentence_sampling=d["sentence_sampling"],
                               other_weight=float(d["other_sentence_weight"]), study_sampling=d["study_sampling"],
                               study_balance=float(d["study_balance"]))
    with np.errstate(divide="ignore"):  # a short form whose key no pair states has rho 0: left out below
        log_rho = np.log([table.text_eta[t] for t in table.texts])
    draw = np.zeros(len(table.texts))  # how often training draws each distinct text from the manifest: its visit rate
    for ids, p in zip(table.text_ids, pairs):
        np.add.at(draw, ids, p)
    zeta_init = np.float32(cfg["loss"].get("zeta_init", -0.05))  # the table's dtype: compare before widening
    moved = (state["zeta_txt"] != zeta_init) & np.isfinite(log_rho)
    y = state["zeta_txt"].astype(np.float64)[moved]
    return {"spearman": float(spearmanr(log_rho[moved], y)[0]), "zeta_sd": float(np.std(y)), "n": int(moved.sum()),
            "spearman_draws": float(spearmanr(draw[moved], y)[0]), "points": (log_rho[moved], y)}


# --------------------------------------------------------------------------- claims


def read_runs(docs: Path, preset: str, split: str = "test") -> pd.DataFrame:
    """One row per committed run: method, seed, and its metrics on ``split`` (rows without that split left out)."""
    rows = []
    for path in sorted((docs / "replication" / preset / "runs").glob("*.json")):
        rec = json.loads(path.read_text())
        if split in rec:
            rows.append({"method": rec["method"], "seed": rec["seed"], **rec[split],
                         "zeta_spearman": rec.get("zeta", {}).get("spearman"), "seconds": rec.get("seconds")})
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["method", "seed", *METRICS, "zeta_spearman", "seconds"])


def per_seed(rows: pd.DataFrame, label: str, metric: str) -> pd.Series:
    return rows[rows["method"] == label].set_index("seed")[metric].sort_index()


def paired(rows: pd.DataFrame, a: str, b: str, metric: str) -> dict:
    """A − B over the seeds both ran (mean, Student-t 95 % CI)."""
    va, vb = per_seed(rows, a, metric), per_seed(rows, b, metric)
    seeds = va.index.intersection(vb.index)
    return {"a": a, "b": b, "metric": metric, "seeds": len(seeds),
            **paired_difference(va[seeds].tolist(), vb[seeds].tolist())}


def verdict(d: dict, lower_is_better: bool = False) -> str:
    """The claim "A >= B" read from the 95 % CI of A − B."""
    lo, hi = (-d["ci_high"], -d["ci_low"]) if lower_is_better else (d["ci_low"], d["ci_high"])
    if not np.isfinite(lo):
        return "undecided (fewer than 2 seeds)"
    return "holds (CI above 0)" if lo > 0 else "refuted (CI below 0)" if hi < 0 else "no difference shown (CI spans 0)"


def best_constant(val: pd.DataFrame) -> str | None:
    """The constant eta with the better mean zero-shot AUC on the validation split (never the test split)."""
    consts = val[val["method"].isin(list(DCL_ETAS))]
    if consts.empty:
        return None
    return str(consts.groupby("method")[VALIDATION_METRIC].mean().idxmax())


def claims(rows: pd.DataFrame, val: pd.DataFrame) -> list[dict]:
    """Each claim of the plan as a paired difference over seeds with its CI and verdict, where both sides ran."""
    have = set(rows["method"]) if len(rows) else set()
    out = []

    def add(claim, a, b, metrics, group):
        if a in have and b in have:
            for m in metrics:
                d = paired(rows, a, b, m)
                out.append({"group": group, "claim": claim, **d, "verdict": verdict(d, lower_is_better=m == "MedR")})

    add("DCL-eta_LM >= InfoNCE", "DCL-eta_LM", "InfoNCE", CLAIM_METRICS, "P1")
    best = best_constant(val)
    if best is not None:
        add(f"DCL-eta_LM >= the constant eta chosen on validation ({best})", "DCL-eta_LM", best, CLAIM_METRICS, "P1")
    add("DCL-eta_True >= DCL-eta_LM", "DCL-eta_True", "DCL-eta_LM", CLAIM_METRICS, "P2")
    add("NUCLR >= SogCLR", "NUCLR", "SogCLR", ("Recall", "MedR", "AUC"), "P3")
    if "NUCLR" in have:
        rho = per_seed(rows, "NUCLR", "zeta_spearman").dropna()
        d = pooled(rho.tolist())
        out.append({"group": "P3", "claim": "NUCLR's zeta rank-correlates with popularity", "a": "Spearman", "b": "0",
                    "metric": "rho", "seeds": len(rho), **d, "verdict": verdict(d)})
    add("DCL-eta_rule >= DCL-eta_LM", "DCL-eta_rule", "DCL-eta_LM", ("AUC", "CNR", "Recall"), "P4")
    return out


# --------------------------------------------------------------------------- the eta tables against the oracles


def eta_calibration(work: Path, docs: Path, preset: str, cfg: dict) -> dict | None:
    """`medclr lm calibrate` of the paper's eta table (every variant against q and rho_sent under the preset's
    draws), kept under docs/ so the report needs no WORK."""
    keep = docs / "replication" / preset / "calibration.json"
    if not keep.exists():
        if not (work / "manifest.parquet").exists():
            return None
        out = work / "calibration"
        run_cli(["lm", "calibrate", "--manifest", str(work / "manifest.parquet"), "--eta", str(eta_table(work, "paper")),
                 "--out", str(out), *cfg["eta_sampling"]])
        result = json.loads((out / "calibration.json").read_text())
        result.pop("reliability", None)
        keep.parent.mkdir(parents=True, exist_ok=True)
        keep.write_text(json.dumps(result, indent=1) + "\n")
    return json.loads(keep.read_text())


# --------------------------------------------------------------------------- the report


def fmt_mean_sd(g: pd.Series, digits: int) -> str:
    g = g.dropna()
    if g.empty:
        return "–"
    return f"{g.mean():.{digits}f} ± {g.std(ddof=1):.{digits}f}" if len(g) > 1 else f"{g.mean():.{digits}f}"


def ci(d: dict, digits: int = 3) -> str:
    return f"{d['mean']:+.{digits}f} [{d['ci_low']:+.{digits}f}, {d['ci_high']:+.{digits}f}]"


def calibration_lines(calib: dict | None) -> list[str]:
    if calib is None:
        return ["(no calibration yet)", ""]
    v = calib["variants"]
    lines = [f"`medclr lm calibrate` over {calib['n_pairs']} training pairs drawn as the preset draws them. The oracles: "
             f"q, DCL's false-negative rate of the sentence (mean {calib['mean_q']:.3f}), and rho_sent, how often its "
             f"key occurs among the pairs (mean {calib['mean_rho']:.4f}); Spearman(q, rho_sent) "
             f"{calib['spearman_q_rho']:+.2f}. Training caps eta at {calib.get('eta_max', 0.5):g}.", "",
             "| eta | E[eta] | E[eta]/E[q] | Spearman with q | E abs(1/(1-eta) - 1/(1-q)) | E[eta]/E[rho_sent] "
             "| Spearman with rho_sent |", "|---|---|---|---|---|---|---|"]
    names = {"paper": "paper (DCL-eta_LM: a = 0.2, k = 0.35)", "rule": "rule (DCL-eta_rule)",
             "sentence_fit": "a * p^k fitted to the rule-key frequency", "constant 0.05": "constant 0.05",
             "constant 0.1": "constant 0.1"}
    def rank(value) -> str:  # a constant eta has no ranking
        return "–" if value is None or not np.isfinite(value) else f"{value:+.3f}"

    for name, label in names.items():
        if name in v:
            x = v[name]
            lines.append(f"| {label} | {x['mean_eta']:.4f} | {x['q']['mean_ratio']:.3f} | {rank(x['q']['spearman'])} | "
                         f"{x['q']['misspecification']:.3f} | {x['rho_sent']['mean_ratio']:.2f} | "
                         f"{rank(x['rho_sent']['spearman'])} |")
    return lines + [""]


def write_results(path: Path, preset: str, cfg: dict, rows: pd.DataFrame, val: pd.DataFrame, verdicts: list[dict],
                  calib: dict | None, states: list[tuple[Run, str]]) -> None:
    old = path.read_text() if path.exists() else ""
    reading = old.split(READING_MARK, 1)[1] if READING_MARK in old else "\n## Reading\n\n(not written yet)\n"
    done = sum(s == "done" for _, s in states)
    records = [json.loads(p.read_text()) for p in sorted((path.parent / "replication" / preset / "runs").glob("*.json"))]
    warm = next((r["warm_start"] for r in records if (r.get("warm_start") or {}).get("test")), None)
    shas = {r["warm_start"]["weights_sha256"] for r in records if r.get("warm_start")}
    start = (f"every run fine-tuned for {cfg['steps']} steps from one InfoNCE warm start of {cfg['warm_steps']} steps "
            "(the same weights for every run; its SHA-256 is in each run's metrics)" if cfg["warm_steps"]
            else f"every run trained from scratch for {cfg['steps']} steps")
    lines = ["# Results: the papers' claims on CXR-Phantom", "",
             f"Rebuilt by `python bench/paper_replication.py --preset {preset} --report` from the run metrics under "
             f"`docs/replication/{preset}/runs/` ({done} of {len(states)} planned runs done). Data: the demo's "
             f"{cfg['n']}-study phantom, its domain LM and PLLs; {' '.join(o for o in cfg['train'] if 'cache' not in o)}; "
             f"{start}; only the loss and its eta differ. Evaluated on the phantom's test split: CheX5 zero-shot AUC "
             "with the paper's prompts (Table 2), MS-CXR-format grounding CNR/mIoU, box-sentence retrieval Recall "
             "(mean of R@10/50/100) and MedR. Paired differences are over the seeds both methods ran, with a "
             "Student-t 95 % CI; the constant eta is the one with the better zero-shot AUC on the validation split "
             "(the phantom's validation split has no MS-CXR boxes, so AUC is all it can read)."
             + (f" **The runs start from {len(shas)} different warm starts** (a warm start retrained on another "
                "machine need not be bit-identical): compare the weights_sha256 of their metrics." if len(shas) > 1 else ""),
             "",
             "## The claims", "",
             "| | Claim | Metric | seeds | mean A − B [95 % CI] | Verdict |", "|---|---|---|---|---|---|"]
    for v in verdicts:
        lines.append(f"| {v['group']} | {v['claim']} | {v['metric']} | {v['seeds']} | "
                     f"{ci(v, 1 if v['metric'] == 'MedR' else 3)} | {v['verdict']} |")
    if not verdicts:
        lines.append("| | (no claim has its runs yet) | | | | |")
    lines += ["", "## Every method (test split, mean ± sd over seeds)", "",
              "| Method | seeds | CheX5 AUC | ACC | CNR | mIoU | Recall | MedR |", "|---|---|---|---|---|---|---|---|"]
    if warm:
        lines.append(f"| *warm start (InfoNCE, {warm['steps']} steps): where every run starts* | 1 | "
                     + " | ".join(fmt_mean_sd(pd.Series([warm["test"].get(m)], dtype=float), 1 if m == "MedR" else 3)
                                  for m in METRICS) + " |")
    for label, g in rows.groupby("method", sort=False) if len(rows) else []:
        lines.append(f"| {label} | {len(g)} | " + " | ".join(fmt_mean_sd(g[m], 1 if m == "MedR" else 3) for m in METRICS) + " |")
    classes = [c for c in rows.columns if c.startswith("AUC ")]
    if classes:
        lines += ["", "Zero-shot AUC per CheX5 class:", "",
                  "| Method | " + " | ".join(c.removeprefix("AUC ") for c in classes) + " |", "|---|" + "---|" * len(classes)]
        for label, g in rows.groupby("method", sort=False):
            lines.append(f"| {label} | " + " | ".join(fmt_mean_sd(g[c], 2) for c in classes) + " |")
    if len(val):
        lines += ["", "Validation split (zero-shot AUC), the runs that choose the constant eta (and the --eta-grid's a, k):",
                  "", "| Method | seeds | CheX5 AUC |", "|---|---|---|"]
        for label, g in val.groupby("method", sort=False):
            lines.append(f"| {label} | {len(g)} | {fmt_mean_sd(g[VALIDATION_METRIC], 3)} |")
    lines += ["", "## The eta tables against DCL's oracle", ""] + calibration_lines(calib)
    lines += ["## The plan", "", "| | Method | seed | status |", "|---|---|---|---|"]
    lines += [f"| {r.priority} | {r.label} | {r.seed} | {s} |" for r, s in states]
    lines += ["", READING_MARK]
    path.write_text("\n".join(lines) + reading)


# --------------------------------------------------------------------------- main


def grid_search(work: Path, docs: Path, preset: str, cfg: dict, warm: Path | None) -> None:
    """The paper's alternative: DCL-eta_LM for each (a, k) of ETA_GRID, seed 0, chosen on the validation split."""
    for a, k in ETA_GRID:
        run = Run("grid", f"DCL-eta_LM a={a:g},k={k:g}", 0)
        do_run(work, docs, preset, run, cfg, warm, eta_override=[f"data.eta_a={a}", f"data.eta_k={k}"],
               splits=("validate",))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                    help="cpu: the campaign on 2 cores (default); gpu: one GPU, every run side by side; tiny: toy size")
    ap.add_argument("--work", type=Path, default=None,
                    help="data, checkpoints and logs (default /tmp/medclr_replication_PRESET): keep it between "
                         "invocations to resume a run mid-way")
    ap.add_argument("--docs", type=Path, default=REPO / "docs", help="where RESULTS.md and replication/ go")
    ap.add_argument("--status", action="store_true", help="print the plan with each run's status and stop")
    ap.add_argument("--report", action="store_true", help="rebuild RESULTS.md from the committed metrics and stop")
    ap.add_argument("--max-runs", type=int, default=None, help="stop after this many runs (default: the whole plan)")
    ap.add_argument("--eta-grid", action="store_true",
                    help="also train DCL-eta_LM over a small (a, k) grid (seed 0) and report it on the validation split")
    ap.add_argument("--workers", type=int, default=None, help="runs at a time (cpu: 1; gpu: 24)")
    args = ap.parse_args()
    preset = args.preset
    cfg = dict(PRESETS[preset])
    if args.workers:
        cfg["workers"] = args.workers
    work = args.work or Path(f"/tmp/medclr_replication_{preset}")
    docs = args.docs
    results = docs / "RESULTS.md"
    (work / "logs").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not (args.status or args.report):
        print_plan(work, docs, preset, cfg)
        prepare_data(work, cfg)
        prepare_eta(work, cfg)
        warm = warm_start(work, cfg)
        todo = [r for r in plan_runs(cfg) if status(work, docs, preset, r) != "done"][: args.max_runs]
        with ThreadPoolExecutor(cfg["workers"]) as pool:
            list(pool.map(lambda r: do_run(work, docs, preset, r, cfg, warm), todo))
        if args.eta_grid:
            grid_search(work, docs, preset, cfg, warm)
    states = [(r, status(work, docs, preset, r)) for r in plan_runs(cfg)]
    print_plan(work, docs, preset, cfg)
    if args.status:
        return 0
    rows, val = read_runs(docs, preset, "test"), read_runs(docs, preset, "validate")
    verdicts = claims(rows, val)
    write_results(results, preset, cfg, rows, val, verdicts, eta_calibration(work, docs, preset, cfg), states)
    for v in verdicts:
        print(json.dumps({k: v[k] for k in ("group", "claim", "metric", "seeds", "mean", "ci_low", "ci_high", "verdict")}))
    print(json.dumps({"results": str(results), "runs_done": sum(s == "done" for _, s in states), "runs": len(states)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
