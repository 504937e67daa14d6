"""Cross-modal retrieval metrics: R@K and median rank from a query × candidate score matrix.

``scores[q, c]`` is the score of candidate ``c`` for query ``q``; the correct candidate of
query ``q`` is ``c = q``. Ranks are 1-based. Ties are counted PESSIMISTICALLY by default: a
candidate scoring exactly as high as the correct one is ranked above it, so a constant
(uninformative) score matrix gives every query the worst rank rather than rank 1. Pass
``ties="optimistic"`` for the other convention (only strictly higher candidates count).
Documented in ``docs/evaluation.md`` (section "Retrieval").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["DEFAULT_KS", "bidirectional_retrieval", "ranks", "retrieval_metrics"]

DEFAULT_KS: tuple[int, ...] = (10, 50, 100)

# Rows compared per block: block × n_candidates booleans stay around 64 MB for 10^4 candidates.
_BLOCK_ELEMENTS = 1 << 26


def ranks(scores: np.ndarray, *, ties: str = "pessimistic") -> np.ndarray:
    """1-based rank of the correct candidate (``c = q``) for every query ``q``.

    ``rank = 1 + #{c : s[q, c] > s[q, q]}`` plus, with ``ties="pessimistic"``, the number of
    OTHER candidates with ``s[q, c] == s[q, q]``. Needs at least as many candidates as queries
    (extra columns are distractors). NaN/inf scores are rejected. Exact comparisons, blocked
    over rows: O(Q·C) time and bounded memory, fine for 10^4 × 10^4.
    """
    if ties not in ("pessimistic", "optimistic"):
        raise ValueError(f"ties must be 'pessimistic' or 'optimistic', got {ties!r}")
    s = np.asarray(scores)
    if s.ndim != 2:
        raise ValueError(f"scores must be a 2-D (queries, candidates) matrix, got shape {s.shape}")
    n_q, n_c = s.shape
    if n_q == 0:
        raise ValueError("scores has no queries")
    if n_c < n_q:
        raise ValueError(f"need candidates >= queries (correct candidate of q is column q), got {s.shape}")
    if not np.issubdtype(s.dtype, np.number) or not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite numbers (no NaN/inf)")
    out = np.empty(n_q, dtype=np.int64)
    block = max(1, _BLOCK_ELEMENTS // max(n_c, 1))
    for start in range(0, n_q, block):
        stop = min(n_q, start + block)
        rows = s[start:stop]
        correct = rows[np.arange(stop - start), np.arange(start, stop)][:, None]
        if ties == "pessimistic":
            better = np.count_nonzero(rows >= correct, axis=1) - 1  # minus the correct one itself
        else:
            better = np.count_nonzero(rows > correct, axis=1)
        out[start:stop] = better + 1
    return out


def retrieval_metrics(
    scores: np.ndarray, ks: Sequence[int] = DEFAULT_KS, *, ties: str = "pessimistic"
) -> dict[str, float]:
    """``{"R@10", "R@50", "R@100", "MedR"}`` for ``scores[q, c]`` (correct candidate ``c = q``).

    ``R@K`` = fraction of queries whose correct candidate has rank ≤ K (1.0 whenever
    K ≥ number of candidates). ``MedR`` = ``np.median`` of the 1-based ranks (may end in .5
    for an even number of queries). See :func:`ranks` for the tie policy.
    """
    r = ranks(scores, ties=ties)
    out = {f"R@{int(k)}": float(np.mean(r <= int(k))) for k in ks}
    out["MedR"] = float(np.median(r))
    return out


def bidirectional_retrieval(
    scores: np.ndarray, ks: Sequence[int] = DEFAULT_KS, *, ties: str = "pessimistic"
) -> dict[str, float]:
    """Image→text and text→image retrieval from one square matrix ``scores[image, text]``.

    Image→text uses ``scores`` (rows are image queries), text→image uses ``scores.T``.
    Returns flat keys ``i2t/R@K``, ``i2t/MedR``, ``t2i/R@K``, ``t2i/MedR`` plus the paper's
    Table 1 summaries: ``Recall`` = mean of R@K over K and both directions, and ``MedR`` =
    mean of the two directions' MedR (Table 1's MedR matches the mean of Table 5's two
    columns: (151+146)/2 → 148, (123+107)/2 = 115, (106+102)/2 = 104).
    """
    s = np.asarray(scores)
    if s.ndim != 2 or s.shape[0] != s.shape[1]:
        raise ValueError(f"bidirectional retrieval needs a square (images, texts) matrix, got {s.shape}")
    i2t = retrieval_metrics(s, ks, ties=ties)
    t2i = retrieval_metrics(s.T, ks, ties=ties)
    out: dict[str, float] = {}
    for name, res in (("i2t", i2t), ("t2i", t2i)):
        out.update({f"{name}/{k}": v for k, v in res.items()})
    recalls = [res[f"R@{int(k)}"] for res in (i2t, t2i) for k in ks]
    out["Recall"] = float(np.mean(recalls))
    out["MedR"] = float((i2t["MedR"] + t2i["MedR"]) / 2.0)
    return out
