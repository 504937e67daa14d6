"""Symmetric InfoNCE (CLIP loss) with a fixed temperature."""

from __future__ import annotations

from medclr.losses.base import ContrastiveLoss
from medclr.losses.functional import check_tau, info_nce_rows


class InfoNCELoss(ContrastiveLoss):
    """mean_i 1/2 [ -log softmax_j(s_ij/tau)[i] - log softmax_j(s_ji/tau)[i] ].

    tau is fixed (a hyperparameter); the default 0.07 is close to the DCL-eta_LM paper's
    learned radius gamma = sqrt(14), i.e. tau = 1/14.
    """

    def __init__(self, tau: float = 0.07, normalize: bool = True):
        super().__init__(normalize)
        self.tau = check_tau(tau)

    def compute(self, batch, index=None, eta=None):
        s_i2t, s_t2i = batch.sims()
        rows = info_nce_rows(s_i2t, batch.pos, self.tau) + info_nce_rows(s_t2i, batch.pos, self.tau)
        return batch.reduce_rows(0.5 * rows)
