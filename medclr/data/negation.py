"""Rule negation of report sentences: the hard negative texts of negation-aware training.

``negate(sentence)`` returns a sentence of the opposite polarity ("Small left pleural effusion." ->
"No small left pleural effusion."; "There is no pneumothorax." -> "There is pneumothorax.") or None
when the sentence's polarity is mixed or hedged, so its negation would not be a clean opposite.

Why rules and not a model: training pairs each image with one sentence of its report, and the
text tower must learn that the stated sentence fits the image better than its opposite
(NegCLIP, Yuksekgonul et al., ICLR 2023, made such hard negatives from captions by swapping words;
radiology needs the negation itself). The cues radiology reports use are few and regular (NegEx,
Chapman et al. 2001: "no", "without", "not", "negative for", "free of", "clear of"), and no kept
library rewrites a sentence into its opposite (negspacy, pyConText detect negation, they do not
produce it). The grammar is small, readable, and tested on the phrases reports and the
zero-shot prompts use (tests/test_negation.py).

Rules, first match wins:

1. Mixed or hedged polarity -> None: a contrast ("but", "however", "although", "except"), an
   uncertainty cue ("may", "possible", "cannot exclude", ...), a recommendation, a change statement
   ("no change", "unchanged", "no longer", "resolved"), or two negation cues ("without X and
   without Y"): flipping one cue would not flip the whole meaning.
2. Negated -> stated: drop the cue. "No X" -> "X"; "There is no X" -> "There is X";
   "X is not seen" -> "X is seen"; "without X" -> "with X"; "negative for X" -> "positive for X";
   "free of X" -> "with X"; "The lungs are clear of X" -> "The lungs show X".
3. Stated -> negated: the word pairs "within/outside normal limits" and "normal/abnormal" swap ("Heart size normal" -> "Heart size abnormal");
   "There is/are (a|an) X" -> "There is/are no X"; a copula ("is", "are", "was", "were") gets
   "not"; otherwise "No " + the sentence ("Cardiomegaly." -> "No cardiomegaly.").
"""

from __future__ import annotations

import re

# rule 1: sentences whose polarity one cue does not decide
_MIXED = re.compile(
    r"\b(but|however|although|though|whereas|except|apart from|aside from|may|might|possibl[ey]|probabl[ey]|"
    r"cannot|can't|could|would|should|recommend\w*|questionable|question of|suspect\w*|concern\w*|likely|versus|vs|or not|"
    r"no change|no interval|no significant change|unchanged|no longer|resolved|resolution|removed|"
    r"not changed|not significantly changed|compared|limits? of normal)\b",
    re.IGNORECASE,
)
# rule 2: negation cues, each with its replacement (None = drop the cue)
_CUES: list[tuple[re.Pattern[str], str | None]] = [
    (re.compile(r"^(there\s+(?:is|are|was|were))\s+no\s+", re.IGNORECASE), r"\1 "),
    (re.compile(r"^no\s+", re.IGNORECASE), None),
    (re.compile(r"\b(is|are|was|were|has|have|had|does|do|did)\s+not\s+", re.IGNORECASE), r"\1 "),
    (re.compile(r"\b(is|are|was|were)\s+clear\s+of\b", re.IGNORECASE), "show"),
    (re.compile(r"\bnegative\s+for\b", re.IGNORECASE), "positive for"),
    (re.compile(r"\b(?:without|free\s+of)\b", re.IGNORECASE), "with"),
    (re.compile(r"\bno\b", re.IGNORECASE), None),
]
_THERE_IS = re.compile(r"^(there\s+(?:is|are|was|were))\s+(?:(?:a|an)\s+)?", re.IGNORECASE)
# stated findings whose opposite is a word, not a cue (each pair both ways)
_LEXICAL: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\bwithin normal limits\b", re.IGNORECASE), "outside normal limits"),
    (re.compile(r"\boutside normal limits\b", re.IGNORECASE), "within normal limits"),
    (re.compile(r"\babnormal\b", re.IGNORECASE), "normal"),
    (re.compile(r"\bnormal\b", re.IGNORECASE), "abnormal"),
]
_COPULA = re.compile(r"\b(is|are|was|were)\b", re.IGNORECASE)
_END = re.compile(r"[\s.!;:]*$")


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _same_case(found: str, repl: str) -> str:
    return _cap(repl) if found[:1].isupper() else repl


def _lower_first(text: str) -> str:
    # keep acronyms ("AP", "PICC") as written
    return text if text[:2].isupper() else text[:1].lower() + text[1:]


def is_negated(sentence: str) -> bool:
    """Whether the sentence carries one of the negation cues that :func:`negate` removes."""
    return any(p.search(sentence.strip()) for p, _ in _CUES)


def negate(sentence: str) -> str | None:
    """The sentence with its polarity flipped, or None (mixed/hedged polarity, or no words)."""
    text = " ".join(str(sentence).split())
    end = _END.search(text)
    stop = "." if end and "." in end.group(0) else ""
    body = text[: end.start()] if end else text
    if not re.search(r"[A-Za-z]{2,}", body) or _MIXED.search(body):
        return None
    if sum(len(p.findall(body)) for p, _ in _CUES[2:]) > 1:
        return None  # two cues ("without X and without Y"): flipping one leaves the sentence mixed
    for pattern, repl in _CUES:
        m = pattern.search(body)
        if m is None:
            continue
        if repl is None:
            out = body[: m.start()] + body[m.end():]
        else:
            out = body[: m.start()] + m.expand(repl) + body[m.end():]
        out = " ".join(out.split())
        return _cap(out) + stop if re.search(r"[A-Za-z]{2,}", out) else None
    for pattern, repl in _LEXICAL:
        if pattern.search(body):
            out = pattern.sub(lambda m: _same_case(m.group(0), repl), body, count=1)
            return _cap(" ".join(out.split())) + stop
    if _THERE_IS.search(body):
        out = _THERE_IS.sub(r"\1 no ", body, count=1)
    elif _COPULA.search(body):
        out = _COPULA.sub(r"\1 not", body, count=1)
    else:
        out = "No " + _lower_first(body)
    return _cap(" ".join(out.split())) + stop


__all__ = ["is_negated", "negate"]
