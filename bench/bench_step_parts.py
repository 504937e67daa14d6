"""Where a real training step spends its time: the parts of `medclr train`'s own step, on real data.

Builds the run exactly as `medclr train` does (config, preset, data, model, loss, optimizer: the
``training.loop.Run`` object), then times, round-robin over --steps rounds (a load change on a shared
machine hits every part alike; the figure is the minimum, the median is printed beside it):

* ``data``: the loader making one batch (crop, augmentation, tokenisation, hard negatives);
* ``image``: the image tower and the head's image side, forward + backward (gradient of ones);
* ``text``: the text tower on the batch's sentences and hard negatives, forward + backward, as the loop runs it
  (``model.text_buckets`` chunks of similar length); ``text_one_padding``: the same padded to the batch's longest;
* ``head_loss``: the head's scores and the loss (+ the hard-negative term) on detached tower outputs,
  forward + backward;
* ``optimizer``: clipping, AdamW and the scheduler;
* ``step``: the whole step as the loop runs it (forward, update), for the sum's sanity.

With ``--flops`` it also counts the step's floating-point operations (torch.utils.flop_counter:
matmuls and convolutions, forward and backward) and states the achieved rate against a float32 matmul
of the same machine in the same run (``matmul_gflops``): how far the step is from this CPU's limit.
Prints JSON lines {"bench": "step_parts", "metric", "value", "unit", ...}.

    OMP_NUM_THREADS=2 python bench/bench_step_parts.py --manifest W/manifest.parquet --eta W/eta.parquet \\
        --config dcl_lm preset=cpu_zeroshot --flops
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch


def emit(metric: str, value: float, unit: str, **extra) -> None:
    print(json.dumps({"bench": "step_parts", "metric": metric, "value": round(value, 6), "unit": unit, **extra}),
          flush=True)


def build_run(args: argparse.Namespace, out: str):
    from medclr.training.config import load_config
    from medclr.training.distributed import setup
    from medclr.training.loop import Run, preflight

    overrides = [f"data.manifest={args.manifest}", f"out={out}", *args.overrides]
    if args.eta:
        overrides.append(f"data.eta={args.eta}")
    cfg = load_config(args.config, overrides)
    cfg["log"]["progress"] = False
    plan = preflight(cfg, None, 1)
    env = setup("cpu", timeout_s=60.0)
    return Run(plan, env)


def parts(run) -> dict:
    """One callable per part, each on the same batch; returns name -> fn()."""
    from medclr.losses.distributed import score_blocks
    from medclr.losses.hard_negatives import hard_negative_term
    from medclr.training.loop import on_device

    it = iter(run.loader)
    batch = on_device(next(it), run.env.device)
    tower, head, loss = run.runner, run.head, run.loss
    b = batch["images"].shape[0]
    amp = run.amp_dtype

    def autocast():
        return torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None)

    def image():
        with autocast():
            feats = tower.image_encoder(batch["images"])
            side = feats.global_emb if head is None else head.image_side(feats)
        side.float().sum().backward()

    def text_run(buckets: int):
        def text():
            with autocast():
                emb = tower.text_encoder.embed(**batch["tokens"], buckets=buckets)
            emb.float().sum().backward()
        return text

    with torch.no_grad(), autocast():
        feats = tower.image_encoder(batch["images"])
        img_side0 = (feats.global_emb if head is None else head.image_side(feats)).float()
        txt0 = tower.text_encoder.embed(**batch["tokens"], buckets=tower.text_buckets).float()

    def head_loss():
        img_side = img_side0.detach().requires_grad_(True)
        txt_all = txt0.detach().requires_grad_(True)
        txt = txt_all[:b]
        kw = {"index": batch["index"], "eta": batch["eta"], "text_index": batch["text_index"]}
        value = loss(img_side, txt, **kw) if head is None else loss(sims=score_blocks(head.score, img_side, txt), **kw)
        if run.hard_weight > 0:
            rows = batch["hard_index"]
            score = (head or run.model.head).score_pairs
            value = value + run.hard_weight * hard_negative_term(
                score(img_side[rows], txt[rows]), score(img_side[rows], txt_all[b:]), run.hard_tau, rows.numel(), 1)
        value.backward()

    def optimizer():
        torch.nn.utils.clip_grad_norm_(run.all_params, run.clip or 1.0)
        run.optimizer.step()
        run.scheduler.step()

    def data():
        next(it)

    def step():
        value, _ = run.forward(batch)
        run.update(value)

    return {"data": data, "image": image, "text": text_run(tower.text_buckets), "text_one_padding": text_run(1),
            "head_loss": head_loss, "optimizer": optimizer, "step": step, "_batch": batch}


def tower_buckets(run) -> int:
    return int(getattr(run.runner, "text_buckets", 1))


def matmul_gflops(n: int = 1024, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", required=True)
    p.add_argument("--eta", default=None)
    p.add_argument("--config", default="dcl_lm")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (e.g. preset=cpu_zeroshot)")
    p.add_argument("--steps", type=int, default=5, help="timed rounds (each part once per round)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--flops", action="store_true", help="count the step's FLOPs and compare with a matmul")
    args = p.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out:
        run = build_run(args, out)
        fns = parts(run)
        batch = fns.pop("_batch")
        emit("sentences_per_step", float(batch["tokens"]["input_ids"].shape[0]), "sentences",
             tokens=int(batch["tokens"]["input_ids"].shape[1]), threads=torch.get_num_threads(),
             precision=str(run.amp_dtype or "fp32"))
        times = {k: [] for k in fns}
        for r in range(args.warmup + args.steps):
            for name, fn in fns.items():
                run.optimizer.zero_grad(set_to_none=True)
                if name == "optimizer":  # a step over real-sized gradients, as after a backward
                    for param in run.all_params:
                        param.grad = torch.full_like(param, 1e-3)
                t = time.perf_counter()
                fn()
                if r >= args.warmup:
                    times[name].append(time.perf_counter() - t)
        best = {k: min(v) for k, v in times.items()}
        for name, v in times.items():
            emit(f"{name}_s", best[name], "s", median=round(statistics.median(v), 6),
                 share_of_step=round(best[name] / best["step"], 3))
        emit("parts_sum_over_step", sum(best[k] for k in best if k not in ("step", "text_one_padding")) / best["step"],
             "ratio")
        emit("text_speedup_of_buckets", best["text_one_padding"] / best["text"], "ratio", vs="text_one_padding",
             buckets=tower_buckets(run))
        if args.flops:
            from torch.utils.flop_counter import FlopCounterMode

            counter = FlopCounterMode(display=False)
            with counter:
                fns["step"]()
            flops = counter.get_total_flops()
            peak = matmul_gflops()
            rate = flops / best["step"] / 1e9
            emit("step_gflop", flops / 1e9, "GFLOP")
            emit("achieved_gflops", rate, "GFLOP/s", vs="matmul_gflops", matmul_gflops=round(peak, 2),
                 fraction_of_matmul=round(rate / peak, 3))


if __name__ == "__main__":
    main()
