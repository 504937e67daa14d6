"""The negation hard-negative term: each image must score its sentence above that sentence's negation.

For a pair (image i, sentence t_i) whose sentence has a rule negation n_i
(:func:`medclr.data.negation.negate`), with s the similarity head's score and tau a temperature,

    l_i = -log( exp(s(i, t_i)/tau) / (exp(s(i, t_i)/tau) + exp(s(i, n_i)/tau)) )
        = softplus( (s(i, n_i) - s(i, t_i)) / tau ),

the two-way softmax NegCLIP's extra hard negatives reduce to when only the negation competes
(Yuksekgonul et al., ICLR 2023, add them to the InfoNCE denominator instead). Kept as a term of its
own, added to any contrastive loss, so every loss keeps its exact formula (and its per-sample
tables) and the term works the same for all of them. The term is mean over the global batch's
negatable pairs: each process passes its local sum scaled so that DDP's gradient average is the
full-batch mean (the contrastive losses' own convention, docs/losses.md).
"""

from __future__ import annotations

import torch
from torch import nn


def negation_term(pos: torch.Tensor, neg: torch.Tensor, tau: float, global_count: int, world_size: int = 1
                  ) -> torch.Tensor:
    """sum_i softplus((neg_i - pos_i) / tau) * world_size / global_count (0 when no pair is negatable).

    ``pos``/``neg``: the local pairs' scores s(i, t_i), s(i, n_i); ``global_count``: negatable pairs
    over all processes. With one process this is the mean of l_i."""
    if global_count <= 0:
        return pos.sum() * 0.0  # keeps the graph (DDP expects every parameter's gradient)
    return nn.functional.softplus((neg.float() - pos.float()) / tau).sum() * (world_size / global_count)


__all__ = ["negation_term"]
