"""Image-sentence similarity heads: global cosine, and LSE+NL (regions -> non-local -> LSE pooling).

Both heads take the image encoder's :class:`ImageFeatures` and the text encoder's L2-normalised
sentence embeddings (B_txt x D) and return a B_img x B_txt matrix ``sim[i, t]``; row = image, column =
sentence, so with paired batches the diagonal holds the positives, as the losses expect. Both values
lie in [-1, 1] (see each head). ``region_scores`` gives the B_img x B_txt x h x w region-sentence
cosine maps that grounding heatmaps show.

For training, a head splits in two: ``image_side(features)`` is everything that depends on one image
alone (the unit global embedding; the NL-contextualised unit region cells), and ``score(image_side,
text_emb)`` pairs it with sentences. ``forward = score(image_side(.), .)``. Under torch.distributed
the image sides are what gets all-gathered (``medclr.losses.distributed.score_blocks``), so the
loss sees local images x all sentences and local sentences x all images, and the head is trained.

LSE+NL follows the similarity used in the sample-specific debiasing paper (Wang et al., MLHC 2023,
§3.2 "We use LSE+NL (Wang et al., 2023) as the similarity function s", i.e. Wang, Wells, Berkowitz,
Horng, Golland, *Using Multiple Instance Learning to Build Multimodal Representations*, IPMI 2023):
region-sentence cosines aggregated by log-sum-exp pooling after a non-local block over the regions.
The exact LSE form is the normalised one of Pinheiro & Collobert (CVPR 2015),

    s(x, y) = (1/gamma) * log( (1/N) * sum_r exp(gamma * cos(f_r, g_y)) ),

which tends to max_r as gamma -> inf and to mean_r as gamma -> 0; it is recalled from those papers,
not copied from either (neither text is in the project). The non-local block is the embedded-Gaussian
block of Wang, Girshick, Gupta & He (CVPR 2018) with its output projection zero-initialised so the head
starts as plain LSE pooling. The paper's other "gamma" (the hypersphere radius, initialised to sqrt(14)
and learned) is the loss temperature, tau = 1/gamma^2, and belongs to the loss, not to this head.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from medclr.errors import MedclrError
from medclr.models.image import ImageFeatures


def _up(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> float32 (scores are exp'ed later; docs/ARCHITECTURE.md, conventions); float32/float64 unchanged."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _cell_vectors(regions: torch.Tensor) -> torch.Tensor:
    """B x D x h x w -> B x (h*w) x D, L2-normalised per cell."""
    b, d = regions.shape[:2]
    return nn.functional.normalize(_up(regions).reshape(b, d, -1).transpose(1, 2), dim=-1)


def _cell_text_cosines(regions: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
    """B_img x B_txt x (h*w) cosines between every region cell and every sentence."""
    cells = _cell_vectors(regions)
    text = nn.functional.normalize(_up(text_emb), dim=-1).to(cells.dtype)
    return torch.einsum("bnd,td->btn", cells, text)


def lse_pool(scores: torch.Tensor, gamma: float | torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Normalised log-sum-exp pooling: (1/gamma) * log(mean(exp(gamma * scores))) over ``dim``.

    Bounded by [mean, max] of the pooled scores (Jensen below, max above), so cosines stay in
    [-1, 1]. Evaluated in float32 (float64 stays float64) as m + log1p(mean(expm1(gamma * (s - m)))) / gamma with m = max:
    the shift by the max avoids overflow for large gamma, and expm1/log1p keep full precision for
    small gamma, where log(mean(exp(.))) would be log(1 + tiny) and lose the signal to rounding.
    """
    scores = _up(scores)
    gamma = torch.as_tensor(gamma, dtype=scores.dtype, device=scores.device)
    m = scores.amax(dim=dim, keepdim=True).detach()  # a constant shift: the value does not depend on it
    pooled = torch.log1p(torch.expm1(gamma * (scores - m)).mean(dim=dim)) / gamma
    return pooled + m.squeeze(dim)


class CosineHead(nn.Module):
    """sim[i, t] = <global_emb_i, text_emb_t>: cosine of unit vectors, in [-1, 1]."""

    kind = "cosine"

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def image_side(self, image: ImageFeatures) -> torch.Tensor:
        """B x D unit global embeddings."""
        return nn.functional.normalize(_up(image.global_emb), dim=-1)

    def score(self, image_side: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """``image_side`` as :meth:`image_side` makes it (unit rows): not normalised again, so the
        blocks are bit-identical to the losses' own product of normalised embeddings."""
        return image_side @ nn.functional.normalize(_up(text_emb), dim=-1).to(image_side.dtype).T

    def score_pairs(self, image_side: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """Row-wise scores s(image_i, text_i): the diagonal of :meth:`score`, B values."""
        return (image_side * nn.functional.normalize(_up(text_emb), dim=-1).to(image_side.dtype)).sum(-1)

    def forward(self, image: ImageFeatures, text_emb: torch.Tensor) -> torch.Tensor:
        return self.score(self.image_side(image), text_emb)

    def region_scores(self, image: ImageFeatures, text_emb: torch.Tensor) -> torch.Tensor:
        """B_img x B_txt x h x w per-cell cosines (BioViL's heatmap before smoothing)."""
        h, w = image.grid
        s = _cell_text_cosines(image.regions, text_emb)
        return s.reshape(s.shape[0], s.shape[1], h, w)

    def to_config(self) -> dict[str, Any]:
        return {"type": self.kind, "dim": self.dim}


class NonLocalBlock(nn.Module):
    """Embedded-Gaussian non-local block over the h*w regions (self-attention with a residual).

    z = x + W_z * softmax(theta(x) phi(x)^T / sqrt(k)) g(x), with theta, phi, g linear maps to
    k = dim // 2 channels (the NL paper's bottleneck). The 1/sqrt(k) scale (not in the NL paper) keeps
    the softmax from saturating at init. W_z starts at zero so the block is the identity at init.
    """

    def __init__(self, dim: int, inner_dim: int | None = None) -> None:
        super().__init__()
        k = inner_dim or max(1, dim // 2)
        self.inner_dim = k
        self.theta = nn.Linear(dim, k, bias=False)
        self.phi = nn.Linear(dim, k, bias=False)
        self.g = nn.Linear(dim, k, bias=False)
        self.out = nn.Linear(k, dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, regions: torch.Tensor) -> torch.Tensor:
        b, d, h, w = regions.shape
        x = regions.reshape(b, d, h * w).transpose(1, 2)  # B x N x D
        # SDPA: the same maths as softmax(QK^T/sqrt(k))V, fused where the backend allows; as one head
        # (B x 1 x N x k), the 4-D layout every backend and the ONNX exporter take (3-D fails to export).
        q, k, v = (proj(x)[:, None] for proj in (self.theta, self.phi, self.g))
        y = nn.functional.scaled_dot_product_attention(q, k, v)[:, 0]
        z = x + self.out(y)
        return z.transpose(1, 2).reshape(b, d, h, w)


class LSENLHead(nn.Module):
    """LSE+NL: non-local block over regions, region-sentence cosines, LSE pooling over regions.

    sim[i, t] = lse_pool_r(cos(NL(regions_i)_r, text_t); gamma) lies in [mean_r, max_r] of the
    region cosines, hence in [-1, 1].

    Args:
        dim: joint dim D of the regions.
        gamma: LSE sharpness (inverse temperature of the pooling); large -> max, small -> mean.
            Default 5 (our choice: between the two limits for cosines in [-1, 1]).
        learn_gamma: learn log(gamma) with the encoders.
        non_local: False gives plain LSE pooling (ablation).
        inner_dim: NL bottleneck (default D // 2).
        trained: whether a loss has scored pairs with this head (saved in config.json).
    """

    kind = "lse_nl"

    def __init__(
        self,
        dim: int,
        gamma: float = 5.0,
        learn_gamma: bool = False,
        non_local: bool = True,
        inner_dim: int | None = None,
        trained: bool = False,
    ) -> None:
        super().__init__()
        # set by the training loop when the loss scores pairs with this head; a checkpoint whose
        # head was never trained (saved beside a loss on global embeddings) must not be served with it
        self.trained = bool(trained)
        if gamma <= 0:
            raise MedclrError(f"LSE gamma {gamma}: expected > 0")
        self.dim, self.learn_gamma = int(dim), bool(learn_gamma)
        log_gamma = torch.tensor(math.log(gamma), dtype=torch.float32)
        # log-parametrised so a learned gamma stays positive
        if learn_gamma:
            self.log_gamma = nn.Parameter(log_gamma)
        else:
            self.register_buffer("log_gamma", log_gamma)
        self.nl = NonLocalBlock(dim, inner_dim) if non_local else None

    @property
    def gamma(self) -> torch.Tensor:
        return self.log_gamma.exp()

    def contextualize(self, regions: torch.Tensor) -> torch.Tensor:
        """Regions after the non-local block (identity when non_local=False)."""
        return regions if self.nl is None else self.nl(regions)

    def region_scores(self, image: ImageFeatures, text_emb: torch.Tensor) -> torch.Tensor:
        """B_img x B_txt x h x w cosines between NL-contextualised regions and sentences; these are
        the scores LSE pools, so they are the grounding heatmap of this head."""
        h, w = image.grid
        s = _cell_text_cosines(self.contextualize(image.regions), text_emb)
        return s.reshape(s.shape[0], s.shape[1], h, w)

    def image_side(self, image: ImageFeatures) -> torch.Tensor:
        """B x (h*w) x D unit cells after the non-local block."""
        return _cell_vectors(self.contextualize(image.regions))

    def score(self, image_side: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """LSE over the cells of each image of its cell-sentence cosines: B_img x B_txt."""
        text = nn.functional.normalize(_up(text_emb), dim=-1).to(image_side.dtype)
        return lse_pool(torch.einsum("bnd,td->btn", image_side, text), self.gamma, dim=-1)

    def score_pairs(self, image_side: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """Row-wise scores s(image_i, text_i): the diagonal of :meth:`score`, B values."""
        text = nn.functional.normalize(_up(text_emb), dim=-1).to(image_side.dtype)
        return lse_pool(torch.einsum("bnd,bd->bn", image_side, text), self.gamma, dim=-1)

    def forward(self, image: ImageFeatures, text_emb: torch.Tensor) -> torch.Tensor:
        return self.score(self.image_side(image), text_emb)

    def to_config(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            "trained": self.trained,
            "dim": self.dim,
            "gamma": float(self.gamma.detach()),
            "learn_gamma": self.learn_gamma,
            "non_local": self.nl is not None,
            "inner_dim": self.nl.inner_dim if self.nl is not None else None,
        }


def build_head(cfg: dict[str, Any] | str, dim: int | None = None) -> nn.Module:
    """Head from a config dict (``{"type": "cosine" | "lse_nl", ...}``) or a bare type name."""
    if isinstance(cfg, str):
        cfg = {"type": cfg}
    cfg = dict(cfg)
    kind = cfg.pop("type", None)
    if dim is not None:
        cfg.setdefault("dim", dim)
    if kind == "cosine":
        return CosineHead(cfg.get("dim"))
    if kind == "lse_nl":
        if cfg.get("dim") is None:
            raise MedclrError("lse_nl head: 'dim' (the joint dim) is required")
        return LSENLHead(**cfg)
    raise MedclrError(f"similarity head {kind!r}: expected 'cosine' or 'lse_nl'")
