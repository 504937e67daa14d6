"""NUCLR (Wang, Lei, Ying, Yang; arXiv version Eq. 7-15, Algorithm 1) and SogCLR (zeta = xi = 0).

Per direction (image anchors i, text candidates j; the text-anchored direction mirrors it
with the image tables), with d_ij = s_ij - s_ii, batch size B, dataset size n:
  phi_i   = (n-1)/(B-1) sum_{j in B, j != i} exp((d_ij - zeta_j)/tau)    stochastic phi_i (Eq. 12-13)
  u_i    <- (1-gamma) u_i + gamma phi_i                                  moving average, u_{t+1}
  model:  grad = (1/B) sum_i grad(phi_i) / (exp(-xi/tau) + u_i) * tau    Eq. 15, xi for the positive
  zeta:   g_j = 1 - M_j,  M_j = (n-1)/(B-1) sum_{i in B, i != j} p_ij + p_jj          (Eq. 14, see below)
          p_ij = exp((d_ij - zeta_j)/tau) / (exp(-zeta_i/tau) + u_i),  p_jj = exp(-zeta_j/tau) / (...)
          zeta_j <- zeta_j - lr * (g_j - mean_B g)  for j in the batch, once step >= freeze_zeta_steps
          (zeta_step="centred", the default; zeta_step="paper" steps by g_j itself, see below)
  xi     <- max(xi, max_j zeta_j)                                        Algorithm 1 line 7
M_j estimates the total softmax mass that candidate j receives from all n anchors (positive
term with the anchor's own zeta, as in Eq. 14), so the fixed point is Eq. 9: every candidate
gets mass 1. Eq. 14 itself reads G_j = 1/n - M_j / B. With B = n, g_j = n * G_j exactly. For
B < n, n * G_j = 1 - (n/B) M_j: applied only to the j in the batch (Algorithm 1 line 5) its
zero sits at M_j = B/n although the masses average 1, so every zeta drifts up by about
lr * (n/B - 1) per visit -- harmless to the loss (Theorem 2: zeta is defined up to a shift)
but unbounded, and it drags xi along. g_j = 1 - M_j has the same per-candidate ordering
without the drift, and its O(1) scale keeps zeta_lr independent of n (the authors' code also
rescales the zeta gradient by n).

Centred step (zeta_step="centred"): each step subtracts the batch mean of g over the B positions. Phi is
invariant to a common shift of zeta (Theorem 2), so its full gradient sums to zero: sum_j (1 - M_j) = 0
when u is exact (every row's masses sum to 1), and centring removes only what is common to the batch. That
common part is not zero in practice: u is a moving average that lags phi while the model learns (phi falls,
u stays above it), so every mass M_j is low by the same factor and every visited zeta is pushed down by
lr (1 - M) per visit. Where candidates are visited at unequal rates -- sentences: "No pneumothorax." is
drawn in every tenth pair, a rare finding's sentence once an epoch -- that drift sums to a function of the
visit count, not of popularity (measured on the CPU replication: Spearman -0.59 of zeta with the draw
probability, -0.002 with the true frequency; docs/RESULTS.md). The centred step keeps each candidate's
mass relative to the batch's, whose fixed point (all masses equal) is the paper's up to the shift.

Scale and value: the returned scalar's gradient is the Eq. 15 direction divided by tau, i.e.
the gradient of (1/B) sum_i log(exp(-xi/tau) + phi_i) with u in the denominator -- nats, the
same scale as InfoNCE (with gamma = 1, B = n, zeta = xi = 0 the gradient IS InfoNCE's).
Its value is mean_i softplus(log u_i + xi/tau) = the estimated -log p(positive) under the
NUCLR logits (s_ij - zeta_j)/tau, (s_ii - xi)/tau (grows like log n, not log B).

Tables (registered buffers, in state_dict): u (both directions) and the image zeta indexed by the dataset
index (``index``: the pair, whose sentence is redrawn at every visit like an augmentation, as SogCLR keys its
moving averages by sample); the text zeta and xi by ``text_index`` when the loss is built with ``num_texts``
(one entry per distinct sentence: a candidate's popularity is about what it says -- "No pneumothorax." is
popular wherever it is written -- not about the study that holds it), else by the dataset index too (one
text per sample, the papers' image-caption setting):
  u_img[i]   LOG of u for image i as an anchor (image->text); u_txt[j] likewise for texts.
             -inf = never visited: the first visit takes phi outright.
  zeta_txt[j] popularity of text j as a candidate of image anchors (same units as s);
  zeta_img[i] popularity of image i as a candidate of text anchors.
  xi_txt, xi_img  running max of zeta_txt / zeta_img, used for the positive term.
  step       forward calls in train() mode (zeta is frozen while step < freeze_zeta_steps).
Tables change only in train() mode; eval() uses the current batch's phi (as if gamma = 1).
Schedule (through the trainer hooks of ContrastiveLoss): configure() turns freeze_zeta_epochs into
freeze_zeta_steps with the run's steps per epoch; with zeta_lr_schedule="cosine", on_step() sets the
zeta step sizes for the step (cosine from zeta_lr to 0 between the freeze and the end of the run,
as the paper decays it). Both are functions of the step, the rest is in the checkpointed buffers,
so a resumed run continues exactly.
Duplicate indices in a (global) batch: their new u are averaged in linear space and their
zeta gradients averaged, and every position then reads the averaged u -- deterministic.
Distributed: phi of the local anchors is all-gathered and the candidate masses all-reduced,
so every rank applies the identical update to its copy of the tables.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from medclr.errors import MedclrError
from medclr.losses._logspace import dedup_mean, diag_and_negatives, ema_log
from medclr.losses.base import ContrastiveLoss, check_index
from medclr.losses.distributed import all_reduce_sum
from medclr.losses.functional import check_tau

# (anchor modality, candidate modality): image anchors score texts, text anchors score images.
_DIRECTIONS = (("img", "txt"), ("txt", "img"))
ZETA_LR_SCHEDULES = ("constant", "cosine")
ZETA_STEPS = ("centred", "paper")


def cosine_after_freeze(step: int, base: float, freeze: int, total: int) -> float:
    """The zeta step size at training step `step` (0-based): `base` before `freeze` (zeta is frozen
    then, so it is unused), then a cosine from `base` down to 0 at `total`."""
    if step < freeze:
        return base
    progress = min(1.0, (step - freeze) / max(1, total - freeze))
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))


class NUCLRLoss(ContrastiveLoss):
    def __init__(
        self,
        num_samples: int,
        tau: float = 0.01,
        gamma: float = 0.8,
        zeta_lr: float = 0.01,
        zeta_init: float = -0.05,
        freeze_zeta_steps: int | None = None,
        xi_init: float = 0.0,
        zeta_lr_img: float | None = None,
        normalize: bool = True,
        learn_zeta: bool = True,
        freeze_zeta_epochs: float | None = None,
        zeta_lr_schedule: str = "constant",
        num_texts: int | None = None,
        zeta_step: str = "centred",
    ):
        super().__init__(normalize)
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 2:
            raise MedclrError(f"num_samples: expected the dataset size (an int >= 2), got {num_samples!r}")
        if num_texts is not None and (isinstance(num_texts, bool) or not isinstance(num_texts, int) or num_texts < 1):
            raise MedclrError(f"num_texts: expected the number of distinct sentences (an int >= 1), got {num_texts!r}")
        if not 0.0 < gamma <= 1.0:
            raise MedclrError(f"gamma: expected the moving-average weight on the new estimate in (0, 1], got {gamma!r}")
        self._check_schedule(freeze_zeta_steps, freeze_zeta_epochs, zeta_lr_schedule)
        if zeta_step not in ZETA_STEPS:
            raise MedclrError(f"zeta_step {zeta_step!r}: expected one of {', '.join(ZETA_STEPS)}")
        self.zeta_step = zeta_step
        self.num_samples, self.tau, self.gamma = num_samples, check_tau(tau), float(gamma)
        self.num_texts = num_texts
        zeta_sizes = {"img": num_samples, "txt": num_samples if num_texts is None else num_texts}
        self.learn_zeta = bool(learn_zeta)
        # The step sizes of this step: on_step rewrites them under the cosine schedule.
        self.zeta_lr = float(zeta_lr)
        self.zeta_lr_img = float(zeta_lr if zeta_lr_img is None else zeta_lr_img)
        self.zeta_lr_base = (self.zeta_lr, self.zeta_lr_img)
        self.zeta_lr_schedule = zeta_lr_schedule
        self.freeze_zeta_epochs = freeze_zeta_epochs
        # None until configure() converts freeze_zeta_epochs with the run's steps per epoch.
        self.freeze_zeta_steps = None if freeze_zeta_epochs is not None else int(freeze_zeta_steps or 0)
        for m in ("img", "txt"):
            self.register_buffer(f"u_{m}", torch.full((num_samples,), float("-inf")))
        if self.learn_zeta:
            # xi_0 = max(xi_init, zeta_0) >= every zeta, as Algorithm 1 line 1 requires.
            for m in ("img", "txt"):
                self.register_buffer(f"zeta_{m}", torch.full((zeta_sizes[m],), float(zeta_init)))
                self.register_buffer(f"xi_{m}", torch.tensor(max(float(xi_init), float(zeta_init))))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    @staticmethod
    def _check_schedule(freeze_steps, freeze_epochs, schedule) -> None:
        if freeze_steps is not None and freeze_epochs is not None:
            raise MedclrError("set freeze_zeta_epochs or freeze_zeta_steps, not both")
        if freeze_steps is not None and freeze_steps < 0:
            raise MedclrError(f"freeze_zeta_steps: expected >= 0, got {freeze_steps!r}")
        if freeze_epochs is not None and (isinstance(freeze_epochs, bool) or not isinstance(freeze_epochs, (int, float))
                                          or not freeze_epochs >= 0):
            raise MedclrError(f"freeze_zeta_epochs: expected a number of epochs >= 0, got {freeze_epochs!r}")
        if schedule not in ZETA_LR_SCHEDULES:
            raise MedclrError(f"zeta_lr_schedule {schedule!r}: expected one of {', '.join(ZETA_LR_SCHEDULES)}")

    def configure(self, num_samples: int, steps_per_epoch: int, total_steps: int) -> list[str]:
        """freeze_zeta_epochs -> freeze_zeta_steps with this run's steps per epoch."""
        if self.freeze_zeta_epochs is None:
            return []
        self.freeze_zeta_steps = int(round(float(self.freeze_zeta_epochs) * steps_per_epoch))
        if self.freeze_zeta_steps >= total_steps:
            return [f"loss.freeze_zeta_epochs={self.freeze_zeta_epochs} covers the whole run ({total_steps} steps): zeta is "
                    "never updated (short runs: loss.freeze_zeta_epochs=1 or 0 on the command line)"]
        return []

    def on_step(self, step: int, total_steps: int) -> None:
        """The cosine zeta step size of this step (zeta_lr_schedule="cosine"); constant: nothing to do."""
        if self.zeta_lr_schedule == "cosine":
            freeze = self._freeze_steps()
            self.zeta_lr, self.zeta_lr_img = (cosine_after_freeze(step, base, freeze, total_steps)
                                              for base in self.zeta_lr_base)

    def _freeze_steps(self) -> int:
        if self.freeze_zeta_steps is None:
            raise MedclrError(f"freeze_zeta_epochs={self.freeze_zeta_epochs} needs the run's steps per epoch: call "
                              "configure(num_samples, steps_per_epoch, total_steps) first (a trainer does), or pass "
                              "freeze_zeta_steps")
        return self.freeze_zeta_steps

    def _zeta(self, cand: str, idx_all: torch.Tensor, like: torch.Tensor):
        if not self.learn_zeta:
            return torch.zeros(idx_all.shape, dtype=like.dtype, device=like.device), 0.0
        return getattr(self, f"zeta_{cand}")[idx_all].to(like.dtype), float(getattr(self, f"xi_{cand}"))

    def compute(self, batch, index=None, eta=None, text_index=None):
        # Collectives run on the embeddings' device (NCCL needs CUDA tensors); tables may live elsewhere.
        idx = check_index(index, batch.b, self.num_samples, batch.device)
        idx_of = {"img": batch.gather(idx).to(self.u_img.device)}
        if self.num_texts is None:
            idx_of["txt"] = idx_of["img"]
        else:
            if text_index is None:
                raise MedclrError("text_index: this NUCLR keys its text tables by sentence (num_texts) and needs the "
                                  "sentence index of each pair")
            tidx = check_index(text_index, batch.b, self.num_texts, batch.device)
            idx_of["txt"] = batch.gather(tidx).to(self.u_img.device)
        pos_t = batch.pos.to(self.u_img.device)
        tau, n, B = self.tau, self.num_samples, batch.B
        log_scale = math.log((n - 1) / (B - 1))  # phi over B-1 negatives estimates the n-1 sum
        train = self.training
        update_zeta = train and self.learn_zeta and int(self.step) >= self._freeze_steps()

        # Pass 1: d with its graph, detached NUCLR logits and the stochastic phi of the local anchors.
        dirs = []
        for (anc, cand), s in zip(_DIRECTIONS, batch.sims()):
            diag, _ = diag_and_negatives(s, batch.pos)  # s and diag carry the graph
            zeta_c, xi = self._zeta(cand, idx_of[cand], s)
            zeta_c = zeta_c.to(s.device)
            d = s.detach() - diag.detach()[:, None]  # d_ij = s_ij - s_ii
            _, logits_neg = diag_and_negatives((d - zeta_c[None, :]) / tau, batch.pos)
            dirs.append((anc, cand, s, diag, zeta_c, xi, logits_neg))
        log_phi = torch.stack([log_scale + torch.logsumexp(x[-1], dim=1) for x in dirs], dim=1)
        log_phi_all = batch.gather(log_phi).to(self.u_img.device)  # (B, 2): same on every rank

        rows, masses = 0.0, []
        for k, (anc, _cand, s, diag, zeta_c, xi, logits_neg) in enumerate(dirs):
            table = getattr(self, f"u_{anc}")
            with torch.no_grad():
                new = log_phi_all[:, k]
                if train:
                    new = ema_log(table[idx_of["img"]].to(new.dtype), new, self.gamma)
                uniq, reduced, per_pos = dedup_mean(idx_of["img"], new, log_space=True)
                if train:
                    table[uniq] = reduced.to(table.dtype)
                log_u = per_pos[pos_t].to(s.device, s.dtype)  # u_{t+1} of the local anchors
            # Model step (Eq. 15 / tau): detached weights times the differentiable d_ij / tau,
            # sum_j w_ij d_ij = sum_j w_ij s_ij - (sum_j w_ij) s_ii (no B x B d with a graph).
            log_den = torch.logaddexp(torch.full_like(log_u, -xi / tau), log_u)
            w = torch.exp(logits_neg + (log_scale - log_den)[:, None])  # 0 on the positive column
            surrogate = ((w * s).sum(dim=1) - w.sum(dim=1) * diag) / tau
            value = F.softplus(log_u + xi / tau)
            rows = rows + value + (surrogate - surrogate.detach())
            if update_zeta:
                with torch.no_grad():
                    zeta_own = zeta_c[batch.pos]
                    log_den_own = torch.logaddexp(-zeta_own / tau, log_u)  # Eq. 14: the anchor's own zeta
                    # p_ij = w_ij * den_i / den_own_i: reuses w (no second B x B exp); the
                    # factor is <= 1 because xi >= zeta_i.
                    mass = torch.exp(log_den - log_den_own) @ w.detach()
                    masses.append(mass.index_add(0, batch.pos, torch.exp(-zeta_own / tau - log_den_own)))

        if update_zeta:
            with torch.no_grad():
                mass_all = all_reduce_sum(torch.stack(masses)).to(self.u_img.device)  # (2, B)
                for k, (_anc, cand) in enumerate(_DIRECTIONS):
                    zeta, xi = getattr(self, f"zeta_{cand}"), getattr(self, f"xi_{cand}")
                    g_pos = 1.0 - mass_all[k]
                    if self.zeta_step == "centred":
                        g_pos = g_pos - g_pos.mean()
                    uniq, g, _ = dedup_mean(idx_of[cand], g_pos)
                    lr = self.zeta_lr if cand == "txt" else self.zeta_lr_img
                    zeta[uniq] = zeta[uniq] - (lr * g).to(zeta.dtype)
                    xi.copy_(torch.maximum(xi, zeta[uniq].max()))
        if train:
            self.step += 1
        return batch.reduce_rows(0.5 * rows)


class SogCLRLoss(NUCLRLoss):
    """SogCLR (Yuan et al. 2022) as NUCLR with zeta = 0 and xi = 0 (no zeta tables at all).

    u_i tracks (n-1)/(B-1) sum_{j != i} exp(d_ij/tau), and the loss estimates
    mean_i log(1 + u_i): the global contrastive loss over the whole dataset.
    """

    def __init__(self, num_samples: int, tau: float = 0.01, gamma: float = 0.8, normalize: bool = True):
        super().__init__(num_samples, tau=tau, gamma=gamma, zeta_lr=0.0, zeta_init=0.0,
                         freeze_zeta_steps=0, xi_init=0.0, normalize=normalize, learn_zeta=False)
