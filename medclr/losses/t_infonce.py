"""Student-t kernel InfoNCE (t-SimCLR; Hu et al., ICLR 2023, Eq. 4.1) with weighted positives.

Kernel between image i and text j (t_df = nu, default 5 as the paper recommends):
    log q_ij = -(nu + 1)/2 * log1p(||x_i - y_j||^2 / (tau * nu))
(log1p form: exact for small distances and free of the q -> 0 underflow of q itself).

normalization="global" (default, Eq. 4.1): one t-SNE-style normaliser over all pairs,
    loss = -(1/B) sum_i w_i log q_ii + log sum_{i,j} q_ij.
Eq. 4.1 is written for one modality with 2n augmented views (pairs j != k among the views);
the image-text analogue keeps only the B^2 cross-modal pairs (there are no self pairs), so
image->text and text->image are the same sum and the loss is symmetric by construction.
normalization="anchor": per-anchor cross-entropy (the t-SimCNE / CLIP form),
    loss = 1/2 mean_i w_i [(lse_j log q_ij - log q_ii) + (lse_j log q_ji - log q_ii)].

Weighted positive pairs (Sec. 4.1: (1/2n) sum_i p_ii' (l(x_i, x_i') + l(x_i', x_i))): pass
`weight` (b,) >= 0 to forward; weights are rescaled to mean 1 over the global batch (the
paper's p_ii' is only defined up to proportionality), so uniform weights change nothing.

With normalize=True (default) ||x - y||^2 = 2 - 2 cos, bounded by 4 (on a head's scores, e.g.
LSE+NL, the same d^2 = 2 - 2 s of the pooled similarity), and tau ~ 1 is the
useful range (the paper's 1000-epoch CIFAR-10 t-SimCLR run uses tau = 10, App. C.1); normalize=False
gives the Euclidean feature space of the paper's Sec. 3.1.4.
"""

from __future__ import annotations

import torch

from medclr.errors import MedclrError
from medclr.losses._logspace import diag_and_negatives
from medclr.losses.base import ContrastiveLoss
from medclr.losses.distributed import gather_with_grad
from medclr.losses.functional import check_tau


class TInfoNCELoss(ContrastiveLoss):
    def __init__(self, tau: float = 1.0, t_df: float = 5.0, normalization: str = "global", normalize: bool = True):
        super().__init__(normalize)
        self.tau = check_tau(tau)
        self.t_df = check_tau(t_df, "t_df")
        if normalization not in ("global", "anchor"):
            raise MedclrError(f"normalization: expected 'global' or 'anchor', got {normalization!r}")
        self.normalization = normalization

    def _log_kernel(self, a: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        if self.normalize:
            d2 = 2.0 - 2.0 * s
        else:
            d2 = (a * a).sum(1)[:, None] + (c * c).sum(1)[None, :] - 2.0 * s
        nu = self.t_df
        return -(nu + 1.0) / 2.0 * torch.log1p(d2.clamp_min(0.0) / (self.tau * nu))

    def _weights(self, batch, weight):
        if weight is None:
            return None
        if not isinstance(weight, torch.Tensor) or weight.shape != (batch.b,):
            raise MedclrError(f"weight: expected a tensor of shape ({batch.b},) of positive-pair weights")
        w = weight.detach().to(device=batch.device, dtype=batch.dtype)
        total = batch.gather(w).sum()
        if bool((w < 0).any()) or not bool(total > 0):
            raise MedclrError("weight: expected non-negative weights with a positive sum")
        return w * (batch.B / total)

    def compute(self, batch, index=None, eta=None, weight=None):
        if batch.img is None and not self.normalize:
            raise MedclrError("t_infonce with normalize=False needs embeddings (Euclidean distances); a head's "
                              "similarity scores only define the kernel on the sphere (normalize=True: d^2 = 2 - 2 s)")
        w = self._weights(batch, weight)
        s_i2t, s_t2i = batch.sims()
        lk = self._log_kernel(batch.img, batch.txt_all, s_i2t)
        diag, _ = diag_and_negatives(lk, batch.pos)
        if self.normalization == "global":
            pos_rows = -diag if w is None else -w * diag
            lse = torch.logsumexp(lk.reshape(-1), dim=0)
            if batch.world > 1:
                # log Z needs every rank's block: gather the per-rank log-sums with gradient.
                lse = torch.logsumexp(gather_with_grad(lse[None], [1] * batch.world), dim=0)
            # The log Z term appears once on each rank: DDP's 1/W average counts it once.
            return batch.reduce_rows(pos_rows) + lse
        lk_t = self._log_kernel(batch.txt, batch.img_all, s_t2i)
        rows = (torch.logsumexp(lk, 1) - diag) + (torch.logsumexp(lk_t, 1) - diag)
        rows = 0.5 * rows if w is None else 0.5 * w * rows
        return batch.reduce_rows(rows)
