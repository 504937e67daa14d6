"""Cross-rank plumbing for the losses: local anchors x global candidates.

Scheme (every loss in this package):
- each rank embeds its local batch of b_r pairs; image and text embeddings are all-gathered
  WITH gradient (torch.distributed.nn.functional.all_gather, whose backward sums the
  gradients that every rank sends back to each slice);
- each rank scores its own b_r anchors against all B = sum_r b_r candidates; anchor k of rank
  r has its positive at global column offset_r + k;
- per-row losses are reduced as  sum(local rows) * W / B.  With the summing gather, rank r's
  input gradient is d(sum_r' L_r')/dx_r, DDP's gradient *average* then gives
  (1/W) * grad(sum_r' L_r') = grad(full-batch mean) exactly. So no extra world_size factor is
  needed (that factor is only for gathers whose backward returns the local slice alone, or for
  the 'whole loss on every rank' pattern); the W/B instead of 1/b_r keeps this exact when the
  ranks' batch sizes differ (a last partial batch);
- statistics that feed per-sample tables are gathered WITHOUT gradient so that every rank
  applies the identical update to its replica of the tables.

When torch.distributed is not initialised everything degrades to the single-process case
with no collective calls.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def dist_info() -> tuple[int, int]:
    """(rank, world_size); (0, 1) when torch.distributed is unavailable or not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather_sizes(b: int, device: torch.device) -> list[int]:
    t = torch.tensor([b], device=device, dtype=torch.long)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [int(x.item()) for x in out]


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x.contiguous()
    pad = x.new_zeros((rows - x.shape[0],) + tuple(x.shape[1:]))
    return torch.cat([x, pad], dim=0)


def gather_with_grad(x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
    """Concatenate every rank's `x` along dim 0, differentiably (backward sums across ranks).

    Ranks may hold different numbers of rows: rows are zero-padded to the largest size for
    the collective and the padding is sliced off (its gradient is discarded).
    """
    rank, world = dist_info()
    if world == 1:
        return x
    import torch.distributed.nn.functional as dfn  # lazy: pulls in RPC machinery

    sizes = sizes if sizes is not None else _gather_sizes(x.shape[0], x.device)
    parts = dfn.all_gather(_pad_rows(x, max(sizes)))
    return torch.cat([p[:s] for p, s in zip(parts, sizes)], dim=0)


@torch.no_grad()
def gather_no_grad(x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
    """Concatenate every rank's `x` along dim 0 (indices, table statistics); no autograd."""
    rank, world = dist_info()
    if world == 1:
        return x
    sizes = sizes if sizes is not None else _gather_sizes(x.shape[0], x.device)
    padded = _pad_rows(x, max(sizes))
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[:s] for p, s in zip(parts, sizes)], dim=0)


@torch.no_grad()
def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (a new tensor; every rank receives the same bits)."""
    rank, world = dist_info()
    if world == 1:
        return x
    out = x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


class GlobalBatch:
    """The local anchors and global candidates of one step (see the module docstring).

    From embeddings (the cosine case): img, txt are this rank's prepared (float32+, normalised)
    b x d embeddings; img_all, txt_all all ranks' B x d, differentiable.
    From similarity blocks (a head's scores, :func:`score_blocks`): ``blocks`` = (image-anchored
    b x B, text-anchored b x B); img, txt, img_all, txt_all are None.
    pos: global column of each local anchor's positive (offset + arange(b)).
    """

    def __init__(self, img: torch.Tensor | None, txt: torch.Tensor | None,
                 blocks: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.rank, self.world = dist_info()
        ref = img if blocks is None else blocks[0]
        self.b, self.device, self.dtype = ref.shape[0], ref.device, ref.dtype
        self.like = ref  # device and dtype for per-pair tensors (eta, weights)
        self.sizes = [self.b] if self.world == 1 else _gather_sizes(self.b, ref.device)
        self.img, self.txt, self.img_all, self.txt_all = img, txt, img, txt
        if blocks is None and self.world > 1:
            self.img_all = gather_with_grad(img, self.sizes)
            self.txt_all = gather_with_grad(txt, self.sizes)
        self._blocks = blocks
        self.B = sum(self.sizes)
        self.offset = sum(self.sizes[: self.rank])
        self.pos = torch.arange(self.b, device=ref.device) + self.offset

    def sims(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(image-anchored b x B, text-anchored b x B) similarities.

        Embeddings, single process: one B x B product and its transpose (half the work of two).
        """
        if self._blocks is not None:
            return self._blocks
        if self.world == 1:
            s = self.img @ self.txt.T
            return s, s.T
        return self.img @ self.txt_all.T, self.txt @ self.img_all.T

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Per-pair local tensor (b, ...) -> global (B, ...), no gradient."""
        return gather_no_grad(x, self.sizes)

    def local(self, x_global: torch.Tensor) -> torch.Tensor:
        return x_global[self.offset : self.offset + self.b]

    def reduce_rows(self, per_row: torch.Tensor) -> torch.Tensor:
        """sum(local rows) * W / B: DDP's averaging then yields the full-batch mean's gradient."""
        return per_row.sum() * (self.world / self.B)


def score_blocks(score, image_side: torch.Tensor, text_emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A head's similarity blocks for the losses: (local images x all sentences, local sentences x
    all images), each b x B with the positive of local row k at column offset + k.

    ``score(image_side, text_emb) -> B_img x B_txt`` is the head's pairing (``head.score``);
    ``image_side`` is the per-image part (``head.image_side(features)``: unit global embeddings, or
    the unit NL-contextualised region cells b x N x D). Both sides are gathered WITH gradient, so the
    losses' sum * W / B reduction and DDP's average give the full-batch gradient of the head and
    both towers, as for embeddings. Single process: one B x B block and its transpose.
    """
    rank, world = dist_info()
    if world == 1:
        s = score(image_side, text_emb)
        return s, s.T
    sizes = _gather_sizes(image_side.shape[0], image_side.device)
    img_all = gather_with_grad(image_side, sizes)
    txt_all = gather_with_grad(text_emb, sizes)
    return score(image_side, txt_all), score(img_all, text_emb).T
