"""`medclr train` throughput: end to end vs the same model on pre-made device tensors, and losses vs InfoNCE.

Every figure comes from `medclr train`'s own step (training/loop.py: ``Run.forward`` + ``Run.update``:
transfer, intensity augmentation when it runs on the device, towers under the run's precision, loss,
backward, clipping, AdamW), measured in one run:
  * end to end, per ``data.augment_on`` placement (loader | device): batches from the run's own
    DataLoader (cached image -> crop -> intensity augmentation in the loader or batched on the device
    -> sentence draw -> tokenise -> pinned, non-blocking transfer);
  * model only: the same run's step on one batch made beforehand, already on the device, augmented
    and float32: what a perfectly fed device gives. ``vs`` = end to end / model only (issue 18's goal
    on a GPU: >= 0.85);
  * data only: loader batches made ready on the device (augmentation included), as pairs/s;
  * the CPU time of one training view per placement, in one thread as a loader worker makes it (min
    over --rounds passes over 16 items; ``--views-only`` measures just this, at any size, in seconds);
  * train.precision=auto against fp32, model only and end to end (auto = bf16 on CUDA and on CPUs with
    AVX512-BF16/AMX; ``vs`` = fp32 seconds / auto seconds, so > 1 is auto's speed-up);
  * NUCLR and DCL-eta_LM full steps on their own pre-made device batches vs InfoNCE's (goal <= 1.05x;
    NUCLR without its zeta freeze, eta = a synthetic per-pair class probability, loss.eta_source=true).
The configurations run round-robin, --rounds rounds of --steps timed steps each after --warmup untimed
steps, so a load change on a shared machine hits all alike; rates and ratios are medians over rounds
(ratios taken within a round). Data: synthetic radiograph-like images (resize + 16 px) and two-sentence
reports in a temp dir; a text model of `medclr lm fit`'s size (4 layers, hidden 256, vocab 6000; random
weights: speed does not depend on them). Defaults: CPU = preset cpu_small at 96 px crops of 108 px;
CUDA = preset paper (ResNet-50, LSE+NL head, 480 px crops of 512 px, bf16, channels-last); batch 64.

    OMP_NUM_THREADS=2 python bench/bench_train.py                    # ~5 minutes on 2 cores
    python bench/bench_train.py --device cuda --steps 30 --warmup 5  # (bench/gpu_suite.sh)
    python bench/bench_train.py --views-only --resize 512 --crop 480   # per-view cost at the paper's size

Prints JSON lines {"bench": "train", "metric", "value", "unit", "vs", ...context}.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from itertools import repeat
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SENTENCES = [["There is a small right pleural effusion.", "Heart size is normal."],
             ["No pleural effusion or pneumothorax.", "The lungs are clear."],
             ["Moderate cardiomegaly is present.", "Mild pulmonary edema."],
             ["Left lower lobe opacity may reflect pneumonia.", "No pneumothorax."]]


def emit(metric: str, value: float, unit: str, vs, **ctx) -> None:
    print(json.dumps({"bench": "train", "metric": metric, "value": round(float(value), 3), "unit": unit, "vs": vs,
                      **ctx}), flush=True)


def make_data(work: Path, n: int, size: int) -> tuple[Path, Path]:
    """n synthetic images + reports (with a class probability for eta) as a manifest, and a text model of
    `medclr lm fit`'s size."""
    import pandas as pd
    from PIL import Image
    from transformers import BertConfig, BertForMaskedLM

    from medclr.data.manifest import write_manifest
    from medclr.lm.fit import FitConfig, train_tokenizer

    rng = np.random.default_rng(0)
    (work / "img").mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[:size, :size]
    rows = []
    for i in range(n):
        img = 50 + 40 * rng.random((size, size))
        cy, cx, r = rng.uniform(0.3, 0.7, 2).tolist() + [rng.uniform(0.05, 0.2)]
        img[(yy - cy * size) ** 2 + (xx - cx * size) ** 2 < (r * size) ** 2] += 120 * (i % 4) / 3
        Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(work / "img" / f"{i}.png")
        rows.append({"subject_id": str(i), "study_id": str(i), "dicom_id": str(i), "image_path": f"img/{i}.png",
                     "view": "PA", "split": "train", "report": " ".join(SENTENCES[i % 4]), "text": "",
                     "sentences": SENTENCES[i % 4], "latent_class_prob": float(rng.uniform(0.05, 0.3))})
    manifest = write_manifest(pd.DataFrame(rows), work / "manifest.parquet", work)
    fit = FitConfig()
    tok = train_tokenizer([s for ss in SENTENCES for s in ss] * 4, min_frequency=1, max_length=fit.max_length)
    cfg = BertConfig(vocab_size=fit.vocab_size, hidden_size=fit.hidden, num_hidden_layers=fit.layers,
                     num_attention_heads=fit.heads, intermediate_size=4 * fit.hidden,
                     max_position_embeddings=fit.max_length, pad_token_id=tok.pad_token_id)
    BertForMaskedLM(cfg).save_pretrained(work / "lm")
    tok.save_pretrained(work / "lm")
    return manifest, work / "lm"


DEFAULTS = {"cpu": {"preset": "cpu_small", "resize": 108, "crop": 96},
            "cuda": {"preset": "paper", "resize": 512, "crop": 480}}
PLACES = ("loader", "device")
LOSSES = {"infonce": [], "nuclr": ["loss.freeze_zeta_epochs=0"], "dcl_lm": ["loss.eta_source=true"]}


def overrides(args, manifest: Path, lm: Path, out: Path, augment_on: str, loss: str,
              precision: str = "auto") -> list[str]:
    workers = [] if args.workers is None else [f"data.num_workers={args.workers}"]
    return [f"preset={args.preset}", f"data.manifest={manifest}", f"model.text={lm}", f"out={out}",
            f"data.resize={args.resize}", f"data.crop={args.crop}", f"train.batch_size={args.batch}",
            f"train.device={args.device}", f"data.augment_on={augment_on}", f"train.compile={args.compile}",
            f"train.max_steps={10 ** 6}", "train.max_minutes=null", "log.progress=false", "val.every=null",
            f"ckpt.every={10 ** 6}", f"train.precision={precision}", *workers, *LOSSES[loss]]


def make_run(args, manifest: Path, lm: Path, out: Path, augment_on: str, loss: str, precision: str = "auto"):
    """A `medclr train` run, built but not started: its model, loss, optimizer, dataset and loader."""
    from medclr.training.config import load_config
    from medclr.training.distributed import setup
    from medclr.training.loop import Run, preflight

    out.mkdir(parents=True)
    plan = preflight(load_config(loss, overrides(args, manifest, lm, out, augment_on, loss, precision)), None, 1)
    return Run(plan, setup(args.device))


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def train_step(run, batch) -> None:
    value, _ = run.forward(batch)
    run.update(value)
    run.step += 1


def data_step(run, batch) -> None:
    from medclr.training.loop import on_device

    on_device(batch, run.env.device)


def timed(device: str, work, run, batches, n: int) -> float:
    """Seconds for n calls of work(run, next(batches)), the device's queue drained at both ends."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        work(run, next(batches))
    sync(device)
    return time.perf_counter() - t0


def configurations(args, manifest: Path, lm: Path, work: Path) -> dict:
    """name -> (work, run, batch iterator): end to end and data only per placement, model only per loss."""
    from medclr.training.loop import on_device

    runs = {place: make_run(args, manifest, lm, work / f"run_{place}", place, "infonce") for place in PLACES}
    runs.update({loss: make_run(args, manifest, lm, work / f"run_{loss}", "loader", loss) for loss in LOSSES
                 if loss != "infonce"})
    # the same step in float32: what train.precision=auto gains (bf16 on hardware that has it)
    runs["fp32"] = make_run(args, manifest, lm, work / "run_fp32", "loader", "infonce", "fp32")
    # pre-made first: with persistent workers a second iter() would restart the end-to-end iterator
    premade = {name: on_device(next(iter(run.loader)), run.env.device)
               for name, run in [("infonce", runs["loader"]), ("nuclr", runs["nuclr"]), ("dcl_lm", runs["dcl_lm"]),
                                 ("fp32", runs["fp32"])]}
    out = {}
    for place in PLACES:
        it = iter(runs[place].loader)
        out[f"end_to_end_{place}"] = (train_step, runs[place], it)
        out[f"data_only_{place}"] = (data_step, runs[place], it)
    for loss, batch in premade.items():
        out[f"model_only_{loss}"] = (train_step, runs["loader" if loss == "infonce" else loss], repeat(batch))
    out["end_to_end_fp32"] = (train_step, runs["fp32"], iter(runs["fp32"].loader))
    return out


def measure(args, manifest: Path, lm: Path, work: Path) -> dict[str, list[float]]:
    """name -> seconds per step in each round."""
    confs = configurations(args, manifest, lm, work)
    for work_fn, run, batches in confs.values():
        timed(args.device, work_fn, run, batches, args.warmup)
    seconds = {name: [] for name in confs}
    for _ in range(args.rounds):
        for name, (work_fn, run, batches) in confs.items():
            seconds[name].append(timed(args.device, work_fn, run, batches, args.steps) / args.steps)
    return seconds


def view_costs(args, manifest: Path, lm: Path, work: Path) -> dict[str, list[float]]:
    """placement -> CPU seconds per training view, per pass over 16 items, in one thread."""
    import torch

    from medclr.training.config import load_config
    from medclr.training.data import PairDataset, load_table

    cfg = load_config("infonce", overrides(args, manifest, lm, work / "views", "auto", "infonce"))
    table = load_table(cfg)
    sets = {place: PairDataset(table, cfg, device_augment=place == "device") for place in PLACES}
    threads, costs = torch.get_num_threads(), {place: [] for place in PLACES}
    torch.set_num_threads(1)
    for r in range(args.rounds):
        for place, ds in sets.items():
            t0 = time.process_time()
            for i in range(16):
                ds[(r, i % len(ds))]
            costs[place].append((time.process_time() - t0) / 16)
    torch.set_num_threads(threads)
    return costs


def report_views(args, costs: dict[str, list[float]], ctx: dict) -> None:
    for place in PLACES:
        emit("view_cpu_ms", 1e3 * min(costs[place]), "ms", None, augment_on=place, resize=args.resize,
             median_ms=round(1e3 * statistics.median(costs[place]), 3), **{**ctx, "stat": "min", "threads": 1})


def report(args, seconds: dict[str, list[float]], ctx: dict) -> None:
    def rate(name):
        return statistics.median(args.batch / s for s in seconds[name])

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(seconds[a], seconds[b]))

    emit("pairs_per_s_model_only", rate("model_only_infonce"), "pairs/s", None, loss="infonce", **ctx)
    for place in PLACES:
        emit("pairs_per_s", rate(f"end_to_end_{place}"), "pairs/s", None, augment_on=place, loss="infonce", **ctx)
        emit("end_to_end_vs_model_only", ratio("model_only_infonce", f"end_to_end_{place}"), "x", "model_only",
             augment_on=place, goal=">= 0.85 on a GPU", **ctx)
        emit("data_pairs_per_s", rate(f"data_only_{place}"), "pairs/s", None, augment_on=place, **ctx)
    import torch

    from medclr.training.loop import native_bf16

    auto = "bf16" if native_bf16(torch.device(args.device)) else "fp32"
    for kind, auto_run in (("model_only", "model_only_infonce"), ("end_to_end", "end_to_end_loader")):
        emit(f"{kind}_speedup_auto_vs_fp32", ratio(f"{kind}_fp32", auto_run), "x", "fp32", auto_precision=auto, **ctx)
    for loss in LOSSES:
        if loss != "infonce":
            emit(f"step_ratio_{loss}", ratio(f"model_only_{loss}", "model_only_infonce"), "x", "infonce",
                 seconds=round(statistics.median(seconds[f"model_only_{loss}"]), 4), goal="<= 1.05", **ctx)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per configuration and round")
    ap.add_argument("--rounds", type=int, default=3, help="round-robin rounds over the configurations")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per configuration first")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--preset", default=None, help="training preset (default: cpu_small on cpu, paper on cuda)")
    ap.add_argument("--resize", type=int, default=None, help="default: 108 on cpu, 512 on cuda")
    ap.add_argument("--crop", type=int, default=None, help="default: 96 on cpu, 480 on cuda")
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--workers", type=int, default=None, help="data.num_workers (default: the config's auto)")
    ap.add_argument("--compile", action="store_true", help="train.compile=true (torch.compile the towers)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--views-only", action="store_true", help="only the CPU time of one training view")
    args = ap.parse_args(argv)
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    logging.basicConfig(level=logging.WARNING)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
           "threads": torch.get_num_threads(), "batch": args.batch, "crop": args.crop, "preset": args.preset,
           "text": "bert L4 H256 V6000", "compile": args.compile, "stat": f"median of {args.rounds} rounds"}
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        work = Path(tmp)
        manifest, lm = make_data(work, max(args.images, 2 * args.batch), args.resize + 16)
        report_views(args, view_costs(args, manifest, lm, work), ctx)
        if not args.views_only:
            report(args, measure(args, manifest, lm, work), ctx)


if __name__ == "__main__":
    main()
