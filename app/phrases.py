"""What a typed phrase says, read by medclr's report rules before the app draws or searches anything for it.

* **Denial**: a negated or normal-type statement ("no pleural effusion", "lungs are clear", "heart size
  normal"). A map shows where a finding is; an absence has no place to point at, so the app draws none. Read
  as: no CheX5 finding stated, and the rule labeller reads one denied (``medclr.data.labeller.mention``), or the
  hard negatives' polarity is "-" (``medclr.data.hard_negatives.polarity``), or the sentence's meaning key is
  the pooled normal statement or a denied finding (``hard_negatives.meaning_key``).
* **Finding**: the one CheX5 finding it states (``medclr.findings.finding_named``: "enlarged heart" ->
  Cardiomegaly), judged as that finding's validation judged it; the CheX5 findings it names at all, whatever
  its polarity (what a text search is about).
* **Alternatives**: the same phrase on the other side (``hard_negatives.swap_side``, the rule that writes
  training's "other side" hard negatives) and at the other size (:func:`swap_size`), which the app scores
  against the phrase typed before it paints where the phrase matches.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from medclr.data.hard_negatives import meaning_key, polarity, swap_side
from medclr.data.labeller import CLASS_FINDING, mention
from medclr.findings import finding_named

# Size words and the one each is checked against. No rule of medclr's rewrites sizes (training's hard
# negatives swap polarity, finding and side), so this is the one copy. "moderate" has no single opposite.
SIZES = {"small": "large", "tiny": "large", "trace": "large", "minimal": "large", "large": "small",
         "massive": "small", "mild": "severe", "severe": "mild"}
_SIZE = re.compile(r"\b(?:" + "|".join(SIZES) + r")\b", re.IGNORECASE)


@dataclass(frozen=True)
class Alternative:
    """The phrase with one word exchanged: ``kind`` "side" or "size", the word typed and the one in its place."""

    kind: str
    typed: str
    other: str
    phrase: str


@dataclass(frozen=True)
class Reading:
    phrase: str
    denial: bool  # a negated or normal-type statement
    finding: str | None  # the one CheX5 finding stated
    denied: tuple[str, ...]  # CheX5 findings denied ("no pleural effusion" -> Pleural Effusion)
    named: tuple[str, ...]  # CheX5 findings named, whatever the polarity (stated, denied or hedged)
    alternatives: tuple[Alternative, ...]


def swap_size(phrase: str) -> str | None:
    """The phrase with its one size word exchanged (:data:`SIZES`: "small right pneumothorax" -> "large right
    pneumothorax"), when it is a clean statement naming one size; else None."""
    found = _SIZE.findall(phrase)
    if len(found) != 1 or polarity(phrase) != "+":
        return None
    return _SIZE.sub(lambda m: _same_case(m.group(0), SIZES[m.group(0).lower()]), " ".join(phrase.split()))


def _same_case(found: str, word: str) -> str:
    return word[:1].upper() + word[1:] if found[:1].isupper() else word


def _alternative(kind: str, phrase: str, swapped: str | None) -> Alternative | None:
    if swapped is None:
        return None
    pairs = [(a, b) for a, b in zip(" ".join(phrase.split()).split(), swapped.split()) if a != b]
    if len(pairs) != 1:
        return None
    typed, other = (re.sub(r"\W+$", "", w).lower() for w in pairs[0])
    return Alternative(kind, typed, other, swapped)


@functools.lru_cache(maxsize=1024)
def read_phrase(phrase: str) -> Reading:
    """What ``phrase`` says (module docstring)."""
    text = " ".join(str(phrase).split())
    values = {c: mention(text, c) for c in CLASS_FINDING}
    stated = [c for c, v in values.items() if v == 1.0]
    denied = tuple(c for c, v in values.items() if v == 0.0)
    key = meaning_key(text)
    denial = not stated and (bool(denied) or polarity(text) == "-" or key == "normal" or key.startswith("-"))
    alternatives = () if denial else tuple(
        a for a in (_alternative("side", text, swap_side(text, [])), _alternative("size", text, swap_size(text)))
        if a is not None)
    return Reading(phrase=text, denial=denial, finding=None if denial else finding_named(text, list(CLASS_FINDING)),
                   denied=denied, named=tuple(c for c, v in values.items() if v is not None),
                   alternatives=alternatives)
