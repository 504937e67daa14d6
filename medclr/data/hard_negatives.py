"""Rule rewrites of report sentences: hard negatives (negation, another finding, the other side) and
short forms (:func:`short_form`: "Small left apical pneumothorax." -> "Pneumothorax.", a positive view).

Hard negatives come in three kinds, each a sentence that states something the image does not show:

* ``negation`` (:func:`negate`): the same sentence with its polarity flipped;
* ``finding`` (:func:`swap_finding`): a stated finding replaced by one the report does not state
  ("Small left pleural effusion." -> "Small left pneumothorax."), so the text tower must tell the
  findings apart, not only "something abnormal" from "normal";
* ``side`` (:func:`swap_side`): left and right exchanged where the report states one side only
  ("Small left pleural effusion." -> "Small right pleural effusion."), which only a model that
  looks at the right place can get right.

:func:`hard_negatives` makes the list for one drawn sentence of one report. :func:`meaning_key` reads the same
cues into a label-free key of what a sentence states (polarity, finding, side), the target ``medclr.lm.eta_fit``
calibrates eta_LM to.

``negate(sentence)`` returns a sentence of the opposite polarity ("Small left pleural effusion." ->
"No small left pleural effusion."; "There is no pneumothorax." -> "There is pneumothorax.") or None
when the sentence's polarity is mixed or hedged, so its negation would not be a clean opposite.

Negation. Why rules and not a model: training pairs each image with one sentence of its report, and the
text tower must learn that the stated sentence fits the image better than its opposite
(NegCLIP, Yuksekgonul et al., ICLR 2023, made such hard negatives from captions by swapping words;
radiology needs the negation itself). The cues radiology reports use are few and regular (NegEx,
Chapman et al. 2001: "no", "without", "not", "negative for", "free of", "clear of"), and no kept
library rewrites a sentence into its opposite (negspacy, pyConText detect negation, they do not
produce it). The grammar is small, readable, and tested on the phrases reports and the
zero-shot prompts use (tests/test_hard_negatives.py).

Rules, first match wins:

1. Mixed or hedged polarity -> None: a contrast ("but", "however", "although", "except"), an
   uncertainty cue ("may", "possible", "cannot exclude", ...), a recommendation, a change statement
   ("no change", "unchanged", "no longer", "resolved"), or two negation cues ("without X and
   without Y"): flipping one cue would not flip the whole meaning.
2. Negated -> stated: drop the cue. "No X" -> "X"; "There is no X" -> "There is X";
   "X is not seen" -> "X is seen"; "without X" -> "with X"; "negative for X" -> "positive for X";
   "free of X" -> "with X"; "The lungs are clear of X" -> "The lungs show X".
3. Stated -> negated: the word pairs "within/outside normal limits" and "normal/abnormal" swap
   ("Heart size normal" -> "Heart size abnormal");
   "There is/are (a|an) X" -> "There is/are no X"; a copula ("is", "are", "was", "were") gets
   "not"; otherwise "No " + the sentence ("Cardiomegaly." -> "No cardiomegaly.").
"""

from __future__ import annotations

import re
from functools import lru_cache

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
            out = pattern.sub(lambda m, repl=repl: _same_case(m.group(0), repl), body, count=1)
            return _cap(" ".join(out.split())) + stop
    if _THERE_IS.search(body):
        out = _THERE_IS.sub(r"\1 no ", body, count=1)
    elif _COPULA.search(body):
        out = _COPULA.sub(r"\1 not", body, count=1)
    else:
        out = "No " + _lower_first(body)
    return _cap(" ".join(out.split())) + stop


# finding -> (its mention, the words a swap writes); the findings a chest report names most, CheX5
# first. Our own short list (not medclr.phantom's report rules: the phantom composes and labels
# reports with those, and nothing that trains may lean on how the phantom labels).
FINDINGS: dict[str, tuple[re.Pattern[str], str]] = {
    "pleural effusion": (re.compile(r"\b(?:pleural\s+)?effusions?\b", re.IGNORECASE), "pleural effusion"),
    "pneumothorax": (re.compile(r"\bpneumothora(?:x|ces)\b", re.IGNORECASE), "pneumothorax"),
    "edema": (re.compile(r"\b(?:pulmonary\s+|interstitial\s+)?edema\b|\bvascular\s+congestion\b", re.IGNORECASE),
              "pulmonary edema"),
    "cardiomegaly": (re.compile(r"\bcardiomegaly\b|\b(?:heart|cardiac silhouette)(?: size)? is (?:\w+ )?enlarged\b",
                                re.IGNORECASE), "cardiomegaly"),
    "pneumonia": (re.compile(r"\bpneumonia\b", re.IGNORECASE), "pneumonia"),
    "consolidation": (re.compile(r"\bconsolidations?\b", re.IGNORECASE), "consolidation"),
    "atelectasis": (re.compile(r"\batelectasis\b", re.IGNORECASE), "atelectasis"),
    "opacity": (re.compile(r"\bopacit(?:y|ies)\b", re.IGNORECASE), "opacity"),
    "nodule": (re.compile(r"\bnodules?\b", re.IGNORECASE), "nodule"),
}
_SIDES = {"left": re.compile(r"\bleft\b", re.IGNORECASE), "right": re.compile(r"\bright\b", re.IGNORECASE)}
_BOTH_SIDES = re.compile(r"\b(?:bilateral\w*|both|bibasilar|bibasal)\b", re.IGNORECASE)
KINDS = ("negation", "finding", "side")


def _states(sentence: str) -> bool:
    """A clean statement: neither negated nor of mixed/hedged polarity."""
    return not is_negated(sentence) and negate(sentence) is not None


def states_finding(sentence: str) -> bool:
    """Whether the sentence names a finding of :data:`FINDINGS` and states it (not negated, not hedged)."""
    return any(p.search(sentence) for p, _ in FINDINGS.values()) and _states(sentence)


def stated_findings(report: list[str]) -> set[str]:
    """The findings of :data:`FINDINGS` that some sentence of the report states (:func:`states_finding`)."""
    return {f for sentence in report if states_finding(sentence) for f, (p, _) in FINDINGS.items()
            if p.search(sentence)}


def _stated(report: list[str]) -> tuple[set[str], set[str]]:
    """(findings, sides) that some sentence of the report states or leaves ambiguous (kept off-limits)."""
    findings, sides = set(), set()
    for sentence in report:
        if is_negated(sentence) and negate(sentence) is not None:
            continue  # cleanly negated: "No pneumothorax." states nothing
        findings |= {f for f, (p, _) in FINDINGS.items() if p.search(sentence)}
        sides |= {side for side, p in _SIDES.items() if p.search(sentence)}
        if _BOTH_SIDES.search(sentence):
            sides |= set(_SIDES)
    return findings, sides


def swap_finding(sentence: str, report: list[str], pick) -> str | None:
    """The sentence with its one named finding replaced by a finding the report does not state
    (``pick(n)`` chooses among the n candidates), or None."""
    found = [f for f, (p, _) in FINDINGS.items() if p.search(sentence)]
    if len(found) != 1 or not _states(sentence):
        return None
    stated, _ = _stated(report)
    targets = [f for f in FINDINGS if f not in stated and f != found[0]]
    if not targets:
        return None
    words = FINDINGS[targets[pick(len(targets))]][1]
    return FINDINGS[found[0]][0].sub(lambda m: _same_case(m.group(0), words), " ".join(sentence.split()), count=1)


def swap_side(sentence: str, report: list[str]) -> str | None:
    """The sentence with left and right exchanged, when it names one side and the report states the
    other side nowhere (and no bilateral finding); else None."""
    named = [side for side, p in _SIDES.items() if p.search(sentence)]
    if len(named) != 1 or _BOTH_SIDES.search(sentence) or not _states(sentence):
        return None
    other = "right" if named[0] == "left" else "left"
    if other in _stated(report)[1]:
        return None
    return _SIDES[named[0]].sub(lambda m: _same_case(m.group(0), other), " ".join(sentence.split()))


# Words an item of a negated list may hold beside its finding for "No X, Y or Z." to entail "No X.":
# "No large pneumothorax." does not entail "No pneumothorax.", so an item with another word stays whole.
_LIST_WORDS = frozenset(
    "no there is are was were evidence of for sign signs seen identified visible visualized visualised apparent "
    "evident demonstrated present noted not the a an".split())
_LIST_SPLIT = re.compile(r",|;|\b(?:or|and|nor)\b", re.IGNORECASE)


def short_form(sentence: str, pick=lambda n: 0) -> str | None:
    """The shortest sentence ``sentence`` entails about one finding it names, or None.

    A clean statement naming one finding becomes that finding's mention ("Small left apical
    pneumothorax." -> "Pneumothorax."): dropping a stated finding's modifiers keeps it true. A clean
    negation becomes "No " + one finding of its list that stands alone in its item (``pick(n)``
    chooses): "No focal consolidation, pleural effusion, or pneumothorax." -> "No pneumothorax." or
    "No pleural effusion.", never "No consolidation." Reports state and deny findings at length;
    zero-shot prompts ("Pneumothorax" / "No pneumothorax", the paper's Table 2) are a few words, a
    form the text tower otherwise rarely sees paired with an image.
    """
    text = " ".join(str(sentence).split())
    found = [m for pattern, _ in FINDINGS.values() if (m := pattern.search(text))]
    if not found:
        return None
    if is_negated(text):
        if negate(text) is None:
            return None
        alone = []
        for item in _LIST_SPLIT.split(_END.sub("", text)):
            for pattern, _ in FINDINGS.values():
                m = pattern.search(item)
                if m is None or is_negated(m.group(0)):  # not "heart is not enlarged"
                    continue
                if not set(re.findall(r"[a-z]+", (item[:m.start()] + item[m.end():]).lower())) - _LIST_WORDS:
                    alone.append(m.group(0))
        return "No " + _lower_first(alone[pick(len(alone))]) + "." if alone else None
    if len(found) != 1 or not _states(text):
        return None
    return _cap(found[0].group(0)) + "."


def short_forms(sentence: str) -> list[str]:
    """Every sentence :func:`short_form` may replace ``sentence`` with (one per ``pick``), in pick order."""
    choices = []
    first = short_form(sentence, pick=lambda n: (choices.append(n), 0)[1])
    if first is None:
        return []
    return [first] + [short_form(sentence, pick=lambda n, i=i: i) for i in range(1, choices[0] if choices else 1)]


# Words that do not change what a sentence states about the chest ("The lungs are clear." = "Lungs clear.").
_FILLER = frozenset(
    "the a an is are was were be been being there of and or with in on at to for this that these those as by from "
    "its it has have had seen noted identified present visualized visualised demonstrated evident again also both "
    "appear appears appearing otherwise which within".split())
_NORMAL_WORDS = re.compile(r"\b(?:normal|clear|unremarkable|intact|negative|no acute|within normal limits)\b",
                           re.IGNORECASE)
# "Heart size is normal." says there is no cardiomegaly without naming it
_NORMAL_HEART = re.compile(r"\b(?:heart|cardiac|cardiomediastinal)\b[^.;]*\b(?:normal|unremarkable|within normal limits|"
                           r"not enlarged)\b", re.IGNORECASE)


def polarity(sentence: str) -> str:
    """"+" a clean statement, "-" cleanly negated, "?" hedged or of mixed polarity (rule 1 above)."""
    if is_negated(sentence):
        return "-" if negate(sentence) is not None else "?"
    return "+" if _states(sentence) else "?"


def calls_heart_normal(sentence: str) -> bool:
    """"Heart size is normal.": no cardiomegaly, said without naming it (and without a hedge)."""
    return bool(_NORMAL_HEART.search(sentence)) and not _MIXED.search(sentence)


@lru_cache(maxsize=65536)
def meaning_key(sentence: str) -> str:
    """A label-free key of what a sentence states, read from its words: equal keys for paraphrases.

    * a sentence naming findings of :data:`FINDINGS`: its polarity ("+" stated, "-" cleanly negated, "?"
      hedged or mixed), the sorted findings and, for a statement, the one side it names
      ("+pleural effusion:left", "-pleural effusion|pneumothorax");
    * a sentence naming none that calls the heart normal ("Heart size is normal."): ``-cardiomegaly``;
    * a sentence naming none that says something else is normal ("The lungs are clear.", "No acute
      cardiopulmonary process."): ``normal``, the pooled normal statement (a rule labeller's "No Finding");
    * anything else: ``~`` and its sorted content words ("~sternotomy wire"), so only paraphrases with
      the same words meet.

    What ``medclr lm score`` calibrates eta_LM to (the frequency of the key among training pairs,
    ``medclr.data.pairs.key_frequency``): no label enters, only the report's own words."""
    text = " ".join(str(sentence).split())
    found = sorted(f for f, (p, _) in FINDINGS.items() if p.search(text))
    if found:
        sign = polarity(text)
        named = [side for side, p in _SIDES.items() if p.search(text)]
        side = f":{named[0]}" if sign == "+" and len(named) == 1 and not _BOTH_SIDES.search(text) else ""
        return sign + "|".join(found) + side
    if calls_heart_normal(text):
        return "-cardiomegaly"
    if _NORMAL_WORDS.search(text) and not _MIXED.search(text):
        return "normal"
    words = {w[:-1] if w.endswith("s") and len(w) > 4 else w for w in re.findall(r"[a-z]+", text.lower())}
    return "~" + " ".join(sorted(w for w in words if len(w) > 2 and w not in _FILLER))


def hard_negatives(sentence: str, report: list[str], kinds=KINDS, pick=lambda n: 0) -> list[str]:
    """The hard negative texts of ``sentence`` (drawn from ``report``), in ``kinds`` order, each
    different from every sentence of the report."""
    bad = set(kinds) - set(KINDS)
    if bad:
        raise ValueError(f"hard negative kinds {sorted(bad)}: expected some of {', '.join(KINDS)}")
    made = {"negation": lambda: negate(sentence), "finding": lambda: swap_finding(sentence, report, pick),
            "side": lambda: swap_side(sentence, report)}
    own = {" ".join(s.split()).lower() for s in report}
    out = []
    for kind in kinds:
        text = made[kind]()
        if text is not None and " ".join(text.split()).lower() not in own:
            out.append(text)
    return out


__all__ = ["FINDINGS", "KINDS", "hard_negatives", "is_negated", "meaning_key", "negate", "short_form",
           "stated_findings", "states_finding", "swap_finding", "swap_side"]
