"""Common front end of every image-text loss module.

Calling convention: loss(image_emb, text_emb, index=None, eta=None) -> scalar tensor, or
loss(sims=(s_i2t, s_t2i), index=None, eta=None) with a similarity head's blocks (local images x all
sentences, local sentences x all images, from medclr.losses.distributed.score_blocks), so every
loss trains the LSE+NL head as it trains the cosine one.
- image_emb, text_emb: this rank's b x d embeddings of b image-report pairs (row k of each
  is a positive pair). Any float dtype; the loss works in float32 (float64 stays float64)
  with autocast disabled, because an fp16 matmul quantises cosines to ~5e-4, i.e. ~0.05 nat
  at tau = 0.01, before any exp is taken.
- Embeddings are L2-normalised inside the loss by default (normalize=True). Renormalising
  an already unit vector is a no-op for the value, and the gradient that reaches the encoder
  is unchanged (the tangent projection is idempotent), so callers may normalise or not.
  t_infonce accepts normalize=False for the Euclidean variant of the SNE paper.
- index: dataset indices (int, shape (b,)) for losses with per-sample tables; text_index: the
  index of each pair's sentence for losses whose text tables are keyed by sentence (NUCLR with
  num_texts); eta: per-pair class probabilities for dcl_lm. Arguments a loss does not use are ignored, so a
  training loop may pass both to every loss.
- Every loss is symmetric (image->text and text->image rows averaged; SigLIP and the globally
  normalised t_infonce score each pair once, which is already symmetric), except where
  anchor="text": dcl and dcl_lm by default (the DCL-eta_LM paper anchors on the report), infonce
  on request (its default stays CLIP's symmetric form).
- Under torch.distributed: local anchors x gathered global candidates; see distributed.py.

Trainer hooks: a loss with a schedule keeps it itself, so a trainer needs no change for it. A
trainer calls ``configure(num_samples, steps_per_epoch, total_steps)`` once before the first step
(it may validate the run and turn epoch-based options into steps; it returns warnings to log) and
``on_step(step, total_steps)`` before every training step's forward. Both do nothing by default.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F

from medclr.errors import MedclrError
from medclr.losses._logspace import upcast
from medclr.losses.distributed import GlobalBatch


@functools.cache
def _takes_text_index(cls: type) -> bool:
    """Whether a loss class's ``compute`` takes ``text_index`` (read once per class, not per step)."""
    return "text_index" in inspect.signature(cls.compute).parameters


class ContrastiveLoss(nn.Module):
    """Base class: validates inputs, upcasts, normalises, gathers, then calls `compute`."""

    def __init__(self, normalize: bool = True):
        super().__init__()
        self.normalize = bool(normalize)

    def extra_repr(self) -> str:
        keys = [k for k in ("tau", "eta", "gamma", "num_samples", "t_df", "normalization", "anchor") if hasattr(self, k)]
        return ", ".join(f"{k}={getattr(self, k)}" for k in keys)

    def _prepare(self, x: torch.Tensor) -> torch.Tensor:
        x = upcast(x)
        return F.normalize(x, dim=-1) if self.normalize else x

    def forward(self, image_emb: torch.Tensor | None = None, text_emb: torch.Tensor | None = None, index=None,
                eta=None, *, sims: tuple[torch.Tensor, torch.Tensor] | None = None, text_index=None, **extra):
        if text_index is not None and _takes_text_index(type(self)):
            extra["text_index"] = text_index  # sentence-keyed tables (NUCLR); every other loss ignores it
        if sims is not None:
            return self._forward_sims(sims, image_emb, text_emb, index=index, eta=eta, **extra)
        for name, x in (("image_emb", image_emb), ("text_emb", text_emb)):
            if not isinstance(x, torch.Tensor) or x.ndim != 2 or not x.is_floating_point():
                got = (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__
                raise MedclrError(f"{name}: expected a floating-point b x d tensor, got {got}")
        if image_emb.shape != text_emb.shape:
            raise MedclrError(
                f"image_emb {tuple(image_emb.shape)} and text_emb {tuple(text_emb.shape)}: "
                "expected the same b x d shape (row k of each is a positive pair)"
            )
        with torch.autocast(device_type=image_emb.device.type, enabled=False):
            batch = GlobalBatch(self._prepare(image_emb), self._prepare(text_emb))
            if batch.B < 2:
                raise MedclrError("batch: a contrastive loss needs at least 2 pairs in the (global) batch")
            return self.compute(batch, index=index, eta=eta, **extra)

    def _forward_sims(self, sims, image_emb, text_emb, index=None, eta=None, **extra):
        """A head's similarity blocks (``medclr.losses.distributed.score_blocks``) instead of embeddings."""
        if image_emb is not None or text_emb is not None:
            raise MedclrError("pass either image_emb and text_emb, or sims=(image-anchored, text-anchored), not both")
        ok = isinstance(sims, (tuple, list)) and len(sims) == 2 and all(
            isinstance(s, torch.Tensor) and s.ndim == 2 and s.is_floating_point() for s in sims)
        if not ok or sims[0].shape != sims[1].shape:
            raise MedclrError("sims: expected two floating-point b x B blocks of the same shape (local images x all "
                              "sentences, local sentences x all images)")
        with torch.autocast(device_type=sims[0].device.type, enabled=False):
            batch = GlobalBatch(None, None, blocks=(upcast(sims[0]), upcast(sims[1])))
            if batch.B != sims[0].shape[1]:
                raise MedclrError(f"sims: {sims[0].shape[1]} columns, but the global batch holds {batch.B} pairs")
            if batch.B < 2:
                raise MedclrError("batch: a contrastive loss needs at least 2 pairs in the (global) batch")
            return self.compute(batch, index=index, eta=eta, **extra)

    def compute(self, batch: GlobalBatch, index=None, eta=None) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def configure(self, num_samples: int, steps_per_epoch: int, total_steps: int) -> list[str]:
        """Fit the loss to the run, once before its first step (and again when it resumes): the
        training set's size, the steps of one epoch and of the whole run. Returns warnings, one
        line each, for the trainer to log."""
        return []

    def on_step(self, step: int, total_steps: int) -> None:
        """Before the forward of training step ``step`` (0-based) of ``total_steps`` (a time budget
        may still change it). What this sets must be a function of these two numbers or live in a
        buffer, so that a resumed run continues exactly."""


def check_index(index, b: int, num_samples: int, device: torch.device) -> torch.Tensor:
    """Dataset indices for per-sample tables: int tensor (b,) with values in [0, num_samples)."""
    if index is None:
        raise MedclrError("index: this loss keeps per-sample tables and needs the dataset index of each pair")
    if not isinstance(index, torch.Tensor):
        index = torch.as_tensor(index)
    if index.ndim != 1 or index.shape[0] != b or index.is_floating_point() or index.dtype == torch.bool:
        raise MedclrError(f"index: expected an integer tensor of shape ({b},), got {tuple(index.shape)} {index.dtype}")
    index = index.to(device=device, dtype=torch.long)
    lo, hi = int(index.min()), int(index.max())  # one host sync; an out-of-range write is silent on CUDA
    if lo < 0 or hi >= num_samples:
        raise MedclrError(f"index: values must lie in [0, {num_samples}) (num_samples), got [{lo}, {hi}]")
    return index
