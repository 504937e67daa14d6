"""Debiased contrastive loss: constant eta (Chuang et al. 2020) and per-sample eta (DCL-eta_LM).

Formula (sample-specific debiasing paper, Eq. 6-8, M = 1 with the positive reused as the
positive-class sample, N = B - 1 in-batch negatives), per anchor i and direction:
    Ng_i   = max((sum_{j != i} e^{s_ij/tau} - N eta_i e^{s_ii/tau}) / (1 - eta_i), N e^{-1/tau})
    loss_i = -log(e^{s_ii/tau} / (e^{s_ii/tau} + Ng_i))
computed in log space by functional.dcl_rows.

Which eta for which direction: the paper anchors on the report (x = text, x+ = its image,
negatives = the other images) and sets eta(x) = a * p_LM(x)^k from the text's likelihood.
eta estimates rho(c), the probability of the *pair's* latent class, and image i and text i
share that class, so the image-anchored row i (negatives = other texts) uses the same eta_i:
both directions of pair i use eta_i = eta_LM(text_i).
"""

from __future__ import annotations

from medclr.errors import MedclrError
from medclr.losses.base import ContrastiveLoss
from medclr.losses.functional import as_eta, check_tau, dcl_rows


class DCLLoss(ContrastiveLoss):
    """DCL with one class prior eta for every sample (the `eta` call argument is ignored)."""

    def __init__(self, tau: float = 0.07, eta: float = 0.1, normalize: bool = True):
        super().__init__(normalize)
        self.tau = check_tau(tau)
        if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not 0.0 <= eta < 1.0:
            raise MedclrError(f"eta: expected a constant in [0, 1), got {eta!r}")
        self.eta = float(eta)

    def _eta(self, batch, eta):
        return as_eta(self.eta, batch.b, batch.like)

    def compute(self, batch, index=None, eta=None):
        eta_rows = self._eta(batch, eta)
        s_i2t, s_t2i = batch.sims()
        rows = dcl_rows(s_i2t, batch.pos, self.tau, eta_rows) + dcl_rows(s_t2i, batch.pos, self.tau, eta_rows)
        return batch.reduce_rows(0.5 * rows)


class DCLLMLoss(DCLLoss):
    """DCL-eta_LM: a per-pair eta tensor (b,) in [0, 1) must be passed with every call.

    eta_i = a * p_LM(text_i)^k is computed upstream (medclr.lm); only local anchors need
    their own eta, so nothing is gathered across ranks.
    """

    def __init__(self, tau: float = 0.07, normalize: bool = True):
        super().__init__(tau=tau, eta=0.0, normalize=normalize)
        del self.eta

    def _eta(self, batch, eta):
        if eta is None:
            raise MedclrError("eta: dcl_lm needs the per-pair class probability eta (a tensor of shape (b,))")
        return as_eta(eta, batch.b, batch.like)
