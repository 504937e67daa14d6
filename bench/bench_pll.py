"""Benchmark: batched exact PLL (medclr.lm.pseudo_log_likelihood) against the naive per-position loop.

Same model, same sentences, same run. The naive loop is the textbook PLL: one
forward pass of the full masked LM (all positions' V-way logits) per masked
position, batch of one. medclr's version batches all masked copies across
sentences and runs the LM head only at the masked positions; a third timing
batches but keeps the stock head, to show what each part buys.

    python bench/bench_pll.py                          # random 4x256 BERT, 200 Open-i sentences, CPU
    python bench/bench_pll.py --model runs/lm --n 300  # a fitted model
    python bench/bench_pll.py --threads 1

Prints JSON lines {"bench": "pll", "metric": ..., "value": ..., "unit": ..., "vs": "naive_loop"}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_sentences(manifest: str | None, n: int, seed: int) -> list[str]:
    if manifest:
        from medclr.data.manifest import read_manifest

        df = read_manifest(manifest)
    else:
        from medclr.data.readers.openi import read_openi

        df = read_openi()
    occurrences = [s for ss in df["sentences"] for s in ss]
    rng = np.random.default_rng(seed)
    # sample occurrences (so frequent sentences appear as often as in the corpus), then keep n distinct
    picked: list[str] = []
    seen: set[str] = set()
    for i in rng.permutation(len(occurrences)):
        if occurrences[i] not in seen:
            seen.add(occurrences[i])
            picked.append(occurrences[i])
            if len(picked) == n:
                break
    return picked, occurrences


def build_model(model_dir: str | None, corpus: list[str]):
    import torch
    from transformers import BertConfig, BertForMaskedLM

    if model_dir:
        from medclr.lm import load_masked_lm

        return load_masked_lm(model_dir, device="cpu")
    from medclr.lm.fit import FitConfig, train_tokenizer

    cfg = FitConfig()
    tok = train_tokenizer(corpus, cfg.vocab_size, cfg.min_frequency, cfg.max_length)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
                                       num_attention_heads=cfg.heads, intermediate_size=4 * cfg.hidden,
                                       max_position_embeddings=cfg.max_length, pad_token_id=tok.pad_token_id))
    return model.eval(), tok


def naive_pll(sentences, model, tok) -> np.ndarray:
    import torch

    out = []
    with torch.inference_mode():
        for s in sentences:
            enc = tok(s, return_tensors="pt", return_special_tokens_mask=True)
            ids = enc["input_ids"]
            total = 0.0
            for t in np.flatnonzero(enc["special_tokens_mask"][0].numpy() == 0):
                masked = ids.clone()
                masked[0, t] = tok.mask_token_id
                logits = model(input_ids=masked, attention_mask=enc["attention_mask"]).logits[0, t]
                total += torch.log_softmax(logits.float(), -1)[ids[0, t]].item()
            out.append(total)
    return np.array(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="masked-LM directory (default: a random BERT of `medclr lm fit`'s default size)")
    ap.add_argument("--manifest", help="manifest to draw sentences from (default: the Open-i reports)")
    ap.add_argument("--n", type=int, default=200, help="distinct sentences (default 200)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    args = ap.parse_args()

    import torch

    import medclr.lm.pll as pll_mod
    from medclr.lm import pseudo_log_likelihood

    if args.threads:
        torch.set_num_threads(args.threads)
    sentences, corpus = load_sentences(args.manifest, args.n, args.seed)
    model, tok = build_model(args.model, corpus)
    model.to("cpu").eval()
    n_tokens = sum(len(tok(s, add_special_tokens=False)["input_ids"]) for s in sentences)

    def batched(sents):
        return pseudo_log_likelihood(sents, model, tok, batch_size=args.batch_size, device="cpu", progress=False)

    naive_pll(sentences[:3], model, tok)  # warm-up
    batched(sentences[:8])
    # interleave the three methods over rounds of the sentences, so that load from other processes on a
    # shared machine hits all three alike; the ratios are of the summed times
    wall = {"naive": 0.0, "fast": 0.0, "stock": 0.0}
    cpu = dict(wall)
    ref, got, stock = [], [], []
    split_head = pll_mod._split_head

    def timed(key, fn, sents):
        w, c = time.perf_counter(), time.process_time()
        out = fn(sents)
        wall[key] += time.perf_counter() - w
        cpu[key] += time.process_time() - c
        return out

    def stock_head(sents):
        pll_mod._split_head = lambda _m: (None, None)  # same batching, stock head over every position
        try:
            return batched(sents)
        finally:
            pll_mod._split_head = split_head

    for part in np.array_split(np.arange(len(sentences)), args.rounds):
        sents = [sentences[i] for i in part]
        ref.append(timed("naive", lambda x: naive_pll(x, model, tok), sents))
        got.append(timed("fast", batched, sents))
        stock.append(timed("stock", stock_head, sents))
    ref, got, stock = np.concatenate(ref), np.concatenate(got), np.concatenate(stock)

    ctx = {"loadavg_1min": round(os.getloadavg()[0], 2), "n_sentences": len(sentences), "n_tokens": n_tokens,
           "vocab": len(tok),
           "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2), "threads": torch.get_num_threads(),
           "device": "cpu", "cpu": platform.processor() or platform.machine(), "model": args.model or "random-4x256"}
    n = len(sentences)
    lines = [
        ("speedup", wall["naive"] / wall["fast"], "x"),
        ("sentences_per_s", n / wall["fast"], "sentences/s"),
        ("naive_sentences_per_s", n / wall["naive"], "sentences/s"),
        ("stock_head_speedup", wall["naive"] / wall["stock"], "x"),
        # CPU time of this process: less sensitive than wall time to other jobs on a shared machine
        ("cpu_speedup", cpu["naive"] / cpu["fast"], "x"),
        ("cpu_sentences_per_s", n / cpu["fast"], "sentences/cpu-s"),
        ("max_abs_diff", float(max(np.max(np.abs(got - ref)), np.max(np.abs(stock - ref)))), "nats"),
    ]
    for metric, value, unit in lines:
        print(json.dumps({"bench": "pll", "metric": metric, "value": round(value, 6 if unit == "nats" else 2),
                          "unit": unit, "vs": "naive_loop", **ctx}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
