"""Cost of a finer region grid: the full training step at several crop sizes and output strides.

One step = ResNet-18 forward at the crop size + the 4-layer text model + InfoNCE through the head
(cosine or LSE+NL, as training/loop.py runs it) + backward + AdamW, batch 64, synthetic data. The
configurations run round-robin, step after step, so a load change on a shared machine hits all
alike; each figure is the minimum over --steps timed steps, and the ratio is against the old
cpu_small preset (96 px, stride 32, cosine head) in the same run.

Prints JSON lines {"bench": "grid", "metric", "value", "unit", "vs", "grid", ...}.

    OMP_NUM_THREADS=2 python bench/bench_grid.py --steps 4
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from medclr.losses import build_loss
from medclr.losses.distributed import score_blocks
from medclr.models import DualEncoder, ImageEncoder, LSENLHead, TextEncoder
from medclr.models.similarity import CosineHead

# (name, crop px, output stride, head)
CONFIGS = [("96px_s32_cosine", 96, 32, "cosine"), ("96px_s32_lse_nl", 96, 32, "lse_nl"),
           ("96px_s16_lse_nl", 96, 16, "lse_nl"), ("112px_s16_lse_nl", 112, 16, "lse_nl"),
           ("128px_s16_lse_nl", 128, 16, "lse_nl")]


def model_for(size_stride_head, seed: int) -> DualEncoder:
    from transformers import BertConfig, BertModel

    _, _, stride, head = size_stride_head
    torch.manual_seed(seed)
    image = ImageEncoder("resnet18", joint_dim=128, pretrained="none", output_stride=stride)
    cfg = BertConfig(vocab_size=6000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=64)
    text = TextEncoder(BertModel(cfg, add_pooling_layer=False), tokenizer=None, joint_dim=128)
    return DualEncoder(image, text, CosineHead(128) if head == "cosine" else LSENLHead(128))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    g = torch.Generator().manual_seed(args.seed)
    b, seq = args.batch, 20
    attn = torch.ones(b, seq, dtype=torch.long)
    text = {"input_ids": torch.randint(5, 6000, (b, seq), generator=g), "attention_mask": attn}
    loss = build_loss("infonce")
    runs = {}
    for cfg in CONFIGS:
        model = model_for(cfg, args.seed).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        images = torch.rand(b, 1, cfg[1], cfg[1], generator=g)

        def step(m=model, o=opt, x=images, head=cfg[3]) -> float:
            t0 = time.perf_counter()
            feats, txt = m.encode_image(x), m.encode_text(text).embedding
            if head == "cosine":
                value = loss(feats.global_emb, txt)
            else:
                value = loss(sims=score_blocks(m.head.score, m.head.image_side(feats), txt))
            o.zero_grad(set_to_none=True)
            value.backward()
            o.step()
            return time.perf_counter() - t0

        runs[cfg[0]] = (step, model.image_encoder(images[:1]).grid)
    times = {name: [] for name in runs}
    for s in range(1 + args.steps):  # the first round is untimed warm-up
        for name, (step, _) in runs.items():
            dt = step()
            if s:
                times[name].append(dt)
    base = min(times[CONFIGS[0][0]])
    for name, (_, grid) in runs.items():
        best = min(times[name])
        print(json.dumps({"bench": "grid", "metric": f"step_time_{name}", "value": round(best, 4), "unit": "s",
                          "vs": None, "grid": list(grid), "batch": b, "threads": torch.get_num_threads()}))
        print(json.dumps({"bench": "grid", "metric": f"step_time_ratio_{name}", "value": round(best / base, 3),
                          "unit": "x", "vs": CONFIGS[0][0], "grid": list(grid)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
