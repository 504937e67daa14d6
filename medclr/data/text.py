"""Report text: section extraction (MIMIC plain text) and radiology sentence splitting.

Sections follow the official MIMIC-CXR parser (MIT-LCP/mimic-cxr txt/section_parser.py,
summarised in docs/data.md): upper-case headers ending in a colon, names
normalised to a small canonical set, the last section of a name wins, and a
report with neither FINDINGS nor IMPRESSION falls back to its last paragraph.

Sentences come from pysbd, which is made for this but needs three repairs on
radiology text: wrapped lines must be joined first (pysbd splits at every
newline), abbreviations such as "approx." and "Pt." must be taught to it, and
list markers ("1.") and header fragments ("IMPRESSION:") must not survive as
sentences.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

import pysbd
from pysbd.lang.english import English

# One anonymisation token everywhere: MIMIC writes "___", Open-i "XXXX".
ANON_TOKEN = "___"
_ANON = re.compile(r"X{3,}|_{3,}")

_EXTRA_ABBREVIATIONS = ("approx", "pt", "pts", "hx", "sx", "dx", "tx", "ant", "post", "lat", "vs", "resp")
# pysbd reads its abbreviation list from this class attribute; extending it is
# the documented way to teach it new ones (a process-wide change, harmless: the
# additions are not sentence-final words in English prose).
English.Abbreviation.ABBREVIATIONS = sorted(set(English.Abbreviation.ABBREVIATIONS) | set(_EXTRA_ABBREVIATIONS))

# A header: start of a line, capitals/space/()/,&-, a colon. Examples: "FINDINGS:",
# "REASON FOR EXAMINATION:", "FINDINGS AND IMPRESSION:", "PA AND LATERAL VIEWS OF THE CHEST:".
_HEADER = re.compile(r"(?m)^[ \t]*([A-Z][A-Z ()/,&\-]{1,60}?)[ \t]*:(?=\s|$)")

_FINAL_REPORT = re.compile(r"^\s*FINAL REPORT[ \t]*$", re.MULTILINE)

_CANONICAL = {
    "findings": "findings",
    "finding": "findings",
    "findngs": "findings",
    "impression": "impression",
    "impresson": "impression",
    "impressions": "impression",
    "conclusion": "impression",
    "conclusions": "impression",
    "summary": "impression",
    "findings and impression": "impression",
    "findings/impression": "impression",
    "impression and findings": "impression",
    "comparison": "comparison",
    "comparisons": "comparison",
    "indication": "indication",
    "indications": "indication",
    "reason for exam": "indication",
    "reason for examination": "indication",
    "reason for study": "indication",
    "clinical indication": "indication",
    "history": "history",
    "clinical history": "history",
    "technique": "technique",
    "examination": "examination",
    "exam": "examination",
    "recommendation": "recommendation",
    "recommendations": "recommendation",
    "recommendation(s)": "recommendation",
    "notification": "notification",
    "wet read": "wet read",
    "addendum": "addendum",
}
_KEYWORDS = ("impression", "findings", "history", "comparison", "addendum", "indication")
_VIEW_HEADER = re.compile(r"\b(chest|portable|pa and lat|pa and lateral|ap view|one view|two views|frontal|lateral)\b")

# Sections whose text is used for training by default, in report order.
DEFAULT_SECTIONS = ("findings", "impression")


def normalise_anonymisation(text: str) -> str:
    """Replace MIMIC "___" and Open-i "XXXX" placeholders by one token."""
    return _ANON.sub(ANON_TOKEN, text)


def canonical_section_name(name: str) -> str:
    key = " ".join(name.lower().split())
    if key in _CANONICAL:
        return _CANONICAL[key]
    for word in _KEYWORDS:
        if word in key:
            return word
    if _VIEW_HEADER.search(key):
        return "findings"
    return key


def extract_sections(report: str) -> dict[str, str]:
    """Split a plain-text report into {canonical name: text}; the last section of a name wins.

    Text before the first header is ``preamble``; a report without headers is one
    ``full report`` section. When neither findings nor impression is present, the
    last section is split at its first blank line and the remainder becomes
    ``last_paragraph`` (the official parser's fallback).
    """
    report = _FINAL_REPORT.sub("", report.replace("\r\n", "\n").replace("\r", "\n"), count=1)
    headers = list(_HEADER.finditer(report))
    if not headers:
        text = report.strip()
        return {"full report": text} if text else {}
    sections: dict[str, str] = {}
    preamble = report[: headers[0].start()].strip()
    if preamble:
        sections["preamble"] = preamble
    order: list[str] = []
    for match, nxt in zip(headers, headers[1:] + [None]):
        body = report[match.end() : nxt.start() if nxt else len(report)].strip()
        name = canonical_section_name(match.group(1))
        if body or name not in sections:
            sections[name] = body
            order.append(name)
    for name in ("findings", "impression"):
        if name in sections and not sections[name]:
            del sections[name]
    if "findings" not in sections and "impression" not in sections and order:
        last = order[-1]
        head, sep, tail = sections.get(last, "").partition("\n\n")
        if sep and tail.strip():
            sections[last] = head.strip()
            sections["last_paragraph"] = tail.strip()
    return sections


def report_text(sections: dict[str, str], use: tuple[str, ...] = DEFAULT_SECTIONS) -> str:
    """The text used for training: the chosen sections in order; else the best fallback."""
    parts = [sections[name] for name in use if sections.get(name)]
    if not parts:
        for fallback in ("last_paragraph", "full report"):
            if sections.get(fallback):
                parts = [sections[fallback]]
                break
    return "\n\n".join(parts)


_LIST_MARKER = re.compile(r"^\s*(?:\(?\d{1,2}[.)]|[-*\u2022])\s+")
_LIST_LINE = re.compile(r"^\s*(?:\(?\d{1,2}[.)]|[-*\u2022])\s")
_HEADER_PREFIX = re.compile(r"^[A-Z][A-Z ()/,&\-]{1,60}:\s*")
_HAS_WORD = re.compile(r"[A-Za-z]{2,}")


def _paragraphs(text: str) -> list[str]:
    """Join wrapped lines; keep blank lines, list items and headers as breaks."""
    paragraphs: list[str] = []
    current: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        stripped = line.strip()
        if not stripped or _LIST_LINE.match(stripped) or _HEADER.match(stripped):
            if current:
                paragraphs.append(" ".join(current))
            current = [stripped] if stripped else []
        else:
            current.append(stripped)
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


@lru_cache(maxsize=1)
def _segmenter() -> pysbd.Segmenter:
    return pysbd.Segmenter(language="en", clean=False)


def _clean_sentence(sentence: str) -> str:
    sentence = _HEADER_PREFIX.sub("", sentence.strip())
    sentence = _LIST_MARKER.sub("", sentence)
    return " ".join(sentence.split())


def split_sentences(text: str) -> list[str]:
    """Radiology sentence splitting: pysbd per paragraph, then drop fragments.

    A fragment is anything without a word of two letters (``"1."``, ``"."``,
    ``"2)"``) or a bare header (``"IMPRESSION:"``). Anonymisation tokens are
    normalised to ``___`` first, so XXXX and ___ reports split alike.
    """
    if not text or not text.strip():
        return []
    sentences: list[str] = []
    for paragraph in _paragraphs(normalise_anonymisation(text)):
        for piece in _segmenter().segment(paragraph):
            cleaned = _clean_sentence(piece)
            if _HAS_WORD.search(cleaned):
                sentences.append(cleaned)
    return sentences


def sentence_hash(sentence: str) -> str:
    """Stable key of a sentence (whitespace-normalised, case kept): joins eta tables to manifests."""
    return hashlib.sha1(" ".join(sentence.split()).encode("utf-8")).hexdigest()[:16]
