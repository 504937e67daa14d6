"""Exact pseudo-log-likelihood (PLL) of sentences under any Hugging Face masked LM.

PLL(S) = sum over the word pieces t of S of log p(w_t | S with w_t replaced by
[MASK]) (Salazar et al., ACL 2020); special tokens ([CLS], [SEP], <s>, ...)
are never scored. The result equals one forward pass per masked position to
float precision, but runs much faster:

* every sentence is expanded into its N masked copies, and the copies of many
  sentences (sorted by length, so little padding) share one forward pass;
* the encoder runs on all rows, the LM head (the V-way projection) only on the
  one masked position of each row (``model.cls`` / ``model.lm_head``; models
  with another head layout fall back to the full forward, still exact);
* identical sentences are scored once.

``word_l2r=True`` gives PLL-word-l2r (Kauf & Ivanova, ACL 2023): while scoring
piece t, the later pieces of the same word are masked too, so a multi-piece
word does not give its own answer away. It needs a fast tokenizer (word ids).

Sentences longer than the model's limit (``max_length``: the tokenizer's
``model_max_length`` capped by ``max_position_embeddings``, special tokens
included) are handled by ``long``:

* ``"window"`` (default): every piece is still scored, each with a context
  window of the longest size the model accepts, centred on the masked piece
  (clamped to the sentence ends). Exact PLL for sentences that fit; for longer
  ones each term conditions on a window instead of the whole sentence.
* ``"truncate"``: only the first pieces that fit are scored (``n_scored`` <
  ``n_tokens``); the PLL is then of a prefix.
* ``"error"``: raise :class:`~medclr.errors.MedclrError`.

The number of sentences that needed a window or truncation is logged.

Work per sentence is bounded: at most ``max_pieces`` pieces of a sentence are scored (default
:data:`MAX_PIECES`, far above a report sentence's length), so one pasted document in a report costs at
most ``max_pieces`` forward rows instead of one per piece (a 200 kB "sentence" held ~40,000 pieces, hours
of windowed scoring on a CPU). Such sentences have ``n_scored`` < ``n_tokens``; their count is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from medclr.errors import MedclrError

log = logging.getLogger(__name__)

LONG_MODES = ("window", "truncate", "error")
MAX_PIECES = 1024  # pieces scored per sentence at most (report sentences: < 100)


@dataclass
class PLLResult:
    """Per-sentence scores, aligned with the input sentences."""

    pll: np.ndarray  # float64, sum of log p over the scored pieces
    n_tokens: np.ndarray  # int64, word pieces in the sentence (special tokens excluded)
    n_scored: np.ndarray  # int64, pieces actually scored (< n_tokens only with long="truncate")
    long: np.ndarray  # bool, the sentence was longer than the model's limit
    max_length: int  # the model's limit used (special tokens included)

    @property
    def pll_per_token(self) -> np.ndarray:
        return self.pll / np.maximum(self.n_scored, 1)


def model_max_length(model, tokenizer) -> int:
    """Longest input (special tokens included) the model accepts."""
    limits = []
    tok_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_limit, int) and 0 < tok_limit < 1_000_000:
        limits.append(tok_limit)
    pos = getattr(model.config, "max_position_embeddings", None)
    if isinstance(pos, int) and pos > 0:
        # RoBERTa-style position ids start after the padding index
        roberta_like = {"roberta", "xlm-roberta", "camembert", "longformer"}
        offset = 2 if getattr(model.config, "model_type", "") in roberta_like else 0
        limits.append(pos - offset)
    if not limits:
        raise MedclrError("cannot tell the model's maximum length; pass max_length=")
    return min(limits)


def _split_head(model):
    """(encoder, head) such that head(encoder(...)[0]) are the MLM logits, or (None, None)."""
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        return None, None
    for name in ("cls", "lm_head"):
        head = getattr(model, name, None)
        if head is not None and callable(head):
            return base, head
    return None, None


def _check(sentences, model, tokenizer, long: str) -> list[str]:
    if isinstance(sentences, str):
        raise MedclrError("sentences must be a list of strings, not one string")
    sentences = list(sentences)
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise MedclrError(f"sentences[{i}] is {type(s).__name__}, expected str")
        if not s.strip():
            raise MedclrError(f"sentences[{i}] is empty; PLL needs at least one word piece")
    if long not in LONG_MODES:
        raise MedclrError(f"long={long!r}; expected one of {LONG_MODES}")
    if model.get_output_embeddings() is None:
        raise MedclrError(
            f"model is a {type(model).__name__}, which has no masked-LM head; load it with "
            "medclr.lm.load_masked_lm or AutoModelForMaskedLM"
        )
    if getattr(tokenizer, "mask_token_id", None) is None:
        raise MedclrError(f"tokenizer {type(tokenizer).__name__} has no mask token; PLL needs a masked-LM tokenizer")
    return sentences


def _rows_for_sentence(ids, special, word_ids, max_length, mask_id, word_l2r, long, index, max_pieces=MAX_PIECES):
    """Masked copies of one sentence.

    Returns (rows: 2-D int array, one masked copy per scored piece; mask position in each row;
    target ids; n_tokens; n_scored; is_long).
    """
    ids = np.asarray(ids, dtype=np.int64)
    special = np.asarray(special, dtype=bool)
    content = np.flatnonzero(~special)
    if content.size == 0:
        raise MedclrError(f"sentences[{index}] has no word pieces after tokenisation "
                          "(only special or blank characters)")
    p0, p1 = int(content[0]), int(content[-1]) + 1
    prefix, body, suffix = ids[:p0], ids[p0:p1], ids[p1:]
    body_scored = ~special[p0:p1]
    wid = None
    if word_l2r:
        wid = np.array([-1 if w is None else w for w in word_ids[p0:p1]], dtype=np.int64)
    width = max_length - len(prefix) - len(suffix)
    if width < 1:
        raise MedclrError(f"max_length={max_length} leaves no room between the special tokens")
    n = len(body)
    n_tokens = int(body_scored.sum())
    is_long = n > width
    targets_pos = np.flatnonzero(body_scored)
    if is_long:
        if long == "error":
            raise MedclrError(
                f"sentences[{index}] has {len(ids)} tokens, more than the model's limit of {max_length}; "
                "pass long='window' or long='truncate'"
            )
        if long == "truncate":
            targets_pos = targets_pos[targets_pos < width]
            starts = np.zeros(len(targets_pos), dtype=np.int64)
        else:
            starts = np.clip(targets_pos - width // 2, 0, n - width)
        w = width
    else:
        starts = np.zeros(len(targets_pos), dtype=np.int64)
        w = n
    if len(targets_pos) > max_pieces:  # bounded work: the first max_pieces pieces only
        targets_pos, starts = targets_pos[:max_pieces], starts[:max_pieces]
    m = len(targets_pos)
    cols = starts[:, None] + np.arange(w)[None, :]  # (m, w) body indices of each row's window
    window = body[cols]
    local = targets_pos - starts  # masked position inside the window
    masked = np.zeros((m, w), dtype=bool)
    masked[np.arange(m), local] = True
    if word_l2r:
        wwin = wid[cols]
        wt = wid[targets_pos][:, None]
        masked |= (cols > targets_pos[:, None]) & (wwin == wt) & (wt >= 0)
    window = np.where(masked, mask_id, window)
    rows = np.concatenate([np.broadcast_to(prefix, (m, len(prefix))), window,
                           np.broadcast_to(suffix, (m, len(suffix)))], axis=1)
    return rows, local + len(prefix), body[targets_pos], n_tokens, m, is_long


def score_sentences(
    sentences: Sequence[str],
    model,
    tokenizer,
    batch_size: int = 64,
    *,
    word_l2r: bool = False,
    long: str = "window",
    max_length: int | None = None,
    max_batch_tokens: int = 32768,
    device=None,
    progress: bool | str = "auto",
    max_pieces: int = MAX_PIECES,
    on_scored=None,
) -> PLLResult:
    """PLL of each sentence with token counts; see :func:`pseudo_log_likelihood`.

    ``on_scored(idx, pll, n_tokens, n_scored)``, if given, is called after every forward pass with the input
    positions of the sentences that pass finished (each position of a duplicate included) and their values, so a
    caller can save finished work while a long call runs: one call can hold many passes (a sentence of
    ``max_pieces`` windowed pieces alone takes ``max_pieces`` rows).
    """
    import torch

    from medclr.progress import progress_bar

    sentences = _check(sentences, model, tokenizer, long)
    if batch_size < 1 or max_batch_tokens < 1 or max_pieces < 1:
        raise MedclrError("batch_size, max_batch_tokens and max_pieces must be positive")
    if word_l2r and not getattr(tokenizer, "is_fast", False):
        raise MedclrError("word_l2r=True needs a fast tokenizer (word ids); this one is slow")
    max_length = int(max_length or model_max_length(model, tokenizer))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else next(model.parameters()).device
    device = torch.device(device)
    model.to(device)
    was_training = model.training
    model.eval()
    encoder, head = _split_head(model)
    mask_id = int(tokenizer.mask_token_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    uniq, inverse = np.unique(np.asarray(sentences, dtype=object), return_inverse=True)
    inverse = inverse.reshape(-1)
    first = np.empty(len(uniq), dtype=np.int64)  # an input index of each unique sentence, for messages
    first[inverse[::-1]] = np.arange(len(inverse))[::-1]
    weight = np.bincount(inverse, minlength=len(uniq))
    enc = tokenizer([str(u) for u in uniq], add_special_tokens=True, truncation=False,
                    return_special_tokens_mask=True, verbose=False)
    n_ids = np.array([len(x) for x in enc["input_ids"]])
    blank = [j for j, m in enumerate(enc["special_tokens_mask"]) if all(m)]
    if blank:
        raise MedclrError(f"sentences[{first[blank[0]]}] has no word pieces after tokenisation "
                          f"({str(uniq[blank[0]])!r}: only special or invisible characters)")
    too_long = np.flatnonzero(n_ids > max_length)
    if long == "error" and too_long.size:
        j = too_long[0]
        raise MedclrError(
            f"sentences[{first[j]}] has {n_ids[j]} tokens, more than the model's limit of {max_length} "
            f"({too_long.size} such sentences); pass long='window' or long='truncate'"
        )
    order = np.argsort(n_ids, kind="stable")  # similar lengths share a forward pass
    pll = np.zeros(len(uniq), dtype=np.float64)
    n_tok = np.zeros(len(uniq), dtype=np.int64)
    n_sc = np.zeros(len(uniq), dtype=np.int64)
    is_long = np.zeros(len(uniq), dtype=bool)
    # the input positions of each unique sentence, for on_scored
    members = np.split(np.argsort(inverse, kind="stable"), np.cumsum(weight)[:-1])
    bar = progress_bar(total=len(sentences), unit="sent", desc="PLL", enabled=progress)
    try:
        with torch.inference_mode():
            for c0 in range(0, len(uniq), batch_size):
                chunk = order[c0 : c0 + batch_size]
                rows, pos, tgt, owner = [], [], [], []
                for j in chunk:
                    r, p, t, nt, ns, lg = _rows_for_sentence(
                        enc["input_ids"][j], enc["special_tokens_mask"][j], enc.word_ids(int(j)) if word_l2r else None,
                        max_length, mask_id, word_l2r, long, int(first[j]), max_pieces)
                    rows.extend(r)
                    pos.append(p)
                    tgt.append(t)
                    owner.append(np.full(len(p), j))
                    n_tok[j], n_sc[j], is_long[j] = nt, ns, lg
                pos, tgt, owner = np.concatenate(pos), np.concatenate(tgt), np.concatenate(owner)
                row_len = np.array([len(r) for r in rows])
                ro = np.argsort(row_len, kind="stable")
                left = np.bincount(owner, minlength=len(uniq))  # rows still to run, per sentence
                start = 0
                while start < len(ro):
                    stop = _pack(row_len[ro], start, max_batch_tokens)
                    sel = ro[start:stop]
                    width = int(row_len[sel].max())
                    ids = np.full((len(sel), width), pad_id, dtype=np.int64)
                    att = np.zeros((len(sel), width), dtype=np.int64)
                    for i, r in enumerate(sel):
                        ids[i, : row_len[r]] = rows[r]
                        att[i, : row_len[r]] = 1
                    lp = _forward(model, encoder, head, ids, att, pos[sel], tgt[sel], device)
                    np.add.at(pll, owner[sel], lp)
                    start = stop
                    touched = np.unique(owner[sel])
                    np.subtract.at(left, owner[sel], 1)
                    done = touched[left[touched] == 0]
                    if done.size:
                        bar.update(int(weight[done].sum()))
                        if on_scored is not None:
                            idx = np.concatenate([members[j] for j in done])
                            j_of = inverse[idx]
                            on_scored(idx, pll[j_of], n_tok[j_of], n_sc[j_of])
    finally:
        bar.close()
        model.train(was_training)
    n_capped = int(((n_sc == max_pieces) & (n_tok > max_pieces))[inverse].sum())
    if n_capped:
        log.warning("%d of %d sentences have more than %d word pieces (a pasted document?): only their first %d "
                    "were scored", n_capped, len(sentences), max_pieces, max_pieces)
    n_long = int(is_long[inverse].sum())
    if n_long:
        log.warning("%d of %d sentences exceed the model's %d-token limit; %s", n_long, len(sentences), max_length,
                    "each piece was scored within a centred window" if long == "window"
                    else "only their first pieces were scored")
    return PLLResult(pll=pll[inverse], n_tokens=n_tok[inverse], n_scored=n_sc[inverse], long=is_long[inverse],
                     max_length=max_length)


def _pack(lengths: np.ndarray, start: int, max_tokens: int, max_padding: float = 0.1) -> int:
    """End of the forward pass that starts at ``start`` (``lengths`` ascending).

    A pass holds at most ``max_tokens`` padded tokens, and stops growing once padding to the
    longest row would add more than ``max_padding`` of the real tokens (rows of a sentence have
    one length, so passes break between lengths; short passes are cheap anyway).
    """
    stop, real = start + 1, int(lengths[start])
    while stop < len(lengths):
        width = int(lengths[stop])
        rows = stop + 1 - start
        if rows * width > max_tokens or rows * width > (1.0 + max_padding) * (real + width):
            break
        real += width
        stop += 1
    return stop


def _forward(model, encoder, head, ids, att, pos, tgt, device):
    import torch

    ids_t = torch.from_numpy(ids).to(device)
    att_t = torch.from_numpy(att).to(device)
    rows = torch.arange(len(ids), device=device)
    pos_t = torch.from_numpy(np.asarray(pos)).to(device)
    if head is not None:
        hidden = encoder(input_ids=ids_t, attention_mask=att_t)[0]
        logits = head(hidden[rows, pos_t])
    else:
        logits = model(input_ids=ids_t, attention_mask=att_t).logits[rows, pos_t]
    logp = torch.log_softmax(logits.float(), dim=-1)
    tgt_t = torch.from_numpy(np.asarray(tgt)).to(device)
    return logp.gather(1, tgt_t[:, None])[:, 0].double().cpu().numpy()


def pseudo_log_likelihood(
    sentences: Sequence[str],
    model,
    tokenizer,
    batch_size: int = 64,
    *,
    word_l2r: bool = False,
    long: str = "window",
    max_length: int | None = None,
    max_batch_tokens: int = 32768,
    device=None,
    progress: bool | str = "auto",
) -> np.ndarray:
    """Exact pseudo-log-likelihood of each sentence (float64 array, one value per sentence, <= 0).

    ``model``: any ``AutoModelForMaskedLM`` (e.g. from :func:`medclr.lm.load_masked_lm`);
    ``tokenizer``: its tokenizer. ``batch_size``: sentences whose masked copies
    are expanded together (rows are then packed into forward passes of at most
    ``max_batch_tokens`` padded tokens, which bounds memory). ``word_l2r``:
    PLL-word-l2r instead of the original PLL. ``long``: what to do with
    sentences over the model's limit (module docstring). ``device``: ``None``
    means CUDA when present, else the model's device; the model is moved there.
    Raises :class:`MedclrError` on an empty sentence or a model without an MLM head.
    """
    return score_sentences(sentences, model, tokenizer, batch_size, word_l2r=word_l2r, long=long,
                           max_length=max_length, max_batch_tokens=max_batch_tokens, device=device,
                           progress=progress).pll
