"""InfoNCE with a fixed temperature: symmetric (CLIP loss) by default, or text-anchored."""

from __future__ import annotations

from medclr.losses.base import ContrastiveLoss
from medclr.losses.functional import check_anchor, check_tau, info_nce_rows


class InfoNCELoss(ContrastiveLoss):
    """mean_i 1/2 [ -log softmax_j(s_ij/tau)[i] - log softmax_j(s_ji/tau)[i] ].

    tau is fixed (a hyperparameter); the default 0.07 is close to the DCL-eta_LM paper's
    learned radius gamma = sqrt(14), i.e. tau = 1/14.
    anchor="text" keeps only the text-anchored term mean_i -log softmax_j(s_ji/tau)[i]: the
    no-correction baseline of text-anchored DCL (equal to it at eta = 0), so the two differ by
    the debiasing alone.
    """

    def __init__(self, tau: float = 0.07, normalize: bool = True, anchor: str = "symmetric"):
        super().__init__(normalize)
        self.tau = check_tau(tau)
        self.anchor = check_anchor(anchor)

    def compute(self, batch, index=None, eta=None):
        s_i2t, s_t2i = batch.sims()
        rows = info_nce_rows(s_t2i, batch.pos, self.tau)
        if self.anchor == "symmetric":
            rows = 0.5 * (info_nce_rows(s_i2t, batch.pos, self.tau) + rows)
        return batch.reduce_rows(rows)
