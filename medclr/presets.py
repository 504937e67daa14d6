"""Which training recipe a machine gets when the user does not say: ``preset: auto`` for `medclr train` and
`medclr demo --preset auto` (one rule, so the two never disagree)."""

from __future__ import annotations

AUTO = "auto"


def auto_preset(device: str = "auto") -> str:
    """gpu_small where training will run on CUDA (``device`` cuda, or auto with a GPU present: 2,500 steps of the
    negation-aware recipe, a few GPU minutes), else cpu_small (450 steps of the 64 px model, ~8-13 CPU minutes)."""
    device = str(device)
    if device == "auto":
        import torch

        return "gpu_small" if torch.cuda.is_available() else "cpu_small"
    return "gpu_small" if device.startswith("cuda") else "cpu_small"
