"""Log-space numerics shared by every loss in this package.

Why log space: at tau = 0.01 a cosine of 1 gives e^{100}, beyond float32 (max ~e^{88.7}).
Every quantity that is a sum of exponentials is therefore carried as its logarithm and
combined with logsumexp / logaddexp / log1p; nothing is exponentiated unless its log is
known to be bounded (the weights below are all <= 1/gamma).
"""

from __future__ import annotations

import math

import torch

NEG_INF = float("-inf")


def upcast(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> float32; float32/float64 untouched (float64 keeps gradcheck exact)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def diag_and_negatives(logits: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split anchor rows into the positive logit (b,) and a copy with the positive masked to -inf.

    `pos[i]` is the column of anchor i's positive in the global candidate set (rank offset
    included), so the same code serves one process and local-anchors x global-candidates.
    """
    col = pos[:, None]
    return logits.gather(1, col).squeeze(1), logits.scatter(1, col, NEG_INF)


def log_sub_exp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(e^a - e^b) where a > b, -inf where a <= b; value and gradient finite everywhere.

    The a <= b branch is fed a dummy argument before log/expm1 so that torch.where never
    multiplies a zero upstream gradient by an infinite local derivative (0 * inf = NaN).
    The threshold `tiny` keeps 1/(1 - e^{b-a}) below the dtype's max.
    """
    d = b - a
    ok = d < -torch.finfo(d.dtype).tiny
    d_safe = torch.where(ok, d, torch.full_like(d, -1.0))
    out = a + torch.log(-torch.expm1(d_safe))
    return torch.where(ok, out, torch.full_like(out, NEG_INF))


def ema_log(log_old: torch.Tensor, log_new: torch.Tensor, gamma: float) -> torch.Tensor:
    """Moving average u <- (1-gamma) u + gamma v carried on logs; gamma = weight on the NEW value.

    log_old = -inf marks a never-visited entry: it takes the new value outright, so the
    estimate is not biased towards 0 by a zero initialisation (per-sample first visit).
    """
    if gamma >= 1.0:
        return log_new
    mixed = torch.logaddexp(log_old + math.log1p(-gamma), log_new + math.log(gamma))
    return torch.where(torch.isneginf(log_old), log_new, mixed)


def dedup_mean(idx: torch.Tensor, values: torch.Tensor, log_space: bool = False):
    """Reduce values that share a dataset index, deterministically.

    Returns (unique_idx, reduced, per_position): `reduced` is the mean over the positions
    holding each unique index (for log_space=True the mean is taken of e^value, i.e. the
    linear-space average of the estimates, returned as a log), `per_position[k]` is the
    reduced value of position k's index. Scatter/index_put with duplicate indices is
    undefined on CUDA (any write may win); a one-hot matmul / masked logsumexp is
    deterministic and cheap at batch sizes (U x B). The no-duplicate case costs one
    torch.unique (a host sync) and nothing else.
    """
    uniq, inv, counts = torch.unique(idx, return_inverse=True, return_counts=True)
    if uniq.numel() == idx.numel():
        return idx, values, values
    onehot = inv[None, :] == torch.arange(uniq.numel(), device=idx.device)[:, None]
    cnt = counts.to(values.dtype)
    if log_space:
        masked = torch.where(onehot, values[None, :], torch.full_like(values, NEG_INF)[None, :])
        reduced = torch.logsumexp(masked, dim=1) - cnt.log()
    else:
        reduced = (onehot.to(values.dtype) @ values) / cnt
    return uniq, reduced, reduced[inv]
