"""`medclr lm fit` speed: training steps/s against a plain loop of the same model, in one run.

* **fit**: ``medclr.lm.fit.train_steps``, the loop `medclr lm fit` runs: length-bucketed batches cut
  from the pre-tokenised corpus on the device, BERT masking there, the LR schedule, gradient clipping,
  AdamW, bf16 autocast on CUDA.
* **plain**: the same model, optimizer and loss (``mlm_loss``: the LM head at the masked positions
  only) on batches made before the clock starts (random tokens, the fit's batch shapes, 15 % of the
  positions labelled), forward + backward + step and nothing else. ``fit_vs_plain`` = fit steps/s /
  plain steps/s (1.0: the data path and the schedule cost nothing).
* **masking**: one batch of 64 sentences made ready for the model by transformers'
  ``DataCollatorForLanguageModeling`` (padding + masking of token lists, what `lm fit` did before)
  and by ``TokenizedCorpus.batch`` (slices + masking on the device), ms per batch.

The two loops alternate over ``--rounds`` rounds (load from other processes hits both alike); each
rate is the median over rounds, in steps per wall second and, on a CPU, per CPU second of this
process. Corpus: the training sentences of ``--manifest`` (the demo's: ``medclr demo`` writes
``~/.cache/medclr/demo/manifest.parquet``); model: ``medclr lm fit``'s defaults (4 layers, hidden 256,
batch 64).

    OMP_NUM_THREADS=1 python bench/bench_lm.py --manifest ~/.cache/medclr/demo/manifest.parquet --threads 1
    python bench/bench_lm.py --manifest m.parquet --device cuda --steps 500 --rounds 3

Prints JSON lines {"bench": "lm_fit", "metric", "value", "unit", "vs", ...context}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def emit(metric: str, value: float, unit: str, vs=None, **ctx) -> None:
    print(json.dumps({"bench": "lm_fit", "metric": metric, "value": round(float(value), 4), "unit": unit, "vs": vs,
                      **ctx}), flush=True)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``fn()``, the device drained at both ends."""
    _sync(device)
    w, c = time.perf_counter(), time.process_time()
    fn()
    _sync(device)
    return time.perf_counter() - w, time.process_time() - c


def plain_batches(corpus, cfg, n: int, seed: int = 0) -> list[dict]:
    """``n`` ready batches of the fit's shapes: random tokens, padding, 15 % of the word pieces labelled
    (as many as the fit's masking labels on average: the LM head's cost follows that count)."""
    import torch

    from medclr.lm.fit import IGNORE, _batches

    rng = np.random.default_rng(seed)
    g = torch.Generator(device=corpus.ids.device).manual_seed(seed)
    shapes = [(len(b), int(corpus.lengths[b].max()), corpus.lengths[b]) for b in _batches(corpus.lengths, cfg.batch_size, rng)]
    out = []
    for rows, width, lengths in (shapes * (n // len(shapes) + 1))[:n]:
        dev = corpus.ids.device
        pos, ends = torch.arange(width, device=dev), torch.as_tensor(lengths, device=dev)[:, None]
        attention = (pos < ends).long()
        ids = torch.randint(5, corpus.vocab_size, (rows, width), device=dev, generator=g) * attention
        pieces = (pos > 0) & (pos < ends - 1)  # not [CLS], [SEP] or padding
        chosen = (torch.rand((rows, width), device=dev, generator=g) < cfg.mlm_probability) & pieces
        if not chosen.any():  # the loss is never empty
            chosen[0, 1] = True
        out.append({"input_ids": ids, "attention_mask": attention, "labels": ids.masked_fill(~chosen, IGNORE)})
    return out


def plain_loop(model, opt, batches: list[dict], device) -> None:
    from medclr.lm.fit import _autocast, mlm_loss

    model.train()
    for batch in batches:
        with _autocast(device):
            loss, _ = mlm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def masking_ms(tok, sentences: list[str], corpus, cfg, reps: int) -> tuple[float, float]:
    """ms per batch of 64 sentences: the collator on token lists, and TokenizedCorpus.batch on the device."""
    import torch
    from transformers import DataCollatorForLanguageModeling

    enc = tok(sentences[:64], truncation=True, max_length=cfg.max_length, return_special_tokens_mask=True)
    examples = [{"input_ids": i, "special_tokens_mask": m} for i, m in zip(enc["input_ids"], enc["special_tokens_mask"])]
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=cfg.mlm_probability, seed=0)
    g = torch.Generator(device=corpus.ids.device).manual_seed(0)
    rows, width = torch.arange(64, device=corpus.ids.device), int(corpus.lengths[:64].max())

    def run(fn):
        fn()
        wall, _ = timed(lambda: [fn() for _ in range(reps)], corpus.ids.device)
        return 1e3 * wall / reps

    return run(lambda: collator(examples)), run(lambda: corpus.batch(rows, width, cfg.mlm_probability, g))


def main(argv: list[str] | None = None) -> None:
    import torch

    from medclr.data.manifest import read_manifest
    from medclr.lm.eta import manifest_sentences
    from medclr.lm.fit import FitConfig, build_model, build_optimizer, tokenize_corpus, train_steps, train_tokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", required=True, help="manifest parquet; its training sentences are the corpus")
    ap.add_argument("--device", default=None, help="cpu, cuda (default: cuda when present)")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per loop and round")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps of each loop first")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    sentences = manifest_sentences(read_manifest(args.manifest), "train")["sentence"].tolist()
    cfg = FitConfig(device=str(device))
    torch.manual_seed(cfg.seed)
    tok = train_tokenizer(sentences, cfg.vocab_size, cfg.min_frequency, cfg.max_length)
    t = time.perf_counter()
    corpus = tokenize_corpus(tok, sentences, cfg.max_length, device)
    tokenize_s = time.perf_counter() - t
    ctx = {"device": str(device), "threads": torch.get_num_threads(), "sentences": len(sentences),
           "vocab": len(tok), "layers": cfg.layers, "hidden": cfg.hidden, "batch": cfg.batch_size,
           "mean_length": round(float(corpus.lengths.mean()), 1), "steps": args.steps, "rounds": args.rounds}
    if device.type == "cuda":
        ctx["gpu"] = torch.cuda.get_device_name(device)
    emit("tokenize_once", tokenize_s, "s", **ctx)

    fit_model = build_model(cfg, tok).to(device)
    fit_opt = build_optimizer(fit_model, cfg)
    plain_model = build_model(cfg, tok).to(device)
    plain_opt = build_optimizer(plain_model, cfg)
    batches = plain_batches(corpus, cfg, args.steps)
    # each round is a short fit of its own (its own LR warm-up and decay: the rate does not depend on it)
    train_steps(fit_model, fit_opt, corpus, cfg, args.warmup + 1)
    plain_loop(plain_model, plain_opt, batches[: args.warmup + 1], device)
    fit, plain = [], []
    for _ in range(args.rounds):
        fit.append(timed(lambda: train_steps(fit_model, fit_opt, corpus, cfg, args.steps), device))
        plain.append(timed(lambda: plain_loop(plain_model, plain_opt, batches, device), device))

    def rate(pairs, i):
        return statistics.median(args.steps / p[i] for p in pairs)

    emit("fit_steps_per_s", rate(fit, 0), "steps/s", **ctx)
    emit("plain_steps_per_s", rate(plain, 0), "steps/s", **ctx)
    emit("fit_vs_plain", rate(fit, 0) / rate(plain, 0), "x", "plain loop, same model", **ctx)
    if device.type == "cpu":
        emit("fit_steps_per_cpu_s", rate(fit, 1), "steps/CPU-s", **ctx)
        emit("plain_steps_per_cpu_s", rate(plain, 1), "steps/CPU-s", **ctx)
        emit("fit_vs_plain_cpu_time", rate(fit, 1) / rate(plain, 1), "x", "plain loop, same model", **ctx)
    collator, tensor = masking_ms(tok, sentences, corpus, cfg, reps=50)
    emit("batch_ms_collator", collator, "ms", **ctx)
    emit("batch_ms_tensor", tensor, "ms", **ctx)
    emit("batch_speedup_tensor", collator / tensor, "x", "DataCollatorForLanguageModeling", **ctx)
    if device.type == "cuda":
        emit("goal_fit_steps_per_s", rate(fit, 0), "steps/s", "goal >= 200 (issue 18)", **ctx)


if __name__ == "__main__":
    main()
