"""Text encoder: any Hugging Face encoder / masked LM -> pooled sentence embedding in the joint space.

Loading is offline by default: a local directory is read as is; a hub id is looked up in the local
Hugging Face cache only (``local_files_only``) unless the caller passes ``allow_network=True``.
``trust_remote_code`` is never turned on here; the caller must pass it.

CXR-BERT (``model_type "cxr-bert"``, e.g. ``microsoft/BiomedVLP-CXR-BERT-specialized``) needs no
remote code in medclr: its class is a ``BertForMaskedLM`` plus a ``cls_projection_head``, so the
BERT weights load into transformers' own ``BertModel`` and the head's weights into
:class:`CXRBertProjectionHead` (same layout: Linear -> GELU -> LayerNorm(eps 1e-12) -> Linear). This
also sidesteps the remote code's ``CXRBertOutput`` dataclass that breaks on transformers >= 4.40.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from medclr.errors import MedclrError
from medclr.hub import one_line, quiet_transformers, resolve_model_dir
from medclr.models.hub import cxr_bert_config, drop_pooler, load_tokenizer, read_prefixed_tensors

log = logging.getLogger(__name__)

_CXR_HEAD_PREFIX = "cls_projection_head."
_VOLATILE_KEYS = {"architectures", "auto_map", "transformers_version", "_name_or_path"}


@dataclass
class TextFeatures:
    """Output of :class:`TextEncoder`.

    embedding:      B x D, L2-normalised sentence embedding (what the heads and losses use).
    projected:      B x D, the same before normalisation (BioViL averages these over prompts).
    tokens:         B x L x D, every token's last hidden state through the same projection
                    (not normalised; padding positions are garbage, mask them with attention_mask).
    attention_mask: B x L (1 = real token).
    """

    embedding: torch.Tensor
    projected: torch.Tensor
    tokens: torch.Tensor
    attention_mask: torch.Tensor


class CXRBertProjectionHead(nn.Module):
    """CXR-BERT's ``cls_projection_head``; attribute names match its checkpoint keys."""

    def __init__(self, hidden_size: int, projection_size: int) -> None:
        super().__init__()
        self.dense_to_hidden = nn.Linear(hidden_size, projection_size)
        self.LayerNorm = nn.LayerNorm(projection_size, eps=1e-12)
        self.dense_to_output = nn.Linear(projection_size, projection_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_to_output(self.LayerNorm(nn.functional.gelu(self.dense_to_hidden(x))))


# --- the encoder -----------------------------------------------------------------------------------


class TextEncoder(nn.Module):
    """Hugging Face backbone + pooling + projection to the joint space.

    Args:
        backbone: a transformers encoder (e.g. ``BertModel``) returning ``last_hidden_state``.
        tokenizer: its tokenizer (needed by :meth:`tokenize` / :meth:`encode`; may be None when
            inputs come pre-tokenised).
        joint_dim: D.
        pooling: "cls" (first token, as CXR-BERT) or "mean" (mask-weighted mean of all tokens).
        projection: "linear" (one Linear H -> D) or "cxrbert" (:class:`CXRBertProjectionHead`).
        max_length: tokenizer truncation length (capped at the backbone's position table).
        strip_punctuation: strip trailing ``.``, ``?``, ``!`` before tokenising (CXR-BERT/BioViL rule;
            applied identically at training and inference).
        source: provenance string stored in the config (the path or hub id it came from).
    """

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer: Any = None,
        joint_dim: int = 128,
        pooling: str = "cls",
        projection: str = "linear",
        max_length: int = 128,
        strip_punctuation: bool = True,
        source: str | None = None,
    ) -> None:
        super().__init__()
        if pooling not in ("cls", "mean"):
            raise MedclrError(f"text pooling {pooling!r}: expected 'cls' or 'mean'")
        if projection not in ("linear", "cxrbert"):
            raise MedclrError(f"text projection {projection!r}: expected 'linear' or 'cxrbert'")
        self.backbone = drop_pooler(backbone)
        self.tokenizer = tokenizer
        self.joint_dim, self.pooling, self.projection_kind = int(joint_dim), pooling, projection
        self.strip_punctuation, self.source = bool(strip_punctuation), source
        hidden = int(backbone.config.hidden_size)
        max_pos = getattr(backbone.config, "max_position_embeddings", None)
        self.max_length = int(min(max_length, max_pos) if max_pos else max_length)
        self.proj = nn.Linear(hidden, joint_dim) if projection == "linear" else CXRBertProjectionHead(hidden, joint_dim)

    # -- loading ------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        *,
        joint_dim: int | None = 128,
        pooling: str = "cls",
        projection: str = "auto",
        max_length: int = 128,
        strip_punctuation: bool = True,
        allow_network: bool = False,
        trust_remote_code: bool = False,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> TextEncoder:
        """Load a backbone (+ tokenizer) from a local dir or a cached hub id.

        ``projection="auto"`` reuses a CXR-BERT ``cls_projection_head`` from the checkpoint when it
        exists and its size equals ``joint_dim`` (``joint_dim=None`` = take its size); otherwise a new
        Linear. A masked-LM checkpoint (``BertForMaskedLM``) loads its encoder part; the MLM head is
        dropped.
        """
        from transformers import AutoModel, BertModel
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if projection not in ("auto", "linear", "cxrbert"):
            raise MedclrError(f"text projection {projection!r}: expected 'auto', 'linear' or 'cxrbert'")
        model_dir = resolve_model_dir(
            name_or_path, allow_network=allow_network, revision=revision, cache_dir=cache_dir,
            trust_remote_code=trust_remote_code,
        )
        try:
            raw = json.loads((model_dir / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise MedclrError(f"text model {str(model_dir)!r}: unreadable config.json ({one_line(exc)})") from exc
        model_type = raw.get("model_type")
        bert_cfg = cxr_bert_config(model_dir)
        is_cxr_bert = bert_cfg is not None
        head_state: dict[str, torch.Tensor] = {}
        try:
            with quiet_transformers():
                if is_cxr_bert:
                    # Native path: no remote code needed (see module docstring).
                    backbone = BertModel.from_pretrained(
                        model_dir, config=bert_cfg, local_files_only=True, add_pooling_layer=False
                    )
                    head_state = read_prefixed_tensors(model_dir, _CXR_HEAD_PREFIX)
                elif model_type in CONFIG_MAPPING:
                    backbone = AutoModel.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
                elif trust_remote_code:
                    log.warning("text model %s: running its custom code (the caller opted in)", name_or_path)
                    backbone = AutoModel.from_pretrained(model_dir, local_files_only=True,
                                                         trust_remote_code=trust_remote_code)
                else:
                    raise MedclrError(
                        f"text model {os.fspath(name_or_path)!r}: model_type {model_type!r} needs custom code "
                        "from the checkpoint; opt in (trust_remote_code / --trust-remote-code) only if you trust it"
                    )
        except MedclrError:
            raise
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise MedclrError(f"text model {os.fspath(name_or_path)!r}: cannot be loaded ({one_line(exc)})") from exc
        tokenizer = load_tokenizer(model_dir, trust_remote_code, bert_fallback=is_cxr_bert)

        hidden = int(backbone.config.hidden_size)
        head_size = int(head_state["dense_to_output.weight"].shape[0]) if "dense_to_output.weight" in head_state else None
        joint = joint_dim if joint_dim is not None else (head_size or 128)
        use_head = projection in ("auto", "cxrbert") and head_size is not None and head_size == joint
        if projection == "cxrbert" and not use_head:
            log.info("text model %s: no usable cls_projection_head (size %s vs joint_dim %s); fresh head",
                     name_or_path, head_size, joint)
        kind = "cxrbert" if (use_head or projection == "cxrbert") else "linear"
        enc = cls(backbone, tokenizer, joint_dim=joint, pooling=pooling, projection=kind, max_length=max_length,
                  strip_punctuation=strip_punctuation, source=os.fspath(name_or_path))
        if use_head:
            try:
                enc.proj.load_state_dict(head_state, strict=True)
            except RuntimeError as exc:
                raise MedclrError(f"text model {os.fspath(name_or_path)!r}: cls_projection_head does not fit a "
                                  f"{hidden} -> {joint} head ({one_line(exc)})") from exc
            log.info("text model %s: using its pretrained CXR-BERT projection head (%d -> %d)", name_or_path, hidden, joint)
            if pooling != "cls":
                log.warning("text model %s: CXR-BERT's head was trained on [CLS]; pooling=%r feeds it another vector",
                            name_or_path, pooling)
        return enc

    # -- tokenising and encoding ------------------------------------------------------------------------
    def tokenize(self, sentences: str | Sequence[str]) -> dict[str, torch.Tensor]:
        """Sentences -> dict of B x L tensors (input_ids, attention_mask[, token_type_ids]), padded to
        the longest, truncated at ``max_length``."""
        if self.tokenizer is None:
            raise MedclrError("text encoder has no tokenizer; load it with from_pretrained or pass tokenizer=")
        if isinstance(sentences, str):
            sentences = [sentences]
        texts = [str(s).strip() for s in sentences]
        if self.strip_punctuation:
            texts = [t.rstrip(".?!").rstrip() for t in texts]
        batch = self.tokenizer(texts, padding="longest", truncation=True, max_length=self.max_length,
                               return_tensors="pt")
        return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> TextFeatures:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        hidden = self.backbone(**kwargs).last_hidden_state  # B x L x H
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            m = attention_mask.to(hidden.dtype).unsqueeze(-1)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
        projected = self.proj(pooled)
        embedding = nn.functional.normalize(projected.float(), dim=-1).to(projected.dtype)
        return TextFeatures(embedding=embedding, projected=projected, tokens=self.proj(hidden),
                            attention_mask=attention_mask)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None,
              buckets: int = 1) -> torch.Tensor:
        """B x D unit sentence embeddings (:attr:`TextFeatures.embedding`), with ``buckets`` > 1 computed in that
        many chunks of sentences of similar length, each padded only to its own longest sentence. The
        attention mask keeps padding out of every real token, so the embeddings are the same up to float
        rounding; what changes is the work: report sentences padded to the batch's longest carry ~2.5x
        their real tokens (a training batch with hard negatives: 1,774 real of 4,368 padded positions)."""
        n = input_ids.shape[0]
        if buckets <= 1 or n < 2 * buckets:
            return self(input_ids, attention_mask, token_type_ids).embedding
        lengths = attention_mask.sum(1)
        order = torch.argsort(lengths, stable=True)
        parts = []
        for chunk in torch.tensor_split(order, buckets):
            width = int(lengths[chunk].max().clamp_min(1))
            parts.append(self(input_ids[chunk, :width], attention_mask[chunk, :width],
                              None if token_type_ids is None else token_type_ids[chunk, :width]).embedding)
        return torch.cat(parts)[torch.argsort(order)]

    def encode_batch(self, batch: Mapping[str, torch.Tensor]) -> TextFeatures:
        """Forward on a pre-tokenised batch (moved to this module's device)."""
        device = next(self.parameters()).device
        return self(**{k: v.to(device) for k, v in batch.items()})

    @torch.no_grad()
    def encode(self, sentences: str | Sequence[str], batch_size: int = 64, normalize: bool = True) -> torch.Tensor:
        """Inference helper: sentences -> N x D embeddings (no grad; the module's current train/eval
        mode is respected, so call ``.eval()`` first for deterministic output)."""
        if isinstance(sentences, str):
            sentences = [sentences]
        device = next(self.parameters()).device
        if len(sentences) == 0:
            return torch.empty(0, self.joint_dim, device=device)
        outs = []
        for i in range(0, len(sentences), batch_size):
            f = self.encode_batch(self.tokenize(sentences[i : i + batch_size]))
            outs.append(f.embedding if normalize else f.projected)
        return torch.cat(outs)

    # -- config -------------------------------------------------------------------------------------
    def to_config(self) -> dict[str, Any]:
        return {
            # volatile / provenance keys dropped so that the config round-trips exactly
            "backbone": {k: v for k, v in self.backbone.config.to_dict().items() if k not in _VOLATILE_KEYS},
            "joint_dim": self.joint_dim,
            "pooling": self.pooling,
            "projection": self.projection_kind,
            "max_length": self.max_length,
            "strip_punctuation": self.strip_punctuation,
            "source": self.source,
        }

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], tokenizer: Any = None) -> TextEncoder:
        """Rebuild the architecture (random weights) from :meth:`to_config`; no code from the checkpoint
        is run, so only model types built into transformers are accepted."""
        from transformers import AutoModel
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        bcfg = dict(cfg["backbone"])
        model_type = bcfg.pop("model_type", None)
        if model_type not in CONFIG_MAPPING:
            raise MedclrError(
                f"text backbone model_type {model_type!r} is not built into transformers; such checkpoints "
                "cannot be rebuilt without running their code"
            )
        for k in _VOLATILE_KEYS:
            bcfg.pop(k, None)
        hf_cfg = CONFIG_MAPPING[model_type](**bcfg)
        with quiet_transformers():
            backbone = AutoModel.from_config(hf_cfg)
        return cls(
            backbone, tokenizer, joint_dim=cfg["joint_dim"], pooling=cfg.get("pooling", "cls"),
            projection=cfg.get("projection", "linear"), max_length=cfg.get("max_length", 128),
            strip_punctuation=cfg.get("strip_punctuation", True), source=cfg.get("source"),
        )
