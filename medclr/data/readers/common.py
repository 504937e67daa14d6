"""Helpers shared by the readers."""

from __future__ import annotations

import hashlib

from medclr.data.text import extract_sections, report_text, split_sentences


def text_fields(report: str) -> dict:
    """``report``, ``text`` (findings + impression) and ``sentences`` of one plain-text report."""
    text = report_text(extract_sections(report))
    return {"report": report, "text": text, "sentences": split_sentences(text)}


def hash_split(key: str, seed: int = 0, fractions: tuple[float, float] = (0.8, 0.1)) -> str:
    """Deterministic train/validate/test assignment from a key (use the subject id: no patient leakage)."""
    u = int(hashlib.sha1(f"{seed}:{key}".encode()).hexdigest()[:12], 16) / float(1 << 48)
    if u < fractions[0]:
        return "train"
    if u < fractions[0] + fractions[1]:
        return "validate"
    return "test"
