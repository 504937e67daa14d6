"""Load a Hugging Face masked LM + tokenizer for PLL scoring, offline first.

``load_masked_lm(name_or_path)`` accepts a local directory (e.g. the output of
``medclr lm fit``) or a hub id that is already in the local Hugging Face cache, resolved by
:func:`medclr.hub.resolve_model_dir` (the text encoder's resolution).
It never touches the network unless ``allow_network=True`` and never runs
repository code unless the caller opts in with ``trust_remote_code``. Every failure is one
:class:`~medclr.errors.MedclrError` line:

* a path that does not exist;
* a hub id that is not cached (and no network allowed);
* a checkpoint with no masked-LM class (e.g. GPT-2);
* a checkpoint whose MLM head is MISSING (e.g. a sentence-embedding model saved
  as ``BertModel`` without ``cls.*`` tensors): transformers would silently put
  a random head on it, and every PLL would be noise.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from medclr.errors import MedclrError
from medclr.hub import quiet_transformers, resolve_model_dir

log = logging.getLogger(__name__)

FIT_HINT = "a local model directory, e.g. the output of `medclr lm fit --manifest M --out DIR`"


def load_masked_lm(
    name_or_path: str | os.PathLike,
    *,
    allow_network: bool = False,
    trust_remote_code: bool = False,
    device: str | None = None,
):
    """Return ``(model, tokenizer)``: an ``AutoModelForMaskedLM`` in eval mode and its fast tokenizer.

    ``name_or_path``: a local directory or a hub id already in the cache
    (``allow_network=True`` lets :func:`medclr.hub.resolve_model_dir` download it). ``device``: where
    to put the model (``None``: CUDA when present, else CPU).
    """
    import torch

    # medclr.models (torchvision and the towers) is imported only when a model is loaded
    from medclr.models.hub import cxr_bert_config

    # where the model lives: medclr.hub, the resolution the text encoder uses (a cached hub id, or one
    # downloaded when allow_network, becomes its local snapshot directory)
    target = str(resolve_model_dir(name_or_path, allow_network=allow_network, trust_remote_code=trust_remote_code,
                                   what="masked LM"))
    cxr_bert = cxr_bert_config(Path(target))
    with quiet_transformers():
        if cxr_bert is not None:
            model, info, tokenizer = _cxr_bert_masked_lm(target, cxr_bert)
        else:
            model, info, tokenizer = _auto_masked_lm(target, {"local_files_only": True,
                                                              "trust_remote_code": trust_remote_code})

    prefix = getattr(model, "base_model_prefix", "")
    missing = sorted(k for k in info.get("missing_keys", ()) if prefix and not k.startswith(prefix + "."))
    if missing:
        raise MedclrError(
            f"{target}: the checkpoint has no masked-LM head (MISSING {missing[0]}"
            f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}); it looks like an encoder or "
            "sentence-embedding model, and a random head would make PLL meaningless; pass a masked LM, "
            f"e.g. {FIT_HINT}"
        )
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).eval()
    log.info("loaded masked LM %s (%s, %.1fM parameters) on %s", target, type(model).__name__,
             sum(p.numel() for p in model.parameters()) / 1e6, device)
    return model, tokenizer


def _auto_masked_lm(target: str, kwargs: dict):
    """A masked LM of a model type transformers knows (or whose own code the caller trusts), and its tokenizer."""
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(target, **kwargs)
    except OSError:
        raise MedclrError(f"{target}: config.json could not be read; expected {FIT_HINT}") from None
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise MedclrError(
                f"{target}: this model needs its own code from the repository; pass --trust-remote-code "
                "only if you trust it"
            ) from None
        raise MedclrError(f"{target}: unreadable model config ({str(exc).splitlines()[0]})") from None
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(target, output_loading_info=True, **kwargs)
    except ValueError as exc:
        msg = str(exc).splitlines()[0]
        if "Unrecognized configuration class" in msg or "AutoModelForMaskedLM" in msg:
            raise MedclrError(
                f"{target}: model type '{config.model_type}' has no masked-LM class; PLL needs a masked LM "
                "(BERT-like, e.g. CXR-BERT or the output of `medclr lm fit`)"
            ) from None
        raise MedclrError(f"{target}: could not load as a masked LM ({msg})") from None
    except OSError as exc:
        raise MedclrError(f"{target}: model weights could not be read ({str(exc).splitlines()[0]})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(target, **kwargs)
    except (OSError, ValueError, TypeError) as exc:
        raise MedclrError(
            f"{target}: no usable tokenizer saved with the model ({str(exc).splitlines()[0]})"
        ) from None
    return model, info, tokenizer


def _cxr_bert_masked_lm(target: str, config):
    """CXR-BERT without its repository's code: transformers' ``BertForMaskedLM`` is its body and MLM head (the
    ``cls_projection_head`` tensors belong to the text tower, not to PLL), and its tokenizer is vocab.txt's BERT one."""
    from transformers import BertForMaskedLM

    from medclr.models.hub import load_tokenizer

    try:
        model, info = BertForMaskedLM.from_pretrained(target, config=config, local_files_only=True,
                                                      output_loading_info=True)
    except OSError as exc:
        raise MedclrError(f"{target}: CXR-BERT weights could not be read ({str(exc).splitlines()[0]})") from None
    return model, info, load_tokenizer(Path(target), trust_remote_code=False, bert_fallback=True)


def model_fingerprint(model, tokenizer) -> str:
    """A stable hex digest of the weights and the vocabulary (the cache key of ``lm score``)."""
    import torch

    h = hashlib.sha256()
    h.update(type(model).__name__.encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    vocab = tokenizer.get_vocab()
    for tok in sorted(vocab):
        h.update(f"{tok}\t{vocab[tok]}\n".encode())
    return h.hexdigest()[:32]

