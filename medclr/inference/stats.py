"""Sentence statistics from a checkpoint's training: eta_LM per sentence and NUCLR's learned popularity zeta.

Optional extras for the app's inspector, kept apart from the engine: eta_LM comes from the eta table
recorded in the checkpoint's metadata (``eta_table``), zeta from ``loss_state.safetensors`` (per training
row, mapped to the manifest ``index`` by the table saved beside it). A missing or unreadable file
means "not shown", never a failed load.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from medclr.inference.checkpoint import SAMPLE_INDEX_KEY, TEXT_HASH_KEY, hash_to_int
from medclr.inference.metadata import LOSS_STATE_NAME

log = logging.getLogger(__name__)


class SentenceStats:
    """eta_LM per sentence (eta table) and NUCLR zeta per manifest index (loss_state.safetensors)."""

    def __init__(self, eta: Mapping[str, float] | None = None, zeta: Mapping[str, Mapping[int, float]] | None = None,
                 eta_source: str | None = None, sentence_zeta: Mapping[int, float] | None = None) -> None:
        self._eta, self._zeta, self.eta_source = dict(eta or {}), dict(zeta or {}), eta_source
        self._sentence_zeta = dict(sentence_zeta or {})  # zeta_txt keyed by sentence (loss.zeta_key: sentence)

    @property
    def has_eta(self) -> bool:
        return bool(self._eta)

    @property
    def has_zeta(self) -> bool:
        return bool(self._zeta) or bool(self._sentence_zeta)

    def sentence_zeta(self, sentence: str) -> float | None:
        """zeta_txt of a training sentence (its popularity as a candidate of image anchors), when the run keyed
        the text table by sentence; else None."""
        from medclr.data.text import sentence_hash

        value = self._sentence_zeta.get(hash_to_int(sentence_hash(sentence)))
        return None if value is None else float(value)

    def eta(self, sentence: str) -> float | None:
        from medclr.data.text import sentence_hash

        value = self._eta.get(sentence_hash(sentence))
        return None if value is None else float(value)

    def zeta(self, index: int) -> dict[str, float] | None:
        """{"txt": zeta of the report as a candidate of image anchors, "img": ...} for a manifest index."""
        out = {m: float(t[int(index)]) for m, t in self._zeta.items() if int(index) in t}
        return out or None

    @classmethod
    def from_checkpoint(cls, directory: Path | None, eta_table: str | None,
                        eta_override: dict | None = None) -> SentenceStats:
        """eta from ``eta_table`` (the checkpoint's recorded one; recomputed with the checkpoint's ``eta_override``
        where training recomputed it), zeta from the directory's loss state."""
        eta: dict[str, float] = {}
        zeta: dict[str, dict[int, float]] = {}
        sentence_zeta: dict[int, float] = {}
        path = eta_table
        if path and Path(path).is_file():
            try:
                eta = _read_eta_table(Path(path), eta_override)
            except Exception as exc:  # noqa: BLE001 - the inspector degrades, the app keeps running
                log.warning("eta table %s unreadable (%s); eta not shown", path, type(exc).__name__)
        if directory is not None and (Path(directory) / LOSS_STATE_NAME).is_file():
            from safetensors.numpy import load_file

            try:
                tables = load_file(str(Path(directory) / LOSS_STATE_NAME))
            except Exception as exc:  # noqa: BLE001
                log.warning("%s unreadable (%s); zeta not shown", LOSS_STATE_NAME, type(exc).__name__)
                tables = {}
            rows = tables.get(SAMPLE_INDEX_KEY)
            if rows is None and any("zeta_" in k for k in tables):
                log.warning("%s has no %s (trained before medclr recorded it); zeta not shown",
                            LOSS_STATE_NAME, SAMPLE_INDEX_KEY)
            texts = tables.get(TEXT_HASH_KEY)
            for key, value in tables.items() if rows is not None else ():
                for m in ("txt", "img"):
                    if not (key == f"zeta_{m}" or key.endswith(f".zeta_{m}")):
                        continue
                    keys = texts if m == "txt" and texts is not None and len(texts) == len(value) else rows
                    if len(keys) != len(value):
                        log.warning("%s: %s has %d entries for %d keys; zeta not shown", LOSS_STATE_NAME, key,
                                    len(value), len(keys))
                        continue
                    table = dict(zip(keys.astype(np.int64).tolist(), np.asarray(value, np.float64).tolist()))
                    if keys is texts:
                        sentence_zeta = table
                    else:
                        zeta[m] = table
        return cls(eta, zeta, str(path) if eta else None, sentence_zeta)


def _read_eta_table(path: Path, override: dict | None) -> dict[str, float]:
    """sentence hash -> the eta training used: the table's column, or recomputed as training did (``override``:
    the checkpoint's ``eta_override``)."""
    from medclr.lm.eta import apply_eta, read_eta_table

    table, meta = read_eta_table(path)
    if override is not None:
        table, _ = apply_eta(table, a=override["a"], k=override["k"], norm=meta.get("norm", "sum"),
                             eta_max=override["eta_max"])
    return dict(zip(table["sentence_hash"].astype(str), table["eta"].astype(float)))
