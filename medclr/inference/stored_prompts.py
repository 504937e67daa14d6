"""The default prompts' embeddings, stored in the checkpoint directory so that scoring needs no text tower.

`medclr score` with the CheX5 prompts only needs ten (D,) vectors from the text tower. Training writes them beside
the weights at every checkpoint (``prompt_embeddings.safetensors``: ``<class>|positive`` / ``<class>|negative``,
reduced like :func:`medclr.prompts.prompt_embeddings`), recording the prompts and the SHA-256 of the weights file
they were computed from. A reader uses them only when both match (the prompts of this medclr version, the weights
it verified), so the scorer starts without transformers, the tokenizer and the text weights; anything else
(custom prompts, an older checkpoint, unverified weights) encodes the prompts with the text tower as before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from medclr.files import atomic_path, stable_safetensors
from medclr.prompts import PromptSet, prompt_embeddings

PROMPTS_NAME = "prompt_embeddings.safetensors"
FORMAT = "medclr.prompt_embeddings/1"


def _prompts_key(prompts: PromptSet) -> str:
    return json.dumps(prompts, sort_keys=True)


def save_prompt_embeddings(directory: str | os.PathLike, model, weights_sha256: str,
                           prompts: PromptSet) -> Path:
    """Encode ``prompts`` with ``model``'s text tower (eval mode, float32, no autocast; its mode is restored) and
    write them to ``directory``. Dropout is off in eval mode, so no random number is drawn: a training run that
    saves goes on exactly as one that does not."""
    from safetensors.torch import save_file

    text = model.text_encoder
    was_training = text.training
    device = next(text.parameters()).device
    try:
        text.eval()
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            emb = prompt_embeddings(lambda s: text.encode(s, normalize=False).float(), prompts)
    finally:
        text.train(was_training)
    tensors = {f"{cls}|{side}": t.detach().cpu().contiguous()
               for cls, pair in emb.items() for side, t in zip(("positive", "negative"), pair)}
    out = Path(directory) / PROMPTS_NAME
    with atomic_path(out) as tmp:
        save_file(tensors, str(tmp), metadata={"format": FORMAT, "prompts": _prompts_key(prompts),
                                               "weights_sha256": weights_sha256})
        stable_safetensors(tmp)  # the same prompts and weights: the same bytes
    return out


def read_prompt_embeddings(directory: str | os.PathLike, weights_sha256: str | None,
                           prompts: PromptSet) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """class -> (positive, negative) stored for ``prompts`` and the weights whose SHA-256 the caller verified, or
    None when there is no such file, it is for other prompts or other weights, or it cannot be read."""
    from safetensors import SafetensorError
    from safetensors.torch import safe_open

    path = Path(directory) / PROMPTS_NAME
    if weights_sha256 is None or not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            if (meta.get("format") != FORMAT or meta.get("weights_sha256") != weights_sha256
                    or meta.get("prompts") != _prompts_key(prompts)):
                return None
            return {cls: (fh.get_tensor(f"{cls}|positive"), fh.get_tensor(f"{cls}|negative")) for cls in prompts}
    except (SafetensorError, OSError):
        return None


__all__ = ["PROMPTS_NAME", "read_prompt_embeddings", "save_prompt_embeddings"]
