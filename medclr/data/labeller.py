"""A CheXpert-style rule labeller: CheX5 labels (1 positive, 0 negative, -1 uncertain, NaN not mentioned) read
from a report's own sentences, for corpora that come without labels (`medclr label`, and `medclr eval`'s
zero-shot task when a manifest has none).

Per class, every sentence that mentions the finding (``medclr.data.hard_negatives.FINDINGS``, the cues the
hard negatives and the eta calibration already use) is a mention with the sentence's polarity
(``hard_negatives.polarity``): a clean statement is positive, a clean negation ("No pneumothorax.", "There is
no pleural effusion.") negative, a hedged or mixed one ("Possible small effusion.", "No change in the
effusion.") uncertain. "Heart size is normal." is a negative mention of cardiomegaly without naming it. The
report's label follows CheXpert's aggregation: positive if any mention is positive, else uncertain if any is,
else negative if any is, else not mentioned.

Why rules of our own: CheXpert's labeller (NegBio, Java/Python 2 era) and CheXbert (a BERT model with weights
to download) are neither installable offline nor kept up; the cues chest reports use for these five findings
are few, and the same cues already decide the hard negatives, so one reading of "what a sentence states"
serves training and evaluation. Agreement with the phantom's truth is tested (tests/test_labeller.py) and
measured by `medclr label --truth` (:func:`agreement`; docs/evaluation.md section 3).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from medclr.data.hard_negatives import FINDINGS, calls_heart_normal
from medclr.data.labels import CHEX5

# CheX5 class -> the FINDINGS entry that mentions it, and the further phrasings reports use for it (a labeller
# needs them, a sentence rewrite does not: "enlarged cardiac silhouette", "CHF", "blunting of the costophrenic
# angle" are how reports state these findings without naming them).
CLASS_FINDING = {"Cardiomegaly": "cardiomegaly", "Edema": "edema", "Pleural Effusion": "pleural effusion",
                 "Pneumonia": "pneumonia", "Pneumothorax": "pneumothorax"}
_MORE = {
    "Cardiomegaly": r"\benlarged (?:heart|cardiac)\b|"
                    r"\b(?:heart|cardiac silhouette|cardiac contour)\b[^.;]{0,45}\b(?:enlarged|large)\b|"
                    r"\bcardiac enlargement\b|\benlargement of the (?:heart|cardiac (?:silhouette|contour))\b|"
                    r"\bborderline (?:heart|cardiac)\b|\bupper limits? of normal heart\b|"
                    r"\b(?:heart|cardiac)\b[^.;]{0,40}\b(?:top normal|upper limits? (?:of )?normal|borderline)\b",
    "Edema": r"\bchf\b|\bcongestive heart failure\b|\bcongesti(?:on|ve)\b|\bfluid overload\b|\bcephalization\b|"
             r"\bvascular (?:prominence|indistinctness|engorgement)\b|\bindistinct\w* (?:pulmonary )?vascula\w+|"
             r"\bincreased (?:pulmonary |interstitial )?(?:vascula\w+|interstitial markings)\b|"
             r"\bvascula\w+ (?:markings )?(?:is|are) (?:\w+ )?(?:prominent|increased)\b|"
             r"\bprominen(?:t|ce)\b[^.;]{0,25}\bvascula\w+|\b(?:pulmonary|vascula\w+|vessels)\b[^.;]{0,25}\bengorged\b",
    "Pleural Effusion": r"\bpleural fluid\b|\bcostophrenic\b[^.;]{0,25}\bblunt(?:ing|ed)\b|"
                        r"\bblunt(?:ing|ed)\b[^.;]{0,40}\bcostophrenic\b",
    "Pneumonia": r"\bpneumonias?\b|\bpneumonitis\b",
    "Pneumothorax": r"\bpleural air\b",
}
# NegEx (Chapman et al. 2001): a cue before the mention negates it unless a terminator stands between them
# ("No effusion or pneumothorax." negates both; "Cardiomegaly without edema." negates only edema); a cue after
# it ("... is not seen") negates it; a hedge anywhere in its sentence makes it uncertain.
_NEG_BEFORE = re.compile(r"\b(?:no|not|without|negative for|free of|clear of|absence of|resolved|resolution of)\b",
                         re.IGNORECASE)
_TERMINATE = re.compile(r"\b(?:but|however|although|though|with|which|aside|except|apart|other than)\b|[;:]",
                        re.IGNORECASE)
_NEG_AFTER = re.compile(r"^[^.;]{0,20}?\b(?:(?:is|are|was|were|has|have been)\s+)?(?:not\s+(?:seen|identified|present|"
                        r"visualized|appreciated|evident|demonstrated|noted)|absent|resolved)\b", re.IGNORECASE)
_HEDGE = re.compile(r"\b(?:possibl[ey]|probabl[ey]|may|might|could|likely|suspect\w*|questionabl[ey]|question of|"
                    r"concern\w*|cannot be (?:excluded|ruled out)|cannot exclude|not excluded|versus|vs|borderline|"
                    r"upper limits? (?:of )?normal|top normal|equivocal|suggest\w*|suspicious|differential|consideration)\b",
                    re.IGNORECASE)
_VALUE = {"+": 1.0, "?": -1.0, "-": 0.0}
# a hit of the shared finding pattern that names another finding: a pericardial effusion is not a pleural one
_OTHER_FINDING = {"Pleural Effusion": re.compile(r"\bpericardial\s+$", re.IGNORECASE)}


def _patterns(cls: str) -> list[re.Pattern[str]]:
    return [FINDINGS[CLASS_FINDING[cls]][0], re.compile(_MORE[cls], re.IGNORECASE)]


def mention(sentence: str, cls: str) -> float | None:
    """The sentence's label for ``cls`` (1, 0, -1), or None when it does not mention the finding: its first
    mention's polarity, negation scoped NegEx-style (a cue before it with no terminator between, or a cue
    right after it), uncertainty by a hedge anywhere in the sentence."""
    text = " ".join(str(sentence).split())
    other = _OTHER_FINDING.get(cls)
    hits = [m for p in _patterns(cls) for m in p.finditer(text) if not (other and other.search(text[: m.start()]))]
    if not hits:
        return 0.0 if cls == "Cardiomegaly" and calls_heart_normal(text) else None
    values = []
    for m in hits:
        before = text[: m.start()]
        cue = next(reversed(list(_NEG_BEFORE.finditer(before))), None)  # the last cue before the mention
        negated = ((cue is not None and not _TERMINATE.search(before[cue.end():])) or bool(_NEG_AFTER.match(text[m.end():]))
                   or bool(_NEG_BEFORE.search(m.group(0))))  # "The heart is not enlarged."
        values.append(0.0 if negated else (-1.0 if _HEDGE.search(text) else 1.0))
    return next(v for v in (1.0, -1.0, 0.0) if v in values)


def label_report(sentences: Sequence[str], classes: Sequence[str] = CHEX5) -> dict[str, float]:
    """{class: 1.0 | 0.0 | -1.0 | nan} for one report, CheXpert's aggregation over its mentions."""
    out = {}
    for cls in classes:
        found = {m for s in sentences if (m := mention(s, cls)) is not None}
        out[cls] = next((v for v in (1.0, -1.0, 0.0) if v in found), math.nan)
    return out


def label_manifest(manifest, classes: Sequence[str] = CHEX5, overwrite: bool = False):
    """(manifest with the rule labels in the ``classes`` columns, the classes it filled): a column that holds
    any label already is kept unless ``overwrite``."""
    import numpy as np

    unknown = [c for c in classes if c not in CLASS_FINDING]
    if unknown:
        from medclr.errors import MedclrError

        raise MedclrError(f"the rule labeller reads {', '.join(CLASS_FINDING)}; not {', '.join(unknown)}")
    df = manifest.copy()
    fill = [c for c in classes if overwrite or c not in df or df[c].isna().all()]
    if fill:
        rows = [label_report(list(s) if s is not None else [], fill) for s in df["sentences"]]
        for c in fill:
            df[c] = np.array([r[c] for r in rows], dtype=np.float64)
    return df, fill


#: how the readers of a labelled manifest say where rule labels came from (`medclr eval`'s note, training's log
#: and the findings record of a checkpoint validated on them)
RULES_NOTE = "read from each report by medclr's rule labeller (`medclr label`; 1 stated, 0 negated, -1 hedged)"


def labels_or_rules(manifest, classes: Sequence[str] = CHEX5):
    """(manifest, the classes read by rules): the manifest as it is when any of ``classes`` holds a label (or it has
    no ``sentences``), else every class read from its reports (:func:`label_manifest`). The one rule for rows that
    come without labels: `medclr eval` (a corpus without labels) and training's validation (a validation split
    without labels) both apply it, so a checkpoint's findings record and its evaluation read the same labels."""
    if "sentences" not in manifest or any(c in manifest and manifest[c].notna().any() for c in classes):
        return manifest, []
    return label_manifest(manifest, classes)


_VALUE_NAMES = (("1", 1.0), ("0", 0.0), ("-1", -1.0))


def value_counts(values) -> dict[str, int]:
    """{"1", "0", "-1", "blank": how many} of one label column."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    return {name: int((v == x).sum()) for name, x in _VALUE_NAMES} | {"blank": int(np.isnan(v).sum())}


def agreement(rules, truth, classes: Sequence[str]) -> dict[str, dict]:
    """Per class, the rules' labels against a truth's on the same rows: how often they agree on whether the report
    states the finding (1 against 0, -1 or blank, CheXpert's positive call), Cohen's kappa of that call (None when
    both call every report alike: kappa is undefined), and what the rules called the truth's positives."""
    import warnings

    import numpy as np
    from sklearn.exceptions import UndefinedMetricWarning
    from sklearn.metrics import cohen_kappa_score

    out = {}
    for c in classes:
        r, t = rules[c].to_numpy(np.float64), truth[c].to_numpy(np.float64)
        called, stated = r == 1, t == 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            kappa = float(cohen_kappa_score(stated, called, labels=[False, True]))
        out[c] = {"agreement": float(np.mean(called == stated)), "kappa": None if math.isnan(kappa) else kappa,
                  "n_pos_truth": int(stated.sum()), "n_pos_rules": int(called.sum()),
                  "truth_pos_called": value_counts(r[stated])}
    return out
