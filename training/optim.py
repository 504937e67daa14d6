"""Optimizer parameter groups and the warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


class WarmupCosine:
    """lr factor at step s (0-based): linear warm-up to 1, then cosine down to `min_ratio` at `total`.

    The warm-up is min(`warmup`, total // 5) steps: a time-budgeted run whose step count turns out
    small must not spend all of it warming up. A class (not a lambda) so LambdaLR saves and restores
    its fields: `total` may be fixed at run time from a time budget and must survive a resume."""

    def __init__(self, warmup: int, total: int, min_ratio: float = 0.0) -> None:
        self.warmup, self.total, self.min_ratio = int(warmup), int(total), float(min_ratio)

    @property
    def warmup_steps(self) -> int:
        return min(self.warmup, max(1, self.total // 5)) if self.warmup > 0 else 0

    def __call__(self, step: int) -> float:
        w = self.warmup_steps
        if step < w:
            return (step + 1) / w  # +1: the first step already moves
        span = max(1, self.total - w)
        progress = min(1.0, (step - w) / span)
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(model: nn.Module, loss: nn.Module, trainable: list[nn.Module], lr: float,
                 lr_text: float | None, weight_decay: float) -> list[dict]:
    """AdamW groups: {text backbone, rest} x {decay, no decay}; biases, norms and the loss's scalars
    are not decayed (decaying a LayerNorm gain or a temperature towards 0 is not regularisation)."""
    text_backbone = {id(p) for p in model.text_encoder.backbone.parameters()}
    groups: dict[tuple[bool, bool], list] = {}
    seen = set()
    for module in trainable:
        for p in module.parameters():
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            groups.setdefault((id(p) in text_backbone, p.ndim > 1), []).append(p)
    out = []
    for (is_text, decay), params in sorted(groups.items()):
        out.append({"params": params, "lr": lr_text if (is_text and lr_text is not None) else lr,
                    "weight_decay": weight_decay if decay else 0.0,
                    "name": f"{'text_backbone' if is_text else 'rest'}{'' if decay else '_no_decay'}"})
    loss_params = [p for p in loss.parameters() if p.requires_grad]
    if loss_params:
        out.append({"params": loss_params, "lr": lr, "weight_decay": 0.0, "name": "loss"})
    return out


def build_optimizer(groups: list[dict], cfg: dict, device: torch.device) -> torch.optim.Optimizer:
    o = cfg["optim"]
    kwargs = {}
    if device.type == "cuda":
        kwargs["fused"] = True  # one kernel for all parameters
    return torch.optim.AdamW(groups, lr=float(o["lr"]), betas=tuple(float(b) for b in o["betas"]),
                             eps=float(o["eps"]), **kwargs)

