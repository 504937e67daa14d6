"""The hard-negative term: each image must score its sentence above the rule-made sentences its
report contradicts (``medclr.data.hard_negatives``: the negation, another finding, the other side).

For a pair (image i, sentence t_i) and one of its hard negatives n (a pair may have several; each
counts once), with s the similarity head's score and tau a temperature,

    l = -log( exp(s(i, t_i)/tau) / (exp(s(i, t_i)/tau) + exp(s(i, n)/tau)) )
        = softplus( (s(i, n) - s(i, t_i)) / tau ),

the two-way softmax NegCLIP's extra hard negatives reduce to when only one of them competes
(Yuksekgonul et al., ICLR 2023, add them to the InfoNCE denominator instead). Kept as a term of its
own, added to any contrastive loss, so every loss keeps its exact formula (and its per-sample
tables) and the term works the same for all of them. The term is the mean over the global batch's
(pair, hard negative) rows: each process passes its local sum scaled so that DDP's gradient average is the
full-batch mean (the contrastive losses' own convention, docs/losses.md).
"""

from __future__ import annotations

import torch
from torch import nn


def hard_negative_term(pos: torch.Tensor, neg: torch.Tensor, tau: float, global_count: int, world_size: int = 1
                  ) -> torch.Tensor:
    """sum_i softplus((neg_i - pos_i) / tau) * world_size / global_count (0 when there is no row).

    ``pos``/``neg``: per local row, s(i, t_i) and s(i, n); ``global_count``: rows over all processes.
    With one process this is the mean of l."""
    if global_count <= 0:
        return pos.sum() * 0.0  # keeps the graph (DDP expects every parameter's gradient)
    return nn.functional.softplus((neg.float() - pos.float()) / tau).sum() * (world_size / global_count)


__all__ = ["hard_negative_term"]
