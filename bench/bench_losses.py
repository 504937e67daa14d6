"""Loss-only forward+backward time of every registered loss, relative to infonce on the same batch.

    python bench/bench_losses.py                      # B=256, d=128, CPU
    python bench/bench_losses.py --device cuda --batch 4096

Prints one JSON line per figure: {"bench": "losses", "metric": "<name>_fwd_bwd_time",
"value": <median time / median infonce time>, "unit": "x", "vs": "infonce"}, plus the
absolute infonce median in ms ("vs": null). Losses are timed round-robin inside each
repetition so that load from other processes on a shared machine hits all of them alike.
Stateful losses run in train() mode (table updates included in the time) with
num_samples = 10 * B and a fresh random batch of dataset indices each repetition.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from medclr.losses import LOSSES, build_loss


def _kwargs(name: str, tau: float, n: int) -> dict:
    kw = {} if name in ("siglip", "t_infonce") else {"tau": tau}
    if name in ("sogclr", "nuclr", "decl"):
        kw["num_samples"] = n
    return kw


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--tau", type=float, default=0.07)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    B, n = args.batch, 10 * args.batch
    gen = torch.Generator().manual_seed(args.seed)
    img0 = torch.randn(B, args.dim, generator=gen).to(dev)
    txt0 = (img0.cpu() + 0.5 * torch.randn(B, args.dim, generator=gen)).to(dev)
    eta = torch.full((B,), 0.05, device=dev)
    losses = {name: build_loss(name, **_kwargs(name, args.tau, n)).to(dev) for name in LOSSES}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in losses}
    for rep in range(args.warmup + args.reps):
        index = torch.randperm(n, generator=gen)[:B].to(dev)
        for name, loss in losses.items():
            img = img0.clone().requires_grad_(True)
            txt = txt0.clone().requires_grad_(True)
            sync()
            t0 = time.perf_counter()
            out = loss(img, txt, index=index, eta=eta)
            out.backward()
            sync()
            if rep >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["infonce"])
    common = {"batch": B, "dim": args.dim, "device": str(dev), "threads": torch.get_num_threads(), "reps": args.reps}
    print(json.dumps({"bench": "losses", "metric": "infonce_fwd_bwd_ms", "value": round(1e3 * base, 4),
                      "unit": "ms", "vs": None, **common}))
    for name in losses:
        ratio = statistics.median(times[name]) / base
        print(json.dumps({"bench": "losses", "metric": f"{name}_fwd_bwd_time", "value": round(ratio, 3),
                          "unit": "x", "vs": "infonce", **common}))


if __name__ == "__main__":
    main()
