"""Fit a small domain masked LM (WordPiece tokenizer + BERT) on report sentences, on a CPU in minutes.

Recipe (docs/lm.md section 2): a WordPiece vocabulary (BERT normaliser,
lower case, min_frequency 2; learned by :mod:`medclr.lm.wordpiece`, because
the ``tokenizers`` trainer is not reproducible), a ``BertForMaskedLM`` with
4 layers, hidden 256, 4 heads and 128 positions, masked by
``DataCollatorForLanguageModeling`` (15 %, 80/10/10). The training loop is
plain torch: AdamW, linear warmup then linear decay, gradient clipping, and
the LM head applied only at the masked positions (the same loss as
``BertForMaskedLM(labels=...)``, without computing V-way logits for the 85 %
of positions that carry no label). Batches group sentences of similar length.

Sentences are used with their repeats: frequency is exactly what the LM should
learn, because PLL -> eta estimates how common a sentence's class is.

The budget is ``epochs`` (the default: the same LM on every machine), or ``epochs`` and
``max_minutes``, whichever ends first. With a time budget the
learning-rate schedule (linear warmup, linear decay) runs on the run's
progress = max(steps done / planned steps, time used / time budget), so a run
that the clock stops (a slow or shared machine) still ends its decay. A run
stopped by ``epochs`` is deterministic for a seed; one stopped by the clock
depends on the machine's speed (``medclr_lm.json`` says which).

The output directory is a Hugging Face checkpoint (model + tokenizer,
``save_pretrained``): ``AutoModelForMaskedLM``, ``AutoModel`` (the text
encoder; its pooler is newly initialised, use the hidden states) and
``AutoTokenizer`` load it, and ``medclr_lm.json`` records how it was made.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from medclr.errors import MedclrError

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
INFO_FILE = "medclr_lm.json"


@dataclass
class FitConfig:
    vocab_size: int = 6000
    min_frequency: int = 2
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    max_length: int = 128
    epochs: float = 4.0
    max_minutes: float | None = None  # None: the epochs alone decide (the same LM on every machine)
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_fraction: float = 0.06
    mlm_probability: float = 0.15
    seed: int = 0


@dataclass
class FitReport:
    out_dir: str
    n_train_sentences: int
    n_val_sentences: int
    vocab_size: int
    parameters: int
    steps: int
    epochs_done: float
    seconds: float
    stopped_by: str
    train_loss: list[float] = field(default_factory=list)  # mean loss per tenth of the run
    val_loss: float | None = None
    val_pseudo_perplexity: float | None = None


def train_tokenizer(sentences: Sequence[str], vocab_size: int = 6000, min_frequency: int = 2, max_length: int = 128):
    """A BERT-style uncased WordPiece tokenizer learned on ``sentences`` (a ``BertTokenizerFast``).

    The vocabulary comes from :mod:`medclr.lm.wordpiece` (deterministic, unlike
    ``tokenizers``' WordPieceTrainer); the pipeline is the ``tokenizers`` one:
    BertNormalizer(lowercase), BertPreTokenizer, WordPiece, [CLS] $A [SEP].
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    from medclr.lm.wordpiece import count_words, learn_vocab

    vocab = learn_vocab(count_words(sentences), vocab_size, min_frequency, SPECIAL_TOKENS)
    tk = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]",
                                    continuing_subword_prefix="##", max_input_chars_per_word=100))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece()
    cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return BertTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_length)


def _batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of similar-length sentences (sort within pools of 50 batches)."""
    perm = rng.permutation(len(lengths))
    pool = batch_size * 50
    batches = []
    for p0 in range(0, len(perm), pool):
        part = perm[p0 : p0 + pool]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches.extend(part[i : i + batch_size] for i in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return batches


def _mlm_loss(model, batch) -> tuple:
    """Masked-LM cross-entropy with the head run only where there is a label."""
    import torch.nn.functional as F

    labels = batch["labels"]
    hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
    sel = labels != -100
    logits = model.cls(hidden[sel])
    return F.cross_entropy(logits.float(), labels[sel]), int(sel.sum())


def _evaluate(model, tok, encoded, cfg) -> float | None:
    """Validation MLM loss with a fixed masking (a fresh collator seeded like the run)."""
    import torch
    from transformers import DataCollatorForLanguageModeling

    if not encoded:
        return None
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=cfg.mlm_probability, seed=cfg.seed)
    batch_size = cfg.batch_size
    model.eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for i in range(0, len(encoded), batch_size):
            batch = collator(encoded[i : i + batch_size])
            loss, n = _mlm_loss(model, batch)
            total += float(loss) * n
            count += n
    model.train()
    return total / max(count, 1)


def fit_lm(
    sentences: Sequence[str],
    out_dir: str | os.PathLike,
    config: FitConfig | None = None,
    *,
    val_sentences: Sequence[str] = (),
    overwrite: bool = False,
    progress: bool = True,
) -> FitReport:
    """Train the tokenizer and the masked LM on ``sentences`` and save both to ``out_dir``."""
    import torch
    from tqdm.auto import tqdm
    from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling

    cfg = config or FitConfig()
    out = Path(out_dir)
    if (out / "config.json").exists() and not overwrite:
        raise MedclrError(f"{out}: already holds a model; pass --overwrite to replace it or choose another --out")
    sentences = [s for s in sentences if isinstance(s, str) and s.strip()]
    if len(sentences) < 10:
        raise MedclrError(f"only {len(sentences)} non-empty training sentences; fitting an LM needs a corpus")
    if cfg.hidden % cfg.heads:
        raise MedclrError(f"--hidden {cfg.hidden} must be a multiple of --heads {cfg.heads}")
    if cfg.epochs <= 0 or (cfg.max_minutes is not None and cfg.max_minutes <= 0):
        raise MedclrError("--epochs and --max-minutes must be positive")
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    t_start = time.monotonic()

    tok = train_tokenizer(sentences, cfg.vocab_size, cfg.min_frequency, cfg.max_length)
    log.info("WordPiece vocabulary: %d pieces (asked for at most %d, min frequency %d)", len(tok), cfg.vocab_size,
             cfg.min_frequency)

    def encode(texts):
        if not texts:
            return []
        enc = tok(list(texts), truncation=True, max_length=cfg.max_length, return_special_tokens_mask=True)
        return [{"input_ids": i, "special_tokens_mask": m}
                for i, m in zip(enc["input_ids"], enc["special_tokens_mask"])]

    train = encode(sentences)
    val = encode([s for s in val_sentences if isinstance(s, str) and s.strip()])
    lengths = np.array([len(x["input_ids"]) for x in train])
    model = BertForMaskedLM(BertConfig(
        vocab_size=len(tok), hidden_size=cfg.hidden, num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        intermediate_size=4 * cfg.hidden, max_position_embeddings=cfg.max_length, pad_token_id=tok.pad_token_id,
    ))
    n_params = sum(p.numel() for p in model.parameters())
    log.info("BertForMaskedLM: %d layers, hidden %d, %d heads, %.2fM parameters; %d training sentences",
             cfg.layers, cfg.hidden, cfg.heads, n_params / 1e6, len(train))
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=cfg.mlm_probability, seed=cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "LayerNorm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total_steps = max(1, int(round(cfg.epochs * steps_per_epoch)))
    budget_s = math.inf if cfg.max_minutes is None else cfg.max_minutes * 60.0 - (time.monotonic() - t_start)

    def lr_at(progress: float) -> float:
        """Linear warmup then linear decay over the run's progress in [0, 1]."""
        if progress < cfg.warmup_fraction:
            return cfg.lr * max(progress, 1.0 / total_steps) / cfg.warmup_fraction
        return cfg.lr * max(0.0, 1.0 - progress) / (1.0 - cfg.warmup_fraction)

    rng = np.random.default_rng(cfg.seed)
    model.train()
    step, losses, stopped_by = 0, [], "epochs"
    bar = tqdm(total=total_steps, unit="step", desc="lm fit", disable=not progress, mininterval=1.0)
    t_train = time.monotonic()
    progress_frac = 0.0
    while progress_frac < 1.0:
        for idx in _batches(lengths, cfg.batch_size, rng):
            for group in opt.param_groups:
                group["lr"] = lr_at(progress_frac)
            batch = collator([train[i] for i in idx])
            loss, _ = _mlm_loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            losses.append(loss.detach().item())
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", refresh=False)
            # progress is steps done or time used, whichever is further: the LR schedule ends
            # its decay on time even when a slow (or shared) machine cannot do all the epochs
            by_time = 0.0 if cfg.max_minutes is None else (time.monotonic() - t_train) / max(budget_s, 1e-9)
            progress_frac = max(step / total_steps, by_time)
            if progress_frac >= 1.0:
                stopped_by = "epochs" if step >= total_steps else "max_minutes"
                break
    bar.close()
    seconds = time.monotonic() - t_start
    val_loss = _evaluate(model, tok, val, cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    tenth = max(1, len(losses) // 10)
    report = FitReport(
        out_dir=str(out), n_train_sentences=len(train), n_val_sentences=len(val), vocab_size=len(tok),
        parameters=n_params, steps=step, epochs_done=round(step / steps_per_epoch, 3), seconds=round(seconds, 1),
        stopped_by=stopped_by, train_loss=[round(float(np.mean(losses[i : i + tenth])), 4)
                                          for i in range(0, len(losses), tenth)],
        val_loss=None if val_loss is None else round(val_loss, 4),
        val_pseudo_perplexity=None if val_loss is None else round(math.exp(val_loss), 3),
    )
    (out / INFO_FILE).write_text(json.dumps({"config": asdict(cfg), "report": asdict(report)}, indent=2) + "\n")
    log.info("saved %s: %d steps (%.2f epochs) in %.0f s, stopped by %s; train loss %.3f -> %.3f%s", out, step,
             report.epochs_done, seconds, stopped_by, report.train_loss[0], report.train_loss[-1],
             "" if val_loss is None else f", validation MLM loss {val_loss:.3f}")
    return report
