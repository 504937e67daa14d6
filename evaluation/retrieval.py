"""Cross-modal retrieval metrics: R@K and median rank from a query × candidate score matrix.

``scores[q, c]`` is the score of candidate ``c`` for query ``q``; the correct candidate of
query ``q`` is ``c = q``. Ranks are 1-based. Ties are counted PESSIMISTICALLY by default: a
candidate scoring exactly as high as the correct one is ranked above it, so a constant
(uninformative) score matrix gives every query the worst rank rather than rank 1. Pass
``ties="optimistic"`` for the other convention (only strictly higher candidates count).
Documented in ``docs/evaluation.md`` (section "Retrieval").

The paper's metrics (:func:`ranks`, :func:`retrieval_metrics`, :func:`bidirectional_retrieval`) live in
the core (``medclr.metrics``), because training's validation computes them too; they are re-exported
here. :func:`text_level_retrieval` is evaluation's own view, with identical texts merged.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from medclr.metrics import DEFAULT_KS, bidirectional_retrieval, ranks, retrieval_metrics

__all__ = ["DEFAULT_KS", "bidirectional_retrieval", "ranks", "retrieval_metrics", "text_level_retrieval"]


def text_level_retrieval(s: np.ndarray, texts, ks=(10, 50, 100)) -> dict:
    """Retrieval where identical phrase texts are one candidate (CXR-Phantom repeats template sentences).

    Image->text: each box feature ranks the DISTINCT texts (pessimistic ties). Text->image: each distinct
    text ranks the boxes; its rank is that of its best box among those whose phrase has this text.
    Chance R@K: K/U for i2t (U distinct texts); for t2i, 1 - C(n-g, K)/C(n, K) averaged over texts
    (g = boxes with the text: no correct box among K drawn at random)."""
    from scipy.special import gammaln

    codes, uniq = pd.factorize(pd.Series(list(texts)))
    n, u = len(codes), len(uniq)
    first = np.array([np.flatnonzero(codes == c)[0] for c in range(u)])
    a = s[:, first]  # (n boxes, u texts); duplicates have identical columns
    correct = a[np.arange(n), codes]
    i2t = np.count_nonzero(a >= correct[:, None], axis=1)  # 1-based, the correct one counted once
    t2i = np.empty(u, np.int64)
    for c in range(u):
        col, mine = a[:, c], codes == c
        t2i[c] = 1 + np.count_nonzero(col[~mine] >= col[mine].max())
    g = np.bincount(codes, minlength=u)

    def p_hit(k: int) -> float:  # P(at least one of the g correct boxes among k random ones)
        if k >= n:
            return 1.0
        lc = lambda a_, b_: gammaln(a_ + 1) - gammaln(b_ + 1) - gammaln(a_ - b_ + 1)  # noqa: E731
        return float(np.mean([1.0 if n - gi < k else 1.0 - np.exp(lc(n - gi, k) - lc(n, k)) for gi in g]))

    out = {"n_texts": int(u)}
    for name, r in (("i2t", i2t), ("t2i", t2i)):
        out.update({f"{name}/R@{k}": float(np.mean(r <= k)) for k in ks})
        out[f"{name}/MedR"] = float(np.median(r))
    out["Recall"] = float(np.mean([out[f"{d}/R@{k}"] for d in ("i2t", "t2i") for k in ks]))
    out["MedR"] = (out["i2t/MedR"] + out["t2i/MedR"]) / 2.0
    out["chance"] = {**{f"i2t/R@{k}": min(k, u) / u for k in ks}, **{f"t2i/R@{k}": p_hit(k) for k in ks}}
    out["chance"]["Recall"] = float(np.mean(list(out["chance"].values())))
    return out
