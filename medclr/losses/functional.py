"""Functional InfoNCE and debiased contrastive loss on a similarity matrix.

Contract (docs/ARCHITECTURE.md section 4): `sim` is B x B, row = anchor, diagonal = its positive, values in
[-1, 1]; both functions return the mean over rows as a float32 (float64 for float64 input)
scalar, whatever the input dtype, and never overflow: everything is computed as logs.

The *_rows variants are the building blocks the loss modules use: rows are anchors, columns
are candidates, `pos[i]` is the column of row i's positive (so a rank holding rows
offset..offset+b-1 of a global batch passes pos = offset + arange(b)).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from medclr.errors import MedclrError
from medclr.losses._logspace import diag_and_negatives, log_sub_exp, upcast


def check_tau(tau, name: str = "tau") -> float:
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not math.isfinite(tau) or tau <= 0:
        raise MedclrError(f"{name}: expected a positive finite number, got {tau!r}")
    return float(tau)


ANCHORS = ("text", "symmetric")


def check_anchor(anchor) -> str:
    """Which rows a pairwise loss averages: "text" (text-anchored only) or "symmetric" (both directions)."""
    if anchor not in ANCHORS:
        raise MedclrError(f"anchor: expected one of {', '.join(repr(a) for a in ANCHORS)}, got {anchor!r}")
    return anchor


def _check_sim(sim) -> torch.Tensor:
    if not isinstance(sim, torch.Tensor) or sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
        shape = tuple(sim.shape) if isinstance(sim, torch.Tensor) else type(sim).__name__
        raise MedclrError(f"sim: expected a square B x B similarity matrix, got {shape}")
    if sim.shape[0] < 2:
        raise MedclrError("sim: a contrastive loss needs B >= 2 (at least one negative)")
    if not sim.is_floating_point():
        raise MedclrError(f"sim: expected a floating-point tensor, got {sim.dtype}")
    return upcast(sim)


def as_eta(eta, rows: int, like: torch.Tensor, name: str = "eta") -> torch.Tensor:
    """Validate eta (a float or a length-`rows` tensor, each value in [0, 1)) -> tensor (rows,).

    The range check on a tensor costs one host sync; a silently clamped eta >= 1 would flip
    the sign of the debiased estimator, which is worse.
    """
    if isinstance(eta, torch.Tensor):
        if eta.ndim != 1 or eta.shape[0] != rows:
            raise MedclrError(f"{name}: expected a float or a tensor of shape ({rows},), got {tuple(eta.shape)}")
        eta = eta.detach().to(device=like.device, dtype=like.dtype)
        if bool(((eta < 0) | (eta >= 1) | torch.isnan(eta)).any()):
            raise MedclrError(f"{name}: every value must lie in [0, 1) (a class probability)")
        return eta
    if isinstance(eta, bool) or not isinstance(eta, numbers.Real) or not (0.0 <= eta < 1.0):
        raise MedclrError(f"{name}: expected a float in [0, 1) or a tensor, got {eta!r}")
    return torch.full((rows,), float(eta), device=like.device, dtype=like.dtype)


def info_nce_rows(sim: torch.Tensor, pos: torch.Tensor, tau: float) -> torch.Tensor:
    """Per-anchor -log(e^{s_ii/tau} / sum_j e^{s_ij/tau}) over all columns (positive included)."""
    logits = upcast(sim) / tau
    return torch.logsumexp(logits, dim=1) - logits.gather(1, pos[:, None]).squeeze(1)


def dcl_rows(sim: torch.Tensor, pos: torch.Tensor, tau: float, eta: torch.Tensor) -> torch.Tensor:
    """Per-anchor debiased loss (Eq. 6-8 of the sample-specific debiasing paper, M = 1).

    With N = (#columns - 1) negatives, p = s_ii/tau and A = log sum_{j != i} e^{s_ij/tau}:
        Ng   = max((e^A - N eta_i e^p) / (1 - eta_i), N e^{-1/tau})
        loss = -log(e^p / (e^p + Ng)) = softplus(log(Ng / e^p))
    Everything is taken relative to the positive: with r = A - p,
        log(Ng/e^p) = max(log(e^r - N eta) - log1p(-eta), log N - 1/tau - p),
    so no term is ever exponentiated at its raw size and d loss / d r stays bounded even
    where the debiased difference nearly cancels (softplus' * (log-difference)' is computed
    from finite factors; see log_sub_exp).
    """
    logits = upcast(sim) / tau
    n_neg = logits.shape[1] - 1
    p, neg = diag_and_negatives(logits, pos)
    r = torch.logsumexp(neg, dim=1) - p
    log_n = math.log(n_neg)
    log_debiased = log_sub_exp(r, log_n + torch.log(eta)) - torch.log1p(-eta)
    log_floor = log_n - 1.0 / tau - p
    return F.softplus(torch.maximum(log_debiased, log_floor))


def info_nce(sim: torch.Tensor, tau: float) -> torch.Tensor:
    """Mean over rows of the InfoNCE loss of a B x B similarity matrix (diagonal = positives)."""
    sim = _check_sim(sim)
    tau = check_tau(tau)
    pos = torch.arange(sim.shape[0], device=sim.device)
    return info_nce_rows(sim, pos, tau).mean()


def dcl(sim: torch.Tensor, tau: float, eta) -> torch.Tensor:
    """Mean over rows of the debiased contrastive loss; eta is a float or a length-B tensor.

    eta = 0 gives info_nce (the floor N e^{-1/tau} is the smallest value the negative sum can
    take for similarities >= -1, so it never binds then).
    """
    sim = _check_sim(sim)
    tau = check_tau(tau)
    eta = as_eta(eta, sim.shape[0], sim)
    pos = torch.arange(sim.shape[0], device=sim.device)
    return dcl_rows(sim, pos, tau, eta).mean()
