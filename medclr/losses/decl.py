"""DeCL: decomposable contrastive loss with Gamma auxiliary variables and stochastic EM.

Paper: "Decomposable contrastive learning by Bayesian data augmentation", Algorithm 1 and
Eq. 2-3. The paper's similarity scores are exponentiated: S_ik = exp(cos_ik / tau). Per
anchor i and direction (negatives k = the other B-1 candidates of the global batch):
  loss_1_i = u_i * mean_k S_ik - log S_ii                 decomposable loss (Eq. 3, Alg. 1 line 8)
  loss_2_i = log sum_k S_ik - log S_ii                    smoothing loss (Alg. 1 line 9)
  loss     = lambda_t * loss_1 + (1 - lambda_t) * loss_2  (line 10), lambda_t = lambda0 / (1 + t / T)
  u_i ~ Gamma(shape 1, rate m_i): the posterior of u_i is Gamma(1, E[S_ik]) (Sec. 2.2.3,
  "Simulation"); m_i is a per-sample moving average of mean_k S_ik over the minibatches in
  which sample i appeared (the paper's "global buffer ... updated by moving averages").
loss_2 follows line 9 literally (negatives only, no positive in the log-sum): it is the
minibatch marginal of Eq. 5, s+ / E[S-], up to the constant log(B-1). The paper's prose calls
it "equivalent to the standard minibatch info-NCE"; the two differ by the positive term in
the denominator. lambda_t decreasing (the paper recommends proportional to 1/t) moves weight
from the fresh sample to the smoothed objective; lambda_decay_steps=None keeps lambda0
(lambda0 = 1: loss_1 only, the paper's ImageNet setting). The paper's alternating
loss_1 / loss_2 steps (Open-CLIP run) are left to the training loop.

Numerics: log m_i and lme_i = log mean_k S_ik are kept as logs; u_i * mean_k S_ik =
E_i * exp(lme_i - log m_i) with E_i ~ Exp(1), and since m_i is updated with the current batch
first, lme_i - log m_i <= -log(gamma): nothing overflows at tau = 0.01.

State (buffers): rate_img / rate_txt = log m per dataset index (-inf = never seen), `step`.
Sampling is counter-based: the Exp(1) draws of step t come from a CPU generator seeded with
(seed, t), for the whole global batch, and each rank takes its rows -- deterministic,
resumable from `step` alone, identical on every rank and to a single-process run.
Without num_samples (or in eval) m_i is the current batch's mean (no table); eval() also
replaces the random u by its posterior mean 1/m_i, so evaluation is deterministic.
"""

from __future__ import annotations

import math

import torch

from medclr.errors import MedclrError
from medclr.losses._logspace import dedup_mean, diag_and_negatives, ema_log
from medclr.losses.base import ContrastiveLoss, check_index
from medclr.losses.functional import check_tau


class DeCLLoss(ContrastiveLoss):
    def __init__(
        self,
        num_samples: int | None = None,
        tau: float = 0.07,
        gamma: float = 0.9,
        lambda0: float = 1.0,
        lambda_decay_steps: float | None = 1000.0,
        seed: int = 0,
        normalize: bool = True,
    ):
        super().__init__(normalize)
        self.tau = check_tau(tau)
        if not 0.0 < gamma <= 1.0:
            raise MedclrError(f"gamma: expected the moving-average weight on the new estimate in (0, 1], got {gamma!r}")
        if not 0.0 <= lambda0 <= 1.0:
            raise MedclrError(f"lambda0: expected a weight in [0, 1], got {lambda0!r}")
        if lambda_decay_steps is not None and lambda_decay_steps <= 0:
            raise MedclrError(f"lambda_decay_steps: expected a positive number or None, got {lambda_decay_steps!r}")
        self.num_samples, self.gamma = num_samples, float(gamma)
        self.lambda0, self.lambda_decay_steps, self.seed = float(lambda0), lambda_decay_steps, int(seed)
        if num_samples is not None:
            if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
                raise MedclrError(f"num_samples: expected the dataset size (a positive int), got {num_samples!r}")
            self.register_buffer("rate_img", torch.full((num_samples,), float("-inf")))
            self.register_buffer("rate_txt", torch.full((num_samples,), float("-inf")))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def lambda_at(self, step: int) -> float:
        if self.lambda_decay_steps is None:
            return self.lambda0
        return self.lambda0 / (1.0 + step / self.lambda_decay_steps)

    def draw_exponential(self, step: int, rows: int) -> torch.Tensor:
        """The (2, rows) Exp(1) draws of `step` (row 0: image anchors, row 1: text anchors)."""
        g = torch.Generator(device="cpu").manual_seed((self.seed * 1_000_003 + step) % (2**63 - 1))
        return torch.empty((2, rows), dtype=torch.float64).exponential_(1.0, generator=g)

    def compute(self, batch, index=None, eta=None):
        train, tau, step = self.training, self.tau, int(self.step)
        tables = self.num_samples is not None
        if tables and train:
            idx = check_index(index, batch.b, self.num_samples, batch.device)
            idx_all = batch.gather(idx).to(self.rate_img.device)
        parts = []
        for s in batch.sims():
            pos_logit, neg = diag_and_negatives(s / tau, batch.pos)
            lse_neg = torch.logsumexp(neg, dim=1)  # log sum_k S_ik, differentiable
            parts.append((pos_logit, lse_neg, lse_neg - math.log(batch.B - 1)))
        lme = torch.stack([p[2].detach() for p in parts], dim=1)  # (b, 2) log mean_k S_ik
        if tables and train:
            lme_all = batch.gather(lme).to(self.rate_img.device)
            log_rate = []
            with torch.no_grad():
                for k, m in enumerate(("img", "txt")):
                    table = getattr(self, f"rate_{m}")
                    new = ema_log(table[idx_all].to(lme_all.dtype), lme_all[:, k], self.gamma)
                    uniq, reduced, per_pos = dedup_mean(idx_all, new, log_space=True)
                    table[uniq] = reduced.to(table.dtype)
                    log_rate.append(batch.local(per_pos).to(lme.device, lme.dtype))
            log_rate = torch.stack(log_rate, dim=1)
        else:
            log_rate = lme  # the current batch's mean (method 2 of Sec. 2.2.3 without momentum net)
        if train:
            e = self.draw_exponential(step, batch.B)[:, batch.offset : batch.offset + batch.b]
            log_e = e.T.to(device=lme.device, dtype=lme.dtype).log()
        else:
            log_e = torch.zeros_like(lme)  # E[u] = 1/m: deterministic evaluation
        lam = self.lambda_at(step)
        rows = 0.0
        for k, (pos_logit, lse_neg, lme_k) in enumerate(parts):
            loss_1 = torch.exp(log_e[:, k] - log_rate[:, k] + lme_k) - pos_logit
            loss_2 = lse_neg - pos_logit
            rows = rows + lam * loss_1 + (1.0 - lam) * loss_2
        if train:
            self.step += 1
        return batch.reduce_rows(0.5 * rows)
