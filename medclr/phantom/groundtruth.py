"""The false-negative rates a phantom's latent classes imply. Its ground truth read back and joined to
manifests lives in :mod:`medclr.data.groundtruth` (``medclr.phantom`` hands those names on)."""

from __future__ import annotations

import numpy as np


def false_negative_rates(prob: np.ndarray, batch: int = 64) -> dict[str, np.ndarray]:
    """False negatives a random batch brings to a sample whose class has probability ``prob``.

    With the other B-1 batch members drawn independently from the data set:
    ``p_any`` = P(at least one of them shares the sample's latent class) = 1 - (1 - p)^(B-1);
    ``fraction`` = expected fraction of the B-1 negatives that share it = p;
    ``expected`` = expected number of such false negatives = (B-1) p.
    """
    p = np.clip(np.asarray(prob, dtype=np.float64), 0.0, 1.0)
    return {"p_any": 1.0 - (1.0 - p) ** (batch - 1), "fraction": p, "expected": (batch - 1) * p}
