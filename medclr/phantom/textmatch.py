"""Which findings a report sentence states, negates, and on which side.

Small, explicit rules (keyword patterns per canonical finding, a negation scope
that ends at the clause, side words) are enough here: they only have to link
the Open-i sentences to the MeSH terms that the indexers already attached to
the same report, and pick real sentences for composed reports.
"""

from __future__ import annotations

import re
from functools import cache

# canonical finding -> pattern of a mention (lower-case text)
KEYWORDS: dict[str, str] = {
    "cardiomegaly": r"cardiomegaly|(?:heart|cardiac|cardiomediastinal|cardiopericardial)\b[^.;]{0,40}?"
    r"\b(?:enlarg\w*|large|prominen\w*|increased|upper limits? of normal|top normal|borderline)|"
    r"(?:enlarg\w*|large|borderline|prominent) (?:heart|cardiac|cardiomediastinal)|cardiac enlargement|"
    r"(?:enlargement|increase in size) of the (?:heart|cardiac)",
    "pleural_effusion": r"(?<!pericardial )effusion|blunt\w*|pleural fluid|meniscus|hydropneumothora\w*|"
    r"air[- ]fluid level",
    "pneumothorax": r"pneumothora\w*|(?:pleural )?air collection",
    "edema": r"edema|congesti\w*|\bchf\b|heart failure|cephaliz\w*|kerley|fluid overload|engorge\w*|"
    r"venous hypertension|vascular prominence|prominen\w* (?:of the )?(?:central |pulmonary )*vascula\w*|"
    r"vascula\w*[^.;]{0,30}?(?:prominen\w*|increased)|increased (?:lung |pulmonary )?vascularity",
    "pneumonia": r"pneumonia|infecti\w*|pneumonitis",
    "consolidation": r"consolidat\w*",
    "opacity": r"opacit\w*|airspace disease|air space disease|airspace process|infiltrat\w*|densit\w*",
    "atelectasis": r"atelecta\w*|volume loss|collapse",
    "nodule": r"nodul\w*|\bmass\b|granulom\w*|calcified (?:density|densities|focus|foci)|lesion",
    "interstitial": r"interstitial|fibros\w*|fibrotic|reticul\w*|bronchiectasis",
    "vascular_prominence": r"vascula\w*|bronchovascular|markings|hil(?:um|a|ar)\b[^.;]{0,30}?prominen",
    "scarring": r"scar\w*|cicatri\w*|fibrotic|linear|strand\w*",
    "hyperinflation": r"hyperinfla\w*|hyperexpan\w*|hyperlucen\w*|emphysem\w*|\bcopd\b|obstructive|flatten\w*|"
    r"overinfla\w*|hyperaera\w*|hyperdisten\w*|large lung volumes|bull(?:a|ae|ous)\b",
    "hypoinflation": r"low lung volumes?|hypoinfla\w*|low volumes?|(?:poor|shallow|low) inspiration|hypoventil\w*|"
    r"volumes are (?:low|decreased|diminished)|decreased lung volumes?|underinfla\w*|lung volumes? (?:is|are) low",
    "elevated_hemidiaphragm": r"elevat\w*|eventration",
    "tortuous_aorta": r"tortu\w*|ectati\w*|unfold\w*|aneurysm\w*|(?:aorta|aortic)\b[^.;]{0,30}?(?:enlarg\w*|dilat\w*)",
    "aortic_calcification": r"calcif\w*|atheroscl\w*|atheromatous",
    "calcified_nodes": r"calcif\w*|lymph nodes?",
    "scoliosis": r"scolio\w*|curvature",
    "degenerative_spine": r"degenerat\w*|spondyl\w*|osteophyt\w*|arthrit\w*|spurring|\bdjd\b|\bdish\b|hyperostosis",
    "fracture": r"fractur\w*|deformit\w*",
    "central_line": r"catheter|\bline\b|\bport\b|\bpicc\b|\bcvc\b|central venous|"
    r"\btips?\b[^.;]{0,40}?(?:\bsvc\b|cavoatrial|caval|atri\w*|vena cava)",
    "tube": r"\btube\b|endotracheal|nasogastric|enteric",
    "pacemaker": r"pacemaker|pacer|defibrillat\w*|\baicd\b|\bicd\b|generator|cardiac device|\bleads?\b|"
    r"stimulator",
    "sternotomy": r"sternotomy|sternal|\bwires?\b|\bcabg\b|bypass",
    "surgical_clips": r"clips?\b|surgical|staples?|sutures?|stents?|foreign bod\w*|hardware|metallic|valve|"
    r"prosthe\w*|device",
    "hiatal_hernia": r"hiatal|hernia",
    "pleural_thickening": r"thicken\w*|pleural (?:plaque|scar)|apical cap",
    "mediastinal_widening": r"\bmediastin\w*\b[^.;]{0,40}?(?:wid\w*|promin\w*|enlarg\w*)|"
    r"(?:wid\w*|promin\w*|enlarg\w*|convexity)[^.;]{0,30}?\bmediastin|mediastinal (?:adenopathy|lymphadenopathy)",
    "technical": r"technique|quality|rotat\w*|limited|exposure|penetrat\w*|motion|suboptimal|inspiratory effort",
}
# sentences that negate a CheX5 finding without naming its keyword (a normal heart)
NORMAL_HEART = re.compile(
    r"(?:heart|cardiac|cardiomediastinal|cardiopericardial)[^.;]{0,60}?\b(?:normal|within normal limits|"
    r"unremarkable|not enlarged|stable)\b|\bno cardiomegaly\b"
)

# strong cues negate across commas ("no consolidation, effusion, or pneumothorax"); weak ones only
# within their comma-delimited segment ("heart normal, mild aortic tortuosity" asserts the tortuosity)
_NEG_CUE = re.compile(r"\b(?:no|without|negative for|free of|absence of|absent|rather than|nor|neither|ruled out)\b")
_WEAK_NEG = re.compile(r"\b(?:not|resolved|resolution of|clear of|removed|exclude[sd]?|normal|clear|unremarkable|"
                       r"interval removal)\b")
_HEDGE = re.compile(r"\b(?:cannot be excluded|can not be excluded|cannot exclude|could not be excluded|not excluded|"
                    r"may|might|possibl\w*|question\w*|suspect\w*|concern\w*|differential)\b")
_CLAUSE = re.compile(r"[;:]|,?\s+\b(?:but|however|although|though|while|whereas|which|except(?: for)?|apart from|"
                     r"other than|with (?:a |an )?(?:small|mild|moderate|large|new|stable|persistent|minimal|left|right|"
                     r"bilateral))\b")
# negation after the mention: "pneumothorax is not seen", "the effusion has resolved"
_POST_NEG = re.compile(r"^[^,]{0,40}?\b(?:(?:is|are|was|were) (?:not|no longer)|not (?:seen|identified|present|"
                       r"visualized|demonstrated|evident|appreciated)|(?:has|have) resolved|resolved|absent|removed)\b")
_SIDE_WORDS = {
    "left": re.compile(r"\bleft\b|\blt\b|\blingula\w*"),
    "right": re.compile(r"\bright\b|\brt\b|\bright middle lobe\b"),
    "bilateral": re.compile(r"\bbilateral\w*|\bboth\b|\bbibasilar\b|\bbibasal\b|\bbiapical\b|\bbilat\b"),
}


@cache
def _pattern(name: str) -> re.Pattern:
    return re.compile(KEYWORDS[name])


def _clauses(text: str) -> list[str]:
    return [c for c in _CLAUSE.split(text) if c and c.strip()]


def mention_state(sentence: str, name: str) -> str:
    """'' (no mention), 'pos', 'neg' or 'hedge' for canonical finding ``name`` in one sentence."""
    text = sentence.lower()
    state = ""
    for clause in _clauses(text):
        for match in _pattern(name).finditer(clause):
            before = clause[: match.start()]
            negated = (_NEG_CUE.search(before) is not None or _WEAK_NEG.search(before.split(",")[-1]) is not None
                       or _POST_NEG.search(clause[match.end():]) is not None
                       or re.search(r"\b(?:not|no)\b", match.group(0)) is not None)  # "heart is not enlarged"
            if negated:
                state = state or "neg"
                continue
            return "hedge" if _HEDGE.search(clause) else "pos"
    if name == "cardiomegaly" and not state and NORMAL_HEART.search(text):
        return "neg"
    return state


def positives(sentence: str, names=None) -> set[str]:
    """Canonical findings the sentence asserts (positive or hedged)."""
    names = KEYWORDS if names is None else names
    return {n for n in names if mention_state(sentence, n) in ("pos", "hedge")}


def negations(sentence: str, names) -> set[str]:
    return {n for n in names if mention_state(sentence, n) == "neg"}


def sentence_side(sentence: str) -> str:
    """'left', 'right', 'bilateral', '' (none) or 'mixed' from side words (plural effusions count as bilateral)."""
    text = sentence.lower()
    found = {side for side, pat in _SIDE_WORDS.items() if pat.search(text)}
    if re.search(r"\beffusions\b", text) and not ({"left", "right"} & found):
        found.add("bilateral")
    if "bilateral" in found:
        return "bilateral"
    if found == {"left", "right"}:  # "left effusion, no right effusion": ambiguous without parsing
        return "mixed"
    if len(found) == 1:
        return found.pop()
    return "mixed" if found else ""


_SWAP = re.compile(r"\b(left|right|Left|Right|LEFT|RIGHT)\b")
_SWAP_TO = {"left": "right", "right": "left", "Left": "Right", "Right": "Left", "LEFT": "RIGHT", "RIGHT": "LEFT"}


def swap_sides(sentence: str) -> str:
    """The mirror sentence (left <-> right); used to fill sparse side banks (documented)."""
    out = _SWAP.sub(lambda m: _SWAP_TO[m.group(1)], sentence)
    out = re.sub(r"\b([Ll])eft middle lobe", lambda m: "lingula" if m.group(1) == "l" else "Lingula", out)
    if "lingula" in sentence.lower():
        out = re.sub(r"\b[Ll]ingula(?:r)?\b", "right middle lobe", out)
    return out
