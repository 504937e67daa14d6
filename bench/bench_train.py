"""`medclr train` throughput on CPU: pairs/s for ResNet-18 + the small BERT, end to end.

End to end = what `medclr train` does per step: cached image -> random crop/brightness/contrast/gamma
(MONAI) -> sentence draw -> tokenise -> image + text towers -> loss -> backward -> AdamW; measured
from the run's own metrics (pairs_per_s, one line per step, the first --warmup steps dropped, median).
Compared in the same run:
  * the model alone (same model, loss and optimizer; one pre-made batch reused, no data pipeline):
    `pipeline_efficiency` = end-to-end / model-only (1.0 = the data pipeline costs nothing);
  * the data pipeline alone (DataLoader batches/s, as pairs/s), vs end-to-end;
  * NUCLR instead of InfoNCE end to end (per-sample tables, two passes), vs InfoNCE.
Data: synthetic 160 px radiograph-like images and two-sentence reports written to a temp dir; the
text model has the size `medclr lm fit` produces (4 layers, hidden 256, 4 heads, vocab 6000), random
weights (speed does not depend on them). cpu_small preset: 96 px crops of 108 px, batch 64.

    OMP_NUM_THREADS=2 python bench/bench_train.py              # ~2 minutes on 2 cores
    python bench/bench_train.py --steps 12 --batch 64 --crop 224 --resize 256

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
    """n synthetic images + reports as a manifest, and a text model of `medclr lm fit`'s size."""
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
                     "sentences": SENTENCES[i % 4]})
    manifest = write_manifest(pd.DataFrame(rows), work / "manifest.parquet", work)
    fit = FitConfig()
    tok = train_tokenizer([s for ss in SENTENCES for s in ss] * 4, min_frequency=1, max_length=fit.max_length)
    cfg = BertConfig(vocab_size=fit.vocab_size, hidden_size=fit.hidden, num_hidden_layers=fit.layers,
                     num_attention_heads=fit.heads, intermediate_size=4 * fit.hidden,
                     max_position_embeddings=fit.max_length, pad_token_id=tok.pad_token_id)
    BertForMaskedLM(cfg).save_pretrained(work / "lm")
    tok.save_pretrained(work / "lm")
    return manifest, work / "lm"


def overrides(args, manifest: Path, lm: Path, out: Path) -> list[str]:
    return ["preset=cpu_small", f"data.manifest={manifest}", f"model.text={lm}", f"out={out}",
            f"data.resize={args.resize}", f"data.crop={args.crop}", f"train.batch_size={args.batch}",
            f"train.max_steps={args.warmup + args.steps}", "train.max_minutes=null", "log.every=1",
            "log.progress=false", "val.every=null", f"ckpt.every={10 ** 6}", "data.num_workers=0"]


def end_to_end(config: str, args, manifest: Path, lm: Path, out: Path) -> float:
    from medclr.training.config import load_config
    from medclr.training.loop import train

    train(load_config(config, overrides(args, manifest, lm, out)))
    rates = [json.loads(line)["pairs_per_s"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(rates[args.warmup:])


def model_only_and_data(args, manifest: Path, lm: Path, out: Path) -> tuple[float, float]:
    import torch

    from medclr.training.config import load_config
    from medclr.training.data import Collate, PairDataset
    from medclr.training.loop import TwoTower, _build, preflight
    from medclr.training.optim import build_optimizer, param_groups
    from medclr.training.sampler import GlobalBatchSampler

    cfg = load_config("infonce", overrides(args, manifest, lm, out))
    plan = preflight(cfg, None, 1)
    from medclr.training.distributed import DistEnv

    model, loss = _build(plan, DistEnv())
    ds = PairDataset(plan.table, cfg)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=GlobalBatchSampler(len(ds), args.batch),
                                         collate_fn=Collate(model.text_encoder))
    it = iter(loader)
    for _ in range(2):
        next(it)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        batch = next(it)
    data_rate = args.steps * args.batch / (time.perf_counter() - t0)

    tower = TwoTower(model.image_encoder, model.text_encoder).train()
    opt = build_optimizer(param_groups(model, loss, [tower], 3e-4, 1e-4, 0.01), cfg, torch.device("cpu"))
    times = []
    for k in range(args.warmup + args.steps):
        t = time.perf_counter()
        img, txt = tower(batch["images"], batch["tokens"])
        value = loss(img.float(), txt.float(), index=batch["index"])
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
        opt.step()
        if k >= args.warmup:
            times.append(time.perf_counter() - t)
    return args.batch / statistics.median(times), data_rate


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--resize", type=int, default=108)
    ap.add_argument("--crop", type=int, default=96)
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = {"device": "cpu", "threads": torch.get_num_threads(), "batch": args.batch, "crop": args.crop,
           "image": "resnet18", "text": "bert L4 H256 V6000"}
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        work = Path(tmp)
        manifest, lm = make_data(work, max(args.images, 2 * args.batch), args.resize + 16)
        infonce = end_to_end("infonce", args, manifest, lm, work / "run_infonce")
        nuclr = end_to_end("nuclr", args, manifest, lm, work / "run_nuclr")
        model_rate, data_rate = model_only_and_data(args, manifest, lm, work / "run_model")
    emit("pairs_per_s", infonce, "pairs/s", None, loss="infonce", **ctx)
    emit("pairs_per_s_model_only", model_rate, "pairs/s", None, loss="infonce", **ctx)
    emit("pipeline_efficiency", infonce / model_rate, "x", "model_only", **ctx)
    emit("data_pairs_per_s", data_rate, "pairs/s", None, workers=0, **ctx)
    emit("data_vs_train", data_rate / infonce, "x", "pairs_per_s", **ctx)
    emit("pairs_per_s_nuclr", nuclr, "pairs/s", None, loss="nuclr", **ctx)
    emit("nuclr_vs_infonce", nuclr / infonce, "x", "infonce", **ctx)


if __name__ == "__main__":
    main()
