"""A deterministic WordPiece vocabulary learner (the one in ``tokenizers`` is not reproducible).

``tokenizers.trainers.WordPieceTrainer`` gives a different vocabulary on every
run, even in one process (its merge ties are broken by Rust hash-map order;
checked with tokenizers 0.23.3: 4 of 5 runs on the same 30 sentences differed).
A different vocabulary means a different model for the same seed, so medclr
learns the vocabulary itself with the same algorithm, ties broken by the
strings:

* words come from the BERT normaliser (lower case, accents stripped) and the
  BERT pre-tokeniser of ``tokenizers`` (both deterministic);
* the initial alphabet is every character, as ``c`` at a word start and
  ``##c`` inside a word;
* the most frequent adjacent pair with count >= ``min_frequency`` is merged
  ("pl" + "##eur" -> "pleur", "##eu" + "##r" -> "##eur") until the vocabulary
  holds ``vocab_size`` pieces or no pair is frequent enough (ties: the
  lexicographically smallest pair).

Tokenisation is the usual WordPiece greedy longest match (``tokenizers.models.WordPiece``).
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable

PREFIX = "##"


def count_words(sentences: Iterable[str]) -> Counter:
    """Word counts after BERT normalisation and pre-tokenisation."""
    from tokenizers import normalizers, pre_tokenizers

    norm = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    counts: Counter = Counter()
    for s in sentences:
        counts.update(w for w, _ in pre.pre_tokenize_str(norm.normalize_str(s)))
    return counts


def _merge_name(a: str, b: str) -> str:
    return a + (b[len(PREFIX):] if b.startswith(PREFIX) else b)


def learn_vocab(word_counts: Counter, vocab_size: int, min_frequency: int = 2,
                special_tokens: Iterable[str] = ()) -> list[str]:
    """Vocabulary in id order: special tokens, the sorted alphabet, then the merges in order."""
    words = sorted(word_counts)
    symbols = [[w[0]] + [PREFIX + c for c in w[1:]] for w in words]
    freq = [word_counts[w] for w in words]
    vocab = list(dict.fromkeys(special_tokens))
    seen = set(vocab)
    for tok in sorted({t for sym in symbols for t in sym}):
        if tok not in seen:
            vocab.append(tok)
            seen.add(tok)
    pairs: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, sym in enumerate(symbols):
        for p in zip(sym, sym[1:]):
            pairs[p] += freq[i]
            where[p].add(i)
    heap = [(-c, p) for p, c in pairs.items() if c >= min_frequency]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        neg, pair = heapq.heappop(heap)
        current = pairs.get(pair, 0)
        if -neg != current:  # stale entry: its count went down since it was pushed
            if current >= min_frequency:
                heapq.heappush(heap, (-current, pair))
            continue
        a, b = pair
        new = _merge_name(a, b)
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop(pair, ())):
            sym = symbols[i]
            for p in zip(sym, sym[1:]):
                pairs[p] -= freq[i]
                changed.add(p)
            merged, j = [], 0
            while j < len(sym):
                if j + 1 < len(sym) and sym[j] == a and sym[j + 1] == b:
                    merged.append(new)
                    j += 2
                else:
                    merged.append(sym[j])
                    j += 1
            symbols[i] = merged
            for p in zip(merged, merged[1:]):
                pairs[p] += freq[i]
                where[p].add(i)
                changed.add(p)
        pairs.pop(pair, None)
        for p in sorted(changed):
            c = pairs.get(p, 0)
            if c <= 0:
                pairs.pop(p, None)
                where.pop(p, None)
            elif c >= min_frequency and p != pair:
                heapq.heappush(heap, (-c, p))
        if new not in seen:
            vocab.append(new)
            seen.add(new)
    return vocab
