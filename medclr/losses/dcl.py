"""Debiased contrastive loss: constant eta (Chuang et al. 2020) and per-sample eta (DCL-eta_LM).

Formula (sample-specific debiasing paper, Eq. 6-8, M = 1 with the positive reused as the
positive-class sample, N = B - 1 in-batch negatives), per anchor i:
    Ng_i   = max((sum_{j != i} e^{s_ij/tau} - N eta_i e^{s_ii/tau}) / (1 - eta_i), N e^{-1/tau})
    loss_i = -log(e^{s_ii/tau} / (e^{s_ii/tau} + Ng_i))
computed in log space by functional.dcl_rows.

Anchor (``anchor="text"``, the default): the paper anchors on the report. "Given a reference
text x, we assign x+ to be the associated image ... and treat all unpaired images in a batch as
{x_n-}", with eta(x) = a * p_LM(x)^k the text's own class probability. So the loss is the mean
over text-anchored rows only (sentence i against all images of the global batch), each with
eta_i = eta(text_i). This is the objective whose numbers the paper reports.

``anchor="symmetric"`` averages those rows with the image-anchored ones (image i against all
sentences), both with eta_i: eta estimates rho(c), the probability of the *pair's* latent class,
which image i and text i share. One might choose it to train the image tower as an anchor too
(image->text retrieval, zero-shot classification score images against prompts), as CLIP-style
losses do; it is not the paper's objective, so results under it are not the paper's method.
"""

from __future__ import annotations

from medclr.errors import MedclrError
from medclr.losses.base import ContrastiveLoss
from medclr.losses.functional import as_eta, check_anchor, check_tau, dcl_rows


class DCLLoss(ContrastiveLoss):
    """DCL with one class prior eta for every sample (the `eta` call argument is ignored).

    anchor: "text" (the paper's Eq. 7: report anchors, images as candidates) or "symmetric".
    """

    def __init__(self, tau: float = 0.07, eta: float = 0.1, normalize: bool = True, anchor: str = "text"):
        super().__init__(normalize)
        self.tau = check_tau(tau)
        if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not 0.0 <= eta < 1.0:
            raise MedclrError(f"eta: expected a constant in [0, 1), got {eta!r}")
        self.eta = float(eta)
        self.anchor = check_anchor(anchor)

    def _eta(self, batch, eta):
        return as_eta(self.eta, batch.b, batch.like)

    def compute(self, batch, index=None, eta=None):
        eta_rows = self._eta(batch, eta)
        s_i2t, s_t2i = batch.sims()
        rows = dcl_rows(s_t2i, batch.pos, self.tau, eta_rows)
        if self.anchor == "symmetric":
            rows = 0.5 * (dcl_rows(s_i2t, batch.pos, self.tau, eta_rows) + rows)
        return batch.reduce_rows(rows)


class DCLLMLoss(DCLLoss):
    """DCL-eta_LM: a per-pair eta tensor (b,) in [0, 1) must be passed with every call.

    eta_i = a * p_LM(text_i)^k is computed upstream (medclr.lm); only local anchors need
    their own eta, so nothing is gathered across ranks.
    """

    def __init__(self, tau: float = 0.07, normalize: bool = True, anchor: str = "text"):
        super().__init__(tau=tau, eta=0.0, normalize=normalize, anchor=anchor)
        del self.eta

    def _eta(self, batch, eta):
        if eta is None:
            raise MedclrError("eta: dcl_lm needs the per-pair class probability eta (a tensor of shape (b,))")
        return as_eta(eta, batch.b, batch.like)
