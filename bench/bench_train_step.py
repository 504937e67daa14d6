"""Full training-step cost of every contrastive loss, relative to InfoNCE, measured in one run.

One step = image encoder forward (ResNet-18 at --size px) + text encoder forward (a random
BERT, --text-layers x --text-hidden) + loss + backward + AdamW step, on synthetic data (timing does
not depend on the pixel values). Losses are run round-robin, step after step, so a load change on
a shared machine hits every loss alike; each figure is the minimum over --steps timed steps after
--warmup untimed ones (other processes only ever add time, so the minimum is the least contaminated
estimate; the median is printed alongside). Also timed: the loss alone (forward + backward on B x D
embeddings), where the losses actually differ; InfoNCE through the LSE+NL head instead of the cosine
head (full step, as training/loop.py runs it: head.image_side + score_blocks + the loss module), with
the activation memory each step keeps for backward; and the two heads alone (head + InfoNCE, forward +
backward on the region grid).

On --device cuda every tensor lives on the GPU, the towers run under --precision (auto = bf16, as
`medclr train` runs them; the losses upcast to float32 themselves) and each timing drains the GPU's queue
at both ends.

Prints JSON lines {"bench": "train_step", "metric", "value", "unit", "vs"}; ratios are "vs":
"infonce" (the same step with InfoNCE in the same run) or "cosine_head" for the head-only ratio.

    OMP_NUM_THREADS=2 python bench/bench_train_step.py --batch 32 --size 224 --steps 3
    OMP_NUM_THREADS=2 python bench/bench_train_step.py --batch 64 --size 128 --output-stride 16 --losses infonce
    python bench/bench_train_step.py --device cuda --arch resnet50 --size 480 --batch 64 --channels-last --steps 10
    (on a busy shared machine, --threads 1 avoids OpenMP threads spinning against other processes)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from medclr.models import DualEncoder, ImageEncoder, LSENLHead, TextEncoder
from medclr.models.similarity import CosineHead

LOSSES = ("infonce", "siglip", "dcl", "dcl_lm", "sogclr", "nuclr", "decl", "t_infonce")


def emit(metric: str, value: float, unit: str, vs: str | None, **extra) -> None:
    print(json.dumps({"bench": "train_step", "metric": metric, "value": round(value, 6), "unit": unit, "vs": vs,
                      **extra}), flush=True)


def build_model(args: argparse.Namespace, head: torch.nn.Module) -> DualEncoder:
    from transformers import BertConfig, BertModel

    torch.manual_seed(args.seed)
    image = ImageEncoder(args.arch, joint_dim=args.joint_dim, pretrained="none", channels_last=args.channels_last,
                         output_stride=args.output_stride)
    cfg = BertConfig(vocab_size=args.vocab, hidden_size=args.text_hidden, num_hidden_layers=args.text_layers,
                     num_attention_heads=max(1, args.text_hidden // 64), intermediate_size=4 * args.text_hidden,
                     max_position_embeddings=max(64, args.seq_len))
    text = TextEncoder(BertModel(cfg, add_pooling_layer=False), tokenizer=None, joint_dim=args.joint_dim)
    return DualEncoder(image, text, head)


def saved_bytes(step) -> int:
    """Bytes of the tensors autograd keeps for backward during one training step: the activation
    memory of the step, counted the same way on a CPU and a GPU (peak RSS on a shared CPU is not)."""
    total, seen = [0], set()

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:  # views of one storage count once
            seen.add(key)
            total[0] += key[1]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return total[0]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_loss(name: str, num_samples: int):
    import inspect

    from medclr.losses import LOSSES, build_loss

    # Per-sample-table losses (sogclr, nuclr, decl) take the data-set size; the others do not.
    params = inspect.signature(LOSSES[name].__init__).parameters if name in LOSSES else {}
    return build_loss(name, **({"num_samples": num_samples} if "num_samples" in params else {}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=224, help="square image side in pixels")
    p.add_argument("--steps", type=int, default=3, help="timed steps per loss (median reported)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--losses", default=",".join(LOSSES))
    p.add_argument("--arch", default="resnet18", choices=["resnet18", "resnet50"])
    p.add_argument("--text-layers", type=int, default=4)
    p.add_argument("--text-hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--seq-len", type=int, default=24)
    p.add_argument("--joint-dim", type=int, default=128)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--output-stride", type=int, default=32, choices=[16, 32],
                   help="16: ResNet's last stage unstrided (the gpu_small preset's 8x8 grid at 128 px)")
    p.add_argument("--no-lse", action="store_true", help="skip the LSE+NL-head step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = leave as is)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="autocast dtype of the towers: auto = bf16 on cuda, fp32 on cpu")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    amp = torch.bfloat16 if args.precision == "bf16" or (args.precision == "auto" and dev.type == "cuda") else None
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    try:
        from medclr.losses import build_loss  # noqa: F401
    except ImportError as exc:
        print(f"bench_train_step: medclr.losses.build_loss is not available yet ({exc})", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.losses.split(",") if n.strip()]
    if "infonce" not in names:
        names.insert(0, "infonce")

    b, n_data = args.batch, 10 * args.batch
    g = torch.Generator().manual_seed(args.seed)
    images = torch.rand(b, 1, args.size, args.size, generator=g)
    lengths = torch.randint(args.seq_len // 2, args.seq_len + 1, (b,), generator=g)
    attn = (torch.arange(args.seq_len)[None, :] < lengths[:, None]).long()
    ids = torch.randint(5, args.vocab, (b, args.seq_len), generator=g) * attn
    text = {"input_ids": ids, "attention_mask": attn}
    eta = torch.rand(b, generator=g) * 0.2  # per-pair class probabilities for dcl_lm
    index0 = torch.randperm(n_data, generator=g)[:b]
    images, eta, index0 = images.to(dev), eta.to(dev), index0.to(dev)
    text = {k: v.to(dev) for k, v in text.items()}

    # One model and optimizer shared by all losses: only the timing matters here, and a single
    # copy keeps memory at one model on a shared machine.
    model = build_model(args, CosineHead(args.joint_dim)).to(dev).train()
    losses = {n: make_loss(n, n_data).to(dev).train() for n in names}
    # Learnable loss parameters (SigLIP's t and b, ...) are trained too; AdamW skips the ones of the
    # losses not used in a step (their grad is None).
    loss_params = [p for fn in losses.values() for p in fn.parameters()]
    opt = torch.optim.AdamW([{"params": list(model.parameters())}, {"params": loss_params, "weight_decay": 0.0}],
                            lr=1e-5, weight_decay=1e-4)

    def timed_step(m: DualEncoder, o: torch.optim.Optimizer, loss_of) -> float:
        sync(dev)
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=amp or torch.float32, enabled=amp is not None):
            img, txt = m.encode_image(images), m.encode_text(text)
            loss = loss_of(m, img, txt)
        o.zero_grad(set_to_none=True)
        loss.backward()
        o.step()
        sync(dev)
        dt = time.perf_counter() - t0
        if not torch.isfinite(loss):
            raise RuntimeError(f"non-finite loss {loss.item()}")
        return dt

    runners = {}
    for n in names:
        def run(s: int, fn=losses[n]) -> float:
            index = (index0 + s) % n_data  # distinct indices per step, as an epoch would give
            return timed_step(model, opt, lambda m, i, t: fn(i.global_emb, t.embedding, index=index, eta=eta))
        runners[n] = run
    if not args.no_lse:
        # InfoNCE through the LSE+NL head exactly as training/loop.py runs it: the head's image side
        # (NL-contextualised unit cells) and its blocks from score_blocks, into the loss module.
        from medclr.losses.distributed import score_blocks

        lse_model = build_model(args, LSENLHead(args.joint_dim)).to(dev).train()
        lse_opt = torch.optim.AdamW(lse_model.parameters(), lr=1e-5, weight_decay=1e-4)
        lse_infonce = make_loss("infonce", n_data).to(dev)

        def lse_loss(m, i, t):
            return lse_infonce(sims=score_blocks(m.head.score, m.head.image_side(i), t.embedding))

        runners["infonce_lse_nl_head"] = lambda s: timed_step(lse_model, lse_opt, lse_loss)

    saved = {"infonce": saved_bytes(lambda: runners["infonce"](0))}
    if not args.no_lse:
        saved["infonce_lse_nl_head"] = saved_bytes(lambda: runners["infonce_lse_nl_head"](0))
    times: dict[str, list[float]] = {n: [] for n in runners}
    order = list(runners)
    for s in range(args.warmup + args.steps):
        for k in range(len(order)):  # rotate the start each round: no loss always runs first
            n = order[(s + k) % len(order)]
            dt = runners[n](s)
            if s >= args.warmup:
                times[n].append(dt)
    best = {n: min(v) for n, v in times.items()}
    med = {n: statistics.median(v) for n, v in times.items()}

    # Loss alone on B x D embeddings (forward + backward): the only part that differs.
    def loss_only(loss_fn, reps: int = 30) -> float:
        ts = []
        e_img = torch.nn.functional.normalize(torch.randn(b, args.joint_dim, generator=g), dim=-1).to(dev)
        e_txt = torch.nn.functional.normalize(torch.randn(b, args.joint_dim, generator=g), dim=-1).to(dev)
        for r in range(reps + 3):
            a, t = e_img.clone().requires_grad_(), e_txt.clone().requires_grad_()
            sync(dev)
            t0 = time.perf_counter()
            loss_fn(a, t, index=(index0 + r) % n_data, eta=eta).backward()
            sync(dev)
            if r >= 3:
                ts.append(time.perf_counter() - t0)
        return ts

    lt = {n: [] for n in names}
    for _ in range(3):  # interleaved rounds, as for the full step
        for n in names:
            lt[n] += loss_only(losses[n], reps=10)
    lbest = {n: min(v) for n, v in lt.items()}

    common = {"batch": b, "size": args.size, "arch": args.arch, "threads": torch.get_num_threads(),
              "steps": args.steps, "stat": "min", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
              else "cpu", "precision": "bf16" if amp else "fp32"}
    emit("step_time_infonce", best["infonce"], "s", None, median_s=round(med["infonce"], 4), **common)
    for n in best:
        if n != "infonce":
            emit(f"step_time_ratio_{n}", best[n] / best["infonce"], "x", "infonce", seconds=round(best[n], 4),
                 median_ratio=round(med[n] / med["infonce"], 4), **common)
    emit("saved_activations_infonce", saved["infonce"] / 2**20, "MiB", None, **common)
    if "infonce_lse_nl_head" in saved:
        emit("saved_activations_ratio_lse_nl_head", saved["infonce_lse_nl_head"] / saved["infonce"], "x", "infonce",
             mib=round(saved["infonce_lse_nl_head"] / 2**20, 2), **common)
    emit("loss_only_time_infonce", lbest["infonce"] * 1e3, "ms", None, **common)
    for n in names:
        if n != "infonce":
            emit(f"loss_only_ratio_{n}", lbest[n] / lbest["infonce"], "x", "infonce", ms=round(lbest[n] * 1e3, 4),
                 **common)
    if not args.no_lse:
        # Head + symmetric InfoNCE alone (forward + backward) on B x D x h x w regions: what the
        # LSE+NL head adds over the cosine head, without the encoders' noise.
        from medclr.losses.functional import info_nce
        from medclr.models import ImageFeatures, grid_size

        h, w = grid_size(args.size, args.size, args.output_stride)
        heads = {"cosine": CosineHead(args.joint_dim).to(dev), "lse_nl": LSENLHead(args.joint_dim).to(dev)}
        with torch.no_grad():
            heads["lse_nl"].nl.out.weight.normal_(0, 0.02)  # off the zero init, as after training starts
        regions0 = torch.randn(b, args.joint_dim, h, w, generator=g).to(dev)
        text0 = torch.randn(b, args.joint_dim, generator=g).to(dev)
        ht: dict[str, list[float]] = {k: [] for k in heads}
        for _ in range(3):
            for k, head in heads.items():
                for r in range(13):
                    reg, txt = regions0.clone().requires_grad_(), text0.clone().requires_grad_()
                    sync(dev)
                    t0 = time.perf_counter()
                    feats = ImageFeatures(reg, torch.nn.functional.normalize(reg.mean((2, 3)), dim=-1))
                    sim = head(feats, torch.nn.functional.normalize(txt, dim=-1))
                    (0.5 * (info_nce(sim, 0.07) + info_nce(sim.T, 0.07))).backward()
                    sync(dev)
                    if r >= 3:
                        ht[k].append(time.perf_counter() - t0)
        emit("head_only_time_cosine", min(ht["cosine"]) * 1e3, "ms", None, grid=[h, w], **common)
        emit("head_only_ratio_lse_nl", min(ht["lse_nl"]) / min(ht["cosine"]), "x", "cosine_head",
             ms=round(min(ht["lse_nl"]) * 1e3, 4), grid=[h, w], **common)
    return 0


if __name__ == "__main__":
    sys.exit(main())
