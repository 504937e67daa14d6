"""`medclr demo`: the main job, end to end, on the embedded default data (CXR-Phantom).

By default it serves the reference model that ships inside medclr (:mod:`medclr.pretrained`): the phantom's
data, a retrieval index built with that model over the held-out studies, the app; no training. ``--train`` is the whole path from
scratch: data, domain LM, eta table, training, evaluation, index, app.

Steps run in order through the same CLI entry points a user would call; each
step is skipped when its output already exists, so a second run goes straight
to the app, and a training stopped part-way resumes from its last checkpoint.
A step whose command is not built in this version stops the demo
with a clear note (exit 0: everything that exists has run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from medclr import pretrained
from medclr.cli import is_built, main as medclr_main
from medclr.errors import MedclrError
from medclr.phantom.vocab import EVAL_PER_CLASS
from medclr.progress import add_progress_flag

HELP = "the main job: the shipped model on phantom data, served in the app (--train: train one first)"

EPILOG = """examples:
  medclr demo                       # phantom data + an index for the shipped model, then serve on 127.0.0.1
  medclr demo --no-serve --workdir out/demo
  medclr demo --train               # from scratch: data -> LM -> train -> eval -> index -> app (cpu_small: ~11 min)
  medclr demo --train --preset cpu_zeroshot # zero-shot labels on a CPU: 1,000 steps, ~40 minutes on 2 cores
  medclr demo --train --preset reference    # the shipped model's own recipe (hours on 2 cores; resumable)
Outputs under WORKDIR: phantom/, manifest.parquet, index/ (the shipped model's, over the validate and test
studies: the ones it never trained on); with --train also lm/,
eta.parquet, checkpoint/, metrics.json, report/ and index/ of the trained model."""


def default_workdir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "medclr" / "demo"


@dataclass
class Step:
    name: str
    command: str  # a `medclr` subcommand (an entry point of the medclr.commands group)
    argv: list[str]
    output: Path

    def done(self) -> bool:
        if self.command == "train":
            return training_finished(self.output.parent)
        return self.output.exists()


def training_finished(out: Path) -> bool:
    """A training is done when it reached its total steps: every checkpoint publishes its weights at OUT's top,
    so the weights alone mean only that some step was saved."""
    state = out / "trainer_state.json"
    if not state.is_file():
        return False
    record = json.loads(state.read_text())
    return record.get("step") is not None and record.get("step") == record.get("total_steps")


def served_model(args: argparse.Namespace) -> str:
    """The checkpoint the app serves: WORKDIR/checkpoint when training, else the shipped model asked for (``--model``,
    default the reference model); one line when this medclr ships none."""
    shipped = pretrained.names()
    name = args.model or (pretrained.REFERENCE if pretrained.REFERENCE in shipped else (shipped or [None])[0])
    if name is None:
        raise MedclrError("this medclr ships no trained model (`medclr models` lists none); "
                          "train one with `medclr demo --train`")
    if name not in shipped:
        raise MedclrError(f"--model {name}: not a shipped model; shipped: {', '.join(shipped) or 'none'} (medclr models)")
    return name


def preset(args: argparse.Namespace) -> str:
    """The training preset: ``--preset``, or for ``auto`` gpu_small where CUDA is there (2,500 steps
    of the negation-aware recipe, a few GPU minutes) and cpu_small elsewhere (450 steps of the 64 px model, ~8 CPU minutes)."""
    from medclr.presets import AUTO, auto_preset

    return auto_preset() if args.preset == AUTO else args.preset


def plan(work: Path, args: argparse.Namespace) -> list[Step]:
    steps = _steps(work, args)
    if getattr(args, "no_progress", False):  # every step's bars off, the libraries' included
        steps = [Step(s.name, s.command, [*s.argv, "--no-progress"], s.output) for s in steps]
    return steps


def _steps(work: Path, args: argparse.Namespace) -> list[Step]:
    if not getattr(args, "train", True):
        return [*_data_steps(work, args), _index_step(work, served_model(args))]
    return [*_data_steps(work, args), *_training_steps(work, args), _index_step(work, str(work / "checkpoint"))]


def index_dir(work: Path, checkpoint: str) -> Path:
    """One index per served model, so a trained model never answers from the shipped model's vectors: the
    shipped model's under index/NAME, the trained checkpoint's under index/checkpoint."""
    return work / "index" / Path(checkpoint).name


# the studies the app searches: the held-out ones, which the served model never trained on (its retrieval there is
# what it will do on new films, not recall of its training pairs), and less than half the images to encode
INDEXED_SPLITS = "validate,test"


def _index_step(work: Path, checkpoint: str) -> Step:
    out = index_dir(work, checkpoint)
    return Step(f"build the retrieval index ({Path(checkpoint).name})", "index",
                ["index", "build", "--checkpoint", checkpoint, "--manifest", str(work / "manifest.parquet"),
                 "--splits", INDEXED_SPLITS, "--out", str(out)], out / "index_manifest.json")


def _data_steps(work: Path, args: argparse.Namespace) -> list[Step]:
    phantom = work / "phantom"
    return [
        Step("generate CXR-Phantom", "phantom",
             ["phantom", "--out", str(phantom), "--n", str(args.n), "--seed", str(args.seed), "--source", "both",
              "--eval-per-class", str(args.eval_per_class),
              *([] if args.eval_normal is None else ["--eval-normal", str(args.eval_normal)])],
             phantom / "mimic-cxr-2.0.0-metadata.csv.gz"),
        Step("read it into a manifest", "prepare",
             ["prepare", "--mimic", str(phantom), "--views", "all", "--mscxr",
              str(phantom / "MS_CXR_Local_Alignment_v1.1.0.csv"), "--out", str(work / "manifest.parquet")],
             work / "manifest.parquet"),
    ]


def _training_steps(work: Path, args: argparse.Namespace) -> list[Step]:
    checkpoints = work / "checkpoint" / "checkpoints"
    # a training stopped part-way (Ctrl-C, a lost session) goes on from its last checkpoint, exactly
    resume = ["--resume"] if checkpoints.is_dir() and any(checkpoints.glob("step-*")) else []
    return [
        Step("fit the domain LM", "lm", ["lm", "fit", "--manifest", str(work / "manifest.parquet"), "--out", str(work / "lm")],
             work / "lm" / "config.json"),
        Step("score sentences (eta_LM)", "lm",
             ["lm", "score", "--manifest", str(work / "manifest.parquet"), "--model", str(work / "lm"), "--out",
              str(work / "eta.parquet")], work / "eta.parquet"),
        Step(f"train DCL-eta_LM ({preset(args)} preset)", "train",
             ["train", "--config", "dcl_lm", f"preset={preset(args)}", f"data.manifest={work / 'manifest.parquet'}",
              f"data.eta={work / 'eta.parquet'}", f"out={work / 'checkpoint'}", *resume],
             work / "checkpoint" / "model.safetensors"),
        Step("evaluate", "eval", ["eval", "--checkpoint", str(work / "checkpoint"), "--manifest", str(work / "manifest.parquet"),
                                  "--out", str(work / "report")], work / "report" / "metrics.json"),
    ]


def headline(metrics_path: Path) -> str:
    metrics = json.loads(metrics_path.read_text())
    summary, notes = metrics.get("summary", {}), metrics.get("summary_notes") or {}
    return ", ".join(f"{k} {summary[k]:.3f}" + (f" ({notes[k]})" if k in notes else "")
                     for k in ("AUC", "CNR", "Recall") if summary.get(k) is not None)


def _verdict(low: float, high: float, level: float) -> str:
    if low > level:
        return "reads it"
    if high < level:
        return "INVERTED: reads the opposite"
    return "not told from chance"


def standing(metrics: dict) -> str:
    """Where the model stands, per CheX5 class, against chance and the shuffled-label control; then
    grounding against its mismatched-phrase control and retrieval against chance."""
    lines = []
    zs = metrics.get("zeroshot") or {}
    if zs.get("per_class"):
        control = (zs.get("control_shuffled_labels") or {}).get("per_class_AUC", {})
        shown = zs.get("calibration") or {}  # the checkpoint's own validation record: what the app shows
        lines.append(f"  {'CheX5 zero-shot':<18} {'AUC [95% CI]':<22} {'pos/neg':>9}  chance  control  "
                     f"{'verdict':<28} app (validation AUC)")
        for name, r in zs["per_class"].items():
            lo, hi = r.get("AUC_CI") or (float("nan"), float("nan"))
            ctl = control.get(name, float("nan"))
            app = "not validated" if name not in shown else (
                f"{'shows' if shown[name]['reads'] else 'hides'} ({shown[name]['validation_AUC'] or float('nan'):.2f})")
            lines.append(f"  {name:<18} {r['AUC']:.3f} [{lo:.3f}, {hi:.3f}]  {r['n_pos']:>4}/{r['n'] - r['n_pos']:<4}"
                         f"  0.500   {ctl:.3f}    {_verdict(lo, hi, 0.5):<28} {app}")
        m = zs["macro"]
        over = (f" (over {len(m['AUC_classes'])} of {len(zs['per_class'])} classes; no AUC for "
                f"{', '.join(m['AUC_left_out'])})" if m.get("AUC_left_out") else "")
        lines.append(f"  {'macro':<18} {m['AUC']:.3f} [{m['AUC_CI'][0]:.3f}, {m['AUC_CI'][1]:.3f}]{over}")
    g = metrics.get("grounding") or {}
    if g.get("CNR"):
        cnr, ctl = g["CNR"]["macro"], g["CNR_control"]["macro"]
        ratio = cnr / ctl if ctl else float("nan")
        word = "localises" if ratio >= 1.5 else "no localised signal" if ratio < 1.2 else "weak localisation"
        lines.append(f"  grounding CNR {cnr:.3f} vs mismatched-phrase control {ctl:.3f} ({ratio:.2f}x), mIoU "
                     f"{g['mIoU']['macro']:.3f} vs {g['mIoU_control']['macro']:.3f}, {g['n_phrases']} phrases: {word}")
    r = metrics.get("retrieval") or {}
    chance = (r.get("chance") or {}).get("Recall")
    if r.get("Recall") is not None and chance:
        lines.append(f"  retrieval Recall {r['Recall']:.3f} vs chance {chance:.3f} ({r['Recall'] / chance:.2f}x)")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--workdir", type=Path, default=None, help="where everything is built (default: ~/.cache/medclr/demo)")
    parser.add_argument("--no-serve", action="store_true", help="build everything, do not start the app")
    parser.add_argument("--n", type=int, default=3000,
                        help="phantom pool studies to generate, split train/validate (default: 3000)")
    parser.add_argument("--eval-per-class", type=int, default=EVAL_PER_CLASS, metavar="K",
                        help=f"evaluation-set studies per CheX5 class (the test split; default: {EVAL_PER_CLASS})")
    parser.add_argument("--eval-normal", type=int, default=None, metavar="K",
                        help="normal studies (no finding) in the test split (default: a fifth of --eval-per-class)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the phantom data set (default 0)")
    parser.add_argument("--model", default=None, metavar="NAME",
                        help="the shipped model to serve (default: the reference model; `medclr models` lists them)")
    parser.add_argument("--train", action="store_true",
                        help="train a model from scratch first (domain LM, eta table, DCL-eta_LM, evaluation) and "
                             "serve it instead of the shipped one; a training stopped part-way resumes on the next run")
    parser.add_argument("--preset", choices=("auto", "cpu_small", "cpu_zeroshot", "gpu_small", "reference"),
                        default="auto",
                        help="with --train, the training preset: auto = gpu_small with CUDA (2,500 steps: the model "
                             "learns grounding and negation), else cpu_small (450 steps of a 64 px ResNet-18 cut after layer3, "
                             "~8 minutes on 2 cores); cpu_zeroshot = the same model trained for zero-shot labels "
                             "(1,000 steps, ~40 minutes on 2 cores; docs/training.md); reference = the shipped "
                             "model's recipe (3,000 steps at 128 px: hours on 2 cores)")
    parser.add_argument("--port", type=int, default=7860, help="the app's port at the end (default 7860; 0 = the first free one)")
    add_progress_flag(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.train and args.model:
        raise MedclrError("--model serves a shipped model; --train serves the one it trains: pass one of them")
    if not args.train and args.preset != "auto":
        raise MedclrError(f"--preset {args.preset} is a training preset: add --train to train with it")
    if not args.train and not args.model and not pretrained.names():
        print("no model ships with this medclr: the demo trains one (--train)")
        args.train = True
    work = (args.workdir or default_workdir()).expanduser()
    work.mkdir(parents=True, exist_ok=True)
    steps = plan(work, args)
    for number, step in enumerate(steps, 1):
        label = f"[{number}/{len(steps)}] {step.name}"
        if step.done():
            print(f"{label}: cached ({step.output})")
            continue
        if not is_built(step.command):
            print(f"{label}: `medclr {step.command}` is not built in this version; the demo is not yet complete.")
            print(f"done so far under {work}")
            return 0
        print(f"{label} ...", flush=True)
        start = time.perf_counter()
        code = medclr_main(step.argv)
        if code != 0:
            raise MedclrError(f"step '{step.name}' failed (exit {code}); fix the message above and rerun `medclr demo`")
        print(f"{label}: done in {time.perf_counter() - start:.0f} s")
    checkpoint = str(work / "checkpoint") if args.train else served_model(args)
    report = work / "report" / "metrics.json"
    if args.train and report.exists():
        shutil.copyfile(report, work / "metrics.json")  # the evaluation's output, where the docs say it is
        print(f"demo model on the phantom's evaluation sets: {headline(work / 'metrics.json')} "
              f"(report: {work / 'report' / 'report.md'})")
        print(standing(json.loads(report.read_text())))
    if args.no_serve:
        print(f"all steps done under {work}")
        return 0
    if not args.train:
        print(f"serving the shipped model {checkpoint} (`medclr models` shows its figures; `medclr demo --train` "
              "trains one of your own)")
    return medclr_main(["app", "--checkpoint", checkpoint, "--index", str(index_dir(work, checkpoint)),
                        "--port", str(args.port)])
