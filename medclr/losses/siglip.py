"""Sigmoid image-text loss (SigLIP, Zhai et al. 2023).

    loss = -(1/B) sum_i sum_j log sigmoid(z_ij * (t * s_ij + b)),  z_ii = +1, z_ij = -1 (i != j)

t = exp(log_scale) and b are learnable nn.Parameters by default (init t = 10, b = -10, the
paper's values; the strongly negative bias offsets the B-1 : 1 negative/positive imbalance at
the start), or fixed buffers with learnable=False. When learnable, the trainer must hand
loss.parameters() to the optimizer and, under DDP, average their gradients across ranks like
the model's (e.g. make the loss a submodule of the DDP-wrapped module).

Each pair is scored once, so the loss is symmetric by construction; there is no separate
text->image term. Under torch.distributed each rank scores its local rows against all B
columns, which covers every (i, j) exactly once over the ranks.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from medclr.losses.base import ContrastiveLoss


class SigLIPLoss(ContrastiveLoss):
    def __init__(self, scale_init: float = 10.0, bias_init: float = -10.0, learnable: bool = True, normalize: bool = True):
        super().__init__(normalize)
        log_scale = torch.tensor(math.log(scale_init), dtype=torch.float32)
        bias = torch.tensor(float(bias_init), dtype=torch.float32)
        if learnable:
            self.log_scale = nn.Parameter(log_scale)
            self.bias = nn.Parameter(bias)
        else:
            self.register_buffer("log_scale", log_scale)
            self.register_buffer("bias", bias)

    def compute(self, batch, index=None, eta=None):
        s, _ = batch.sims()
        logits = s * self.log_scale.to(s.dtype).exp() + self.bias.to(s.dtype)
        sign = torch.full_like(logits, -1.0).scatter(1, batch.pos[:, None], 1.0)
        rows = -F.logsigmoid(sign * logits).sum(dim=1)
        return batch.reduce_rows(rows)
