"""Cross-modal retrieval metrics: R@K and median rank from a query × candidate score matrix.

``scores[q, c]`` is the score of candidate ``c`` for query ``q``; the correct candidate of
query ``q`` is ``c = q``. Ranks are 1-based. Ties are counted PESSIMISTICALLY by default: a
candidate scoring exactly as high as the correct one is ranked above it, so a constant
(uninformative) score matrix gives every query the worst rank rather than rank 1. Pass
``ties="optimistic"`` for the other convention (only strictly higher candidates count).
Documented in ``docs/evaluation.md`` (section "Retrieval").

The paper's metrics (:func:`ranks`, :func:`retrieval_metrics`, :func:`bidirectional_retrieval`) live in
the core (``medclr.metrics``), because training's validation computes them too; they are re-exported
here.
"""

from __future__ import annotations

from medclr.metrics import DEFAULT_KS, bidirectional_retrieval, ranks, retrieval_metrics

__all__ = ["DEFAULT_KS", "bidirectional_retrieval", "ranks", "retrieval_metrics"]

