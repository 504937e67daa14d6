"""Fit a small domain masked LM (WordPiece tokenizer + BERT) on report sentences: CPU minutes, GPU seconds.

Recipe (docs/lm.md section 2): a WordPiece vocabulary (BERT normaliser,
lower case, min_frequency 2; learned by :mod:`medclr.lm.wordpiece`, because
the ``tokenizers`` trainer is not reproducible), a ``BertForMaskedLM`` with
4 layers, hidden 256, 4 heads and 128 positions, BERT's masking (15 %,
80/10/10), AdamW, linear warmup then linear decay, gradient clipping, and
the LM head applied only at the masked positions (the same loss as
``BertForMaskedLM(labels=...)``, without computing V-way logits for the 85 %
of positions that carry no label). Batches group sentences of similar length.

The steps, each a function: :func:`train_tokenizer`, :func:`tokenize_corpus`
(once: the sentences become one padded tensor on the training device),
:func:`build_model`, :func:`train_steps` (batches are slices of that tensor,
masked there by :func:`mask_tokens`; no tokenizer or Python list work per
step, and no host sync but every ``LOG_EVERY`` steps), :func:`evaluate`, then
``save_pretrained``. :func:`mask_tokens` draws exactly what transformers'
``DataCollatorForLanguageModeling`` draws from a generator with the same seed,
so on a CPU the LM is the one the collator-based loop made. On CUDA the
forward runs under bf16 autocast.

Sentences are used with their repeats: frequency is exactly what the LM should
learn, because PLL -> eta estimates how common a sentence's class is.

The budget is ``epochs`` (the default: the same LM for a seed on every CPU), or ``epochs`` and
``max_minutes``, whichever ends first. With a time budget the
learning-rate schedule (linear warmup, linear decay) runs on the run's
progress = max(steps done / planned steps, time used / time budget), so a run
that the clock stops (a slow or shared machine) still ends its decay. A run
stopped by ``epochs`` is deterministic for a seed and device; one stopped by the clock
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
from typing import TYPE_CHECKING

import numpy as np

from medclr.errors import MedclrError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
INFO_FILE = "medclr_lm.json"
LOG_EVERY = 50  # steps between host reads of the loss (each one waits for the device)
IGNORE = -100  # label of a position without a target (torch's cross_entropy default ignore_index)


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
    device: str | None = None  # None: CUDA when present, else the CPU


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
    device: str = "cpu"
    train_seconds: float = 0.0  # the training steps alone: steps / train_seconds is the fit's speed
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


@dataclass
class TokenizedCorpus:
    """Sentences tokenised once and right-padded into tensors on the training device."""

    ids: torch.Tensor  # N x L int64 (L = the longest sentence), padded with the tokenizer's pad id
    attention: torch.Tensor  # N x L int64: 1 on a token, 0 on padding
    no_mask: torch.Tensor  # N x L bool: special tokens and padding, never masked
    lengths: np.ndarray  # N, kept on the host so that batch shapes need no device sync
    mask_id: int
    vocab_size: int

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, rows, length: int, mlm_probability: float, generator) -> dict:
        """``rows`` (a slice or a device index tensor) cut to ``length`` positions, masked."""
        ids = self.ids[rows, :length]
        inputs, labels = mask_tokens(ids, self.no_mask[rows, :length], mlm_probability, self.mask_id,
                                     self.vocab_size, generator)
        return {"input_ids": inputs, "attention_mask": self.attention[rows, :length], "labels": labels}


def tokenize_corpus(tok, texts: Sequence[str], max_length: int, device) -> TokenizedCorpus:
    """Tokenise ``texts`` once ([CLS] ... [SEP], truncated to ``max_length``) into a :class:`TokenizedCorpus`."""
    import torch

    enc = tok(list(texts), truncation=True, max_length=max_length, return_special_tokens_mask=True) if texts \
        else {"input_ids": [], "special_tokens_mask": []}
    lengths = np.array([len(x) for x in enc["input_ids"]], dtype=np.int64)
    width = int(lengths.max(initial=0))
    ids = np.full((len(lengths), width), tok.pad_token_id, np.int64)
    no_mask = np.ones((len(lengths), width), bool)
    for row, (piece_ids, special) in enumerate(zip(enc["input_ids"], enc["special_tokens_mask"])):
        ids[row, : len(piece_ids)] = piece_ids
        no_mask[row, : len(special)] = special
    attention = (np.arange(width) < lengths[:, None]).astype(np.int64)
    return TokenizedCorpus(*(torch.from_numpy(a).to(device) for a in (ids, attention, no_mask)), lengths,
                           tok.mask_token_id, len(tok))


def mask_tokens(ids, no_mask, mlm_probability: float, mask_id: int, vocab_size: int, generator) -> tuple:
    """BERT's masking of a padded batch, on its device: ``(inputs, labels)``.

    Each position outside ``no_mask`` is chosen with probability ``mlm_probability`` and labelled
    with its token (other labels are ``IGNORE``); a chosen position becomes [MASK] 80 % of the time,
    a random token 10 % and stays itself 10 %. The draws (three Bernoulli fields and one of random
    tokens, each of the batch's shape, in this order) are those of transformers'
    ``DataCollatorForLanguageModeling.torch_mask_tokens``: the same generator state gives the same
    batch (tests/test_lm.py).
    """
    import torch

    shape, device = ids.shape, ids.device
    chosen = torch.bernoulli(torch.full(shape, mlm_probability, device=device).masked_fill_(no_mask, 0.0),
                             generator=generator).bool()
    labels = ids.masked_fill(~chosen, IGNORE)
    to_mask = torch.bernoulli(torch.full(shape, 0.8, device=device), generator=generator).bool() & chosen
    # half of the remaining 20 %: 10 % of the chosen positions
    to_random = torch.bernoulli(torch.full(shape, 0.5, device=device), generator=generator).bool() & chosen & ~to_mask
    random_tokens = torch.randint(vocab_size, shape, device=device, generator=generator)
    return torch.where(to_random, random_tokens, ids.masked_fill(to_mask, mask_id)), labels


def mlm_loss(model, batch: dict) -> tuple:
    """Masked-LM cross-entropy with the head run only where there is a label: (loss, labelled positions)."""
    import torch.nn.functional as F

    labels = batch["labels"]
    hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
    sel = labels != IGNORE
    logits = model.cls(hidden[sel])
    return F.cross_entropy(logits.float(), labels[sel]), sel.sum()


def build_model(cfg: FitConfig, tok):
    """A randomly initialised ``BertForMaskedLM`` of ``cfg``'s size over ``tok``'s vocabulary."""
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(
        vocab_size=len(tok), hidden_size=cfg.hidden, num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        intermediate_size=4 * cfg.hidden, max_position_embeddings=cfg.max_length, pad_token_id=tok.pad_token_id,
    ))


def build_optimizer(model, cfg: FitConfig):
    """AdamW, no weight decay on biases and LayerNorms; CUDA's fused kernel on a GPU (one launch per step)."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "LayerNorm" not in n)]
    on_cuda = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, **({"fused": True} if on_cuda else {}))


def lr_at(cfg: FitConfig, progress: float, total_steps: int) -> float:
    """Linear warmup then linear decay over the run's progress in [0, 1]."""
    if progress < cfg.warmup_fraction:
        return cfg.lr * max(progress, 1.0 / total_steps) / cfg.warmup_fraction
    return cfg.lr * max(0.0, 1.0 - progress) / (1.0 - cfg.warmup_fraction)


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


def _autocast(device):
    """bf16 autocast on CUDA; on the CPU float32 (bf16 matmuls are slower there on most CPUs)."""
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def _optimizer_step(model, opt, params: list, batch: dict, device):
    """Forward, backward, clip to norm 1, AdamW; the loss stays on the device (reading it would wait)."""
    import torch

    with _autocast(device):
        loss, _ = mlm_loss(model, batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss.detach()


@dataclass
class TrainResult:
    steps: int
    losses: list[float]  # one per step
    stopped_by: str  # "epochs" or "max_minutes"
    seconds: float


def train_steps(model, opt, corpus: TokenizedCorpus, cfg: FitConfig, total_steps: int, *,
                budget_s: float = math.inf, progress: bool | str = False) -> TrainResult:
    """Train ``total_steps`` steps, or fewer when ``budget_s`` seconds run out (the LR schedule follows
    whichever is further along). Batches are slices of ``corpus``'s tensors, masked on its device."""
    import torch

    from medclr.progress import progress_bar

    device = corpus.ids.device
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    params = list(model.parameters())
    model.train()
    step, losses, stopped_by, progress_frac = 0, [], "epochs", 0.0
    bar = progress_bar(total=total_steps, unit="step", desc="lm fit", enabled=progress)
    t0 = time.monotonic()
    while progress_frac < 1.0:
        batches = _batches(corpus.lengths, cfg.batch_size, rng)
        order, start = torch.from_numpy(np.concatenate(batches)).to(device), 0
        for idx in batches:
            for group in opt.param_groups:
                group["lr"] = lr_at(cfg, progress_frac, total_steps)
            batch = corpus.batch(order[start : start + len(idx)], int(corpus.lengths[idx].max()),
                                 cfg.mlm_probability, generator)
            start += len(idx)
            losses.append(_optimizer_step(model, opt, params, batch, device))
            step += 1
            bar.update(1)
            if step % LOG_EVERY == 0:
                bar.set_postfix(loss=f"{torch.stack(losses[-LOG_EVERY:]).mean().item():.3f}", refresh=False)
            # progress is steps done or time used, whichever is further: the LR schedule ends
            # its decay on time even when a slow (or shared) machine cannot do all the epochs
            progress_frac = max(step / total_steps, (time.monotonic() - t0) / budget_s)
            if progress_frac >= 1.0:
                stopped_by = "epochs" if step >= total_steps else "max_minutes"
                break
    values = torch.stack(losses).double().tolist()  # waits for the device: the clock below is honest
    bar.close()
    return TrainResult(step, values, stopped_by, time.monotonic() - t0)


def evaluate(model, corpus: TokenizedCorpus, cfg: FitConfig) -> float | None:
    """Mean MLM loss per masked position over ``corpus``, masked by a generator seeded like the run."""
    import torch

    if not len(corpus):
        return None
    device = corpus.ids.device
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    model.eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for i in range(0, len(corpus), cfg.batch_size):
            rows = slice(i, i + cfg.batch_size)
            with _autocast(device):
                loss, n = mlm_loss(model, corpus.batch(rows, int(corpus.lengths[rows].max()), cfg.mlm_probability,
                                                       generator))
            total += float(loss) * int(n)
            count += int(n)
    model.train()
    return total / max(count, 1)


def _resolve_device(name: str | None):
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MedclrError(f"--device {name}: no CUDA device is visible")
    return device


def _checked_sentences(sentences: Sequence[str], cfg: FitConfig, out: Path, overwrite: bool) -> list[str]:
    if (out / "config.json").exists() and not overwrite:
        raise MedclrError(f"{out}: already holds a model; pass --overwrite to replace it or choose another --out")
    sentences = [s for s in sentences if isinstance(s, str) and s.strip()]
    if len(sentences) < 10:
        raise MedclrError(f"only {len(sentences)} non-empty training sentences; fitting an LM needs a corpus")
    if cfg.hidden % cfg.heads:
        raise MedclrError(f"--hidden {cfg.hidden} must be a multiple of --heads {cfg.heads}")
    if cfg.epochs <= 0 or (cfg.max_minutes is not None and cfg.max_minutes <= 0):
        raise MedclrError("--epochs and --max-minutes must be positive")
    if cfg.batch_size < 1:
        raise MedclrError("--batch-size must be at least 1")
    return sentences


def fit_lm(
    sentences: Sequence[str],
    out_dir: str | os.PathLike,
    config: FitConfig | None = None,
    *,
    val_sentences: Sequence[str] = (),
    overwrite: bool = False,
    progress: bool | str = "auto",
) -> FitReport:
    """Train the tokenizer and the masked LM on ``sentences`` and save both to ``out_dir``."""
    import torch

    cfg = config or FitConfig()
    out = Path(out_dir)
    sentences = _checked_sentences(sentences, cfg, out, overwrite)
    device = _resolve_device(cfg.device)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    t_start = time.monotonic()

    tok = train_tokenizer(sentences, cfg.vocab_size, cfg.min_frequency, cfg.max_length)
    log.info("WordPiece vocabulary: %d pieces (asked for at most %d, min frequency %d)", len(tok), cfg.vocab_size,
             cfg.min_frequency)
    train = tokenize_corpus(tok, sentences, cfg.max_length, device)
    val = tokenize_corpus(tok, [s for s in val_sentences if isinstance(s, str) and s.strip()], cfg.max_length, device)
    model = build_model(cfg, tok).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("BertForMaskedLM: %d layers, hidden %d, %d heads, %.2fM parameters; %d training sentences; on %s",
             cfg.layers, cfg.hidden, cfg.heads, n_params / 1e6, len(train), device)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total_steps = max(1, int(round(cfg.epochs * steps_per_epoch)))
    budget_s = math.inf if cfg.max_minutes is None else cfg.max_minutes * 60.0 - (time.monotonic() - t_start)
    run = train_steps(model, build_optimizer(model, cfg), train, cfg, total_steps, budget_s=max(budget_s, 1e-9),
                      progress=progress)
    seconds = time.monotonic() - t_start
    val_loss = evaluate(model, val, cfg)
    tenth = max(1, run.steps // 10)
    report = FitReport(
        out_dir=str(out), n_train_sentences=len(train), n_val_sentences=len(val), vocab_size=len(tok),
        parameters=n_params, steps=run.steps, epochs_done=round(run.steps / steps_per_epoch, 3),
        seconds=round(seconds, 2), stopped_by=run.stopped_by, device=str(device), train_seconds=round(run.seconds, 2),
        train_loss=[round(float(np.mean(run.losses[i : i + tenth])), 4) for i in range(0, run.steps, tenth)],
        val_loss=None if val_loss is None else round(val_loss, 4),
        val_pseudo_perplexity=None if val_loss is None else round(math.exp(val_loss), 3),
    )
    _save(model, tok, out, cfg, report)
    log.info("saved %s: %d steps (%.2f epochs) in %.0f s (%.1f steps/s), stopped by %s; train loss %.3f -> %.3f%s",
             out, run.steps, report.epochs_done, seconds, run.steps / max(run.seconds, 1e-9), run.stopped_by,
             report.train_loss[0], report.train_loss[-1], "" if val_loss is None else f", validation MLM loss {val_loss:.3f}")
    return report


def _save(model, tok, out: Path, cfg: FitConfig, report: FitReport) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.to("cpu").save_pretrained(out)
    tok.save_pretrained(out)
    (out / INFO_FILE).write_text(json.dumps({"config": asdict(cfg), "report": asdict(report)}, indent=2) + "\n")
