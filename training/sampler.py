"""A global-batch sampler for contrastive training on one or many ranks.

Why not torch's DistributedSampler: it pads the epoch with repeated indices so that every
rank gets the same count, which can put one dataset index twice into a global batch. The
losses keep per-sample tables (u, zeta) that are written by dataset index, so a duplicate
would double-count that sample in one update; the contrastive loss would also treat a pair
as its own negative. Here one permutation per epoch is cut into global batches of exactly
``global_batch`` distinct indices (the remainder is dropped, a different remainder each
epoch), and rank r takes the r-th contiguous slice of every global batch, so every rank
gets the same number of pairs per step.

The permutation depends only on (seed, epoch): the sampler position is just
(epoch, batch within epoch), and resuming at any step reproduces the exact remaining order
whatever the number of loader workers.

Items are (epoch, index) tuples: the dataset derives its per-item randomness (crop,
contrast, sentence choice) from them, so it never needs to be told the epoch.

With ``weights`` (``data.study_sampling: findings``, ``medclr.data.pairs.study_weights``) each global
batch is instead a weighted draw of ``global_batch`` distinct indices, a pure function of
(seed, step): the Gumbel top-k trick (keys log w_i + Gumbel noise, the k largest), which is
sampling without replacement with probabilities proportional to w (Efraimidis and Spirakis,
2006; Kool et al., ICML 2019). An index can then come back within an epoch, so items are
(step, index): its view differs at every draw. An "epoch" is still ``n // global_batch`` steps.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from medclr.errors import MedclrError


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The dataset order of one epoch (a pure function of seed and epoch)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), 0x5A3D])).permutation(n)


class GlobalBatchSampler:
    """Batch sampler yielding this rank's share of each global batch as a list of (epoch, index).

    Args:
        n: dataset size (indices 0..n-1).
        global_batch: pairs per optimisation step over all ranks; must be a multiple of world_size.
        rank, world_size: this process and the number of processes.
        seed: shuffling seed.
        start_step: global step to start from (resume); epoch = step // steps_per_epoch.
        weights: optional (n,) positive draw weights (None = every index once per epoch).
    """

    def __init__(self, n: int, global_batch: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 start_step: int = 0, weights: np.ndarray | None = None) -> None:
        if global_batch < 2:
            raise MedclrError(f"train.batch_size {global_batch}: a contrastive batch needs at least 2 pairs")
        if global_batch % world_size:
            raise MedclrError(
                f"train.batch_size {global_batch} (the global batch) is not divisible by the {world_size} processes"
            )
        if n < global_batch:
            raise MedclrError(f"the training split has {n} pairs, fewer than train.batch_size {global_batch}")
        self.n, self.global_batch, self.rank, self.world_size = int(n), int(global_batch), int(rank), int(world_size)
        self.local_batch = self.global_batch // self.world_size
        self.seed = int(seed)
        self.steps_per_epoch = self.n // self.global_batch
        self.step = int(start_step)
        self.log_weights = None
        if weights is not None:
            w = np.asarray(weights, dtype=np.float64)
            if w.shape != (self.n,) or not np.all(np.isfinite(w) & (w > 0)):
                raise MedclrError(f"sampler weights: expected {self.n} positive finite numbers")
            self.log_weights = np.log(w)

    def position(self, step: int | None = None) -> tuple[int, int]:
        """(epoch, batch within the epoch) of a global step (default: the next one to be drawn)."""
        s = self.step if step is None else step
        return divmod(s, self.steps_per_epoch)

    def global_batch_indices(self, step: int) -> np.ndarray:
        """All ranks' indices of one step, rank 0's slice first (used by tests and checks)."""
        if self.log_weights is not None:
            keys = self.log_weights + np.random.default_rng(np.random.SeedSequence([self.seed, int(step), 0x6B1A])).gumbel(
                size=self.n)
            return np.argpartition(-keys, self.global_batch - 1)[:self.global_batch]
        epoch, k = self.position(step)
        perm = epoch_permutation(self.n, self.seed, epoch)
        return perm[k * self.global_batch:(k + 1) * self.global_batch]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        # Infinite: the training loop decides when to stop. self.step is advanced as batches
        # are *produced*; loader workers prefetch ahead, so the loop keeps its own step count
        # (the one checkpoints record) and rebuilds the sampler from it on resume.
        step = self.step
        perm, perm_epoch = None, -1
        lo, hi = self.rank * self.local_batch, (self.rank + 1) * self.local_batch
        while True:
            if self.log_weights is not None:
                yield [(step, int(i)) for i in self.global_batch_indices(step)[lo:hi]]
            else:
                epoch, k = divmod(step, self.steps_per_epoch)
                if epoch != perm_epoch:
                    perm, perm_epoch = epoch_permutation(self.n, self.seed, epoch), epoch
                chunk = perm[k * self.global_batch:(k + 1) * self.global_batch]
                yield [(epoch, int(i)) for i in chunk[lo:hi]]
            step += 1
            self.step = step

    def state_dict(self) -> dict:
        epoch, k = self.position()
        return {"step": self.step, "epoch": epoch, "batch_in_epoch": k, "n": self.n,
                "global_batch": self.global_batch, "seed": self.seed,
                "weighted": self.log_weights is not None}
