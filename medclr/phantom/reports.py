"""Report text: banks of real Open-i sentences, composed reports, and the MIMIC-style report file.

Banks (built once with the material): for every canonical finding and stated
side, the real Open-i sentences that assert that finding and nothing else
(``positive``); sentences that only negate CheX5 findings, keyed by the set
they negate (``negative``); normal sentences and normal impressions. Sparse
side banks are filled with the mirror sentence (left <-> right), so every
lateral finding in a composed report names its side.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np

from medclr.phantom import textmatch as tm, vocab as V

CHEX5_NAMES = ("cardiomegaly", "edema", "pleural_effusion", "pneumonia", "pneumothorax")
# findings a bank sentence may also mention without stating a new finding (shared keywords)
TOLERATE = {
    "nodule": {"opacity", "calcified_nodes"}, "calcified_nodes": {"nodule", "aortic_calcification", "vascular_prominence"},
    "aortic_calcification": {"calcified_nodes", "tortuous_aorta"}, "tortuous_aorta": {"aortic_calcification"},
    "scarring": {"interstitial", "opacity"}, "interstitial": {"scarring", "vascular_prominence", "opacity"},
    "pleural_thickening": {"scarring"}, "edema": {"vascular_prominence", "interstitial"},
    "vascular_prominence": {"interstitial"}, "sternotomy": {"surgical_clips"}, "surgical_clips": {"sternotomy"},
    "pacemaker": {"surgical_clips", "central_line"}, "central_line": {"surgical_clips", "tube"},
    "tube": {"central_line"}, "hyperinflation": {"opacity"}, "consolidation": {"opacity"},
    "pneumonia": {"opacity", "consolidation"}, "atelectasis": {"opacity"}, "opacity": set(),
    "mediastinal_widening": {"tortuous_aorta"}, "fracture": {"degenerative_spine"},
}
TOPIC = {  # report order: heart/mediastinum, lungs, pleura, devices, bones
    "cardiomegaly": 0, "mediastinal_widening": 0, "tortuous_aorta": 0, "aortic_calcification": 0,
    "calcified_nodes": 1, "hiatal_hernia": 0, "edema": 1, "vascular_prominence": 1, "pneumonia": 1,
    "consolidation": 1, "opacity": 1, "atelectasis": 1, "nodule": 1, "interstitial": 1, "scarring": 1,
    "hyperinflation": 1, "hypoinflation": 1, "elevated_hemidiaphragm": 1, "pleural_effusion": 2,
    "pneumothorax": 2, "pleural_thickening": 2, "central_line": 3, "tube": 3, "pacemaker": 3, "sternotomy": 3,
    "surgical_clips": 3, "fracture": 4, "degenerative_spine": 4, "scoliosis": 4, "technical": 5,
}
_GLOBAL_NORMAL = re.compile(r"\b(?:clear|normal|unremarkable|acute|active|intact|negative|abnormalit\w*|disease|"
                            r"process|findings?)\b", re.I)
_HEDGE_OR_HISTORY = re.compile(r"\b(?:may|might|possib\w*|cannot|could|suggest\w*|compar\w*|prior|previous|resolv\w*|"
                               r"interval|since|again|unchanged|stable|recommend\w*|ct\b|followup|follow-up)\b", re.I)
_JUNK = re.compile(r"&\w+;|[\[\]<>{}]|^[^A-Za-z0-9]|\b(?:exclude\w*|difficult|lateral view|however|images?)\b", re.I)
_CHEST = re.compile(r"\b(?:lungs?|heart|cardiac|cardiomediastinal|mediastin\w*|pleura\w*|bon[ey]\w*|osseous|"
                    r"thora\w*|pulmonary|hil(?:a|ar|um)|silhouette|cardiopulmonary|pneumothorax|effusions?)\b", re.I)
_SIZE_WORDS = (("large", "large"), ("moderate", "moderate"), ("small", "small"), ("trace", "small"), ("tiny", "small"),
               ("minimal", "small"), ("mild", "small"), ("blunting", "small"), ("blunted", "small"))
_SEV_WORDS = (("severe", "severe"), ("marked", "severe"), ("moderate", "moderate"), ("mild", "mild"),
              ("borderline", "borderline"), ("top normal", "borderline"), ("minimal", "mild"))
_ZONE_WORDS = (("apex", "apex"), ("apical", "apex"), ("upper", "upper"), ("lingula", "lingula"),
               ("middle lobe", "middle lobe"), ("midlung", "mid"), ("mid lung", "mid"), ("perihilar", "perihilar"),
               ("hilar", "perihilar"), ("lower", "lower"), ("basilar", "base"), ("base", "base"),
               ("retrocardiac", "lower"), ("diffuse", "diffuse"))


def _stable(sentence: str) -> bool:
    from medclr.data.text import split_sentences

    return sentence[-1:] in (".", "!", "?") and split_sentences(sentence) == [sentence]


def _negative_only(sentence: str, chex: list[str]) -> bool:
    """The sentence negates CheX5 findings and says nothing global ('lungs are clear') that could contradict others."""
    if "pneumonia" in chex and not re.search(r"pneumon", sentence, re.I):
        return False
    if chex == ["cardiomegaly"]:
        return not re.search(r"\blungs?\b|pulmonary|pleura|osseous|bon[ey]", sentence, re.I)
    return not _GLOBAL_NORMAL.search(sentence)


def build_banks(reports: list[dict]) -> dict:
    pos: dict[str, list[str]] = {}
    negs: dict[str, list[str]] = {}
    neg: dict[str, list[list]] = {}
    normal, normal_imp = [], []
    for rep in reports:
        sents, secs = rep["sentences"], rep["sections"]
        is_normal = not rep["findings"]
        for f in rep["findings"]:
            i = f["sentence"]
            if i < 0 or f["name"] not in V.CHEXPERT_OF:
                continue
            s = sents[i]
            extra = tm.positives(s, V.RENDERED) - {f["name"]} - TOLERATE.get(f["name"], set())
            if extra or len(s) > 160 or _HEDGE_OR_HISTORY.search(s) or _JUNK.search(s) or s.startswith("___"):
                continue
            side = tm.sentence_side(s) if f["name"] in V.LATERAL else ""
            if side == "mixed" or (f["name"] in V.LATERAL and not side):
                continue
            pos.setdefault(f"{f['name']}|{side}", []).append(s)
            negs[s] = sorted(tm.negations(s, tm.KEYWORDS))
        for s, sec in zip(sents, secs):
            if len(s) > 140 or "___" in s or _HEDGE_OR_HISTORY.search(s) or _JUNK.search(s) or \
                    len(s.split()) < 3 or not _CHEST.search(s) or tm.positives(s, V.RENDERED):
                continue
            negated = sorted(tm.negations(s, tm.KEYWORDS))
            chex = sorted(set(negated) & set(CHEX5_NAMES))
            if chex and _negative_only(s, chex):
                neg.setdefault(",".join(chex), []).append([s, negated])
            elif is_normal and not negated and sec == "F":
                normal.append(s)
            elif is_normal and sec == "I" and not negated:
                normal_imp.append(s)
    # mirror sentences fill sparse side banks
    for key in list(pos):
        name, side = key.split("|")
        if side in ("left", "right"):
            other = f"{name}|{'right' if side == 'left' else 'left'}"
            if len(set(pos.get(other, []))) < 5:
                mirrored = [tm.swap_sides(s) for s in pos[key] if tm.sentence_side(tm.swap_sides(s)) != side]
                pos.setdefault(other, []).extend(mirrored)
                negs.update({m: sorted(tm.negations(m, tm.KEYWORDS)) for m in mirrored})
    out = {"positive": {}, "negative": {}, "normal": [], "normal_impression": []}
    for key, sents in pos.items():
        uniq = sorted({s for s in sents if _stable(s)})
        if uniq:
            out["positive"][key] = [[s, negs[s]] for s in uniq]
    for key, items in neg.items():
        seen = {}
        for s, negated in items:
            if s not in seen and _stable(s):
                seen[s] = negated
        out["negative"][key] = [[s, seen[s]] for s in sorted(seen)]
    out["normal"] = sorted({s for s in normal if _stable(s)})
    out["normal_impression"] = sorted({s for s in normal_imp if _stable(s)})
    return out


def _attr_from_text(f: dict, sentence: str) -> None:
    low = sentence.lower()
    if f["name"] in ("pleural_effusion", "pneumothorax", "hiatal_hernia"):
        f["size"] = next((v for w, v in _SIZE_WORDS if w in low), f["size"])
    else:
        f["severity"] = next((v for w, v in _SEV_WORDS if w in low), f["severity"])
    f["zone"] = next((v for w, v in _ZONE_WORDS if w in low), f["zone"])


def compose(findings: list[dict], banks: dict, rng: np.random.Generator, indication: str = "") -> dict:
    """Report text for composed findings; sets each finding's ``sentence`` (text) and attributes from it.

    Returns {"findings": [sentences], "impression": [sentences], "negated": [CheXpert names]}.
    """
    present = {f["name"] for f in findings}
    items: list[tuple[int, float, str]] = []
    used: set[str] = set()
    for f in sorted(findings, key=lambda f: TOPIC.get(f["name"], 9)):
        side = f["side"] if f["name"] in V.LATERAL else ""
        options = [s for s, neg in banks["positive"].get(f"{f['name']}|{side}", [])
                   if s not in used and not (set(neg) & present)]
        if not options:
            f["sentence_text"] = ""
            continue
        s = options[int(rng.integers(len(options)))]
        used.add(s)
        f["sentence_text"] = s
        f["side_stated"] = bool(side)
        _attr_from_text(f, s)
        items.append((TOPIC.get(f["name"], 9), float(rng.random()), s))
    absent = [n for n in CHEX5_NAMES if n not in present]
    negated_all: set[str] = set()
    keys = [k for k in banks["negative"] if k]
    while absent:
        fits = [k for k in keys if set(k.split(",")) <= set(absent)]
        usable = []
        for k in fits:
            opts = [s for s, neg in banks["negative"][k] if not (set(neg) & present) and s not in used and
                    not ("mediastin" in s.lower() and present & {"mediastinal_widening", "tortuous_aorta"})]
            if opts:
                usable.append((len(k.split(",")), k, opts))
        if not usable:
            break
        width = max(u[0] for u in usable) if rng.random() < 0.6 else min(u[0] for u in usable)
        pick = [u for u in usable if u[0] == width]
        _, k, opts = pick[int(rng.integers(len(pick)))]
        s = opts[int(rng.integers(len(opts)))]
        used.add(s)
        negated_all |= set(k.split(","))
        absent = [n for n in absent if n not in k.split(",")]
        topic = 0 if k == "cardiomegaly" else (2 if set(k.split(",")) & {"pleural_effusion", "pneumothorax"} else 1)
        items.append((topic, float(rng.random()), s))
    if not findings and banks["normal"]:
        for _ in range(int(rng.integers(1, 3))):
            s = banks["normal"][int(rng.integers(len(banks["normal"])))]
            if s not in used:
                used.add(s)
                items.append((1 if "lung" in s.lower() else 4, float(rng.random()), s))
    items.sort()
    impression: list[str] = []
    if not findings and banks["normal_impression"]:
        impression = [banks["normal_impression"][int(rng.integers(len(banks["normal_impression"])))]]
    negated = {V.CHEXPERT_OF[n] for n in negated_all if V.CHEXPERT_OF.get(n)}
    return {"findings": [s for _, _, s in items], "impression": impression, "negated": sorted(negated)}


def format_report(findings: list[str], impression: list[str], view: str, indication: str = "",
                  comparison: str = "") -> str:
    """A MIMIC-CXR-style plain-text report (wrapped at 78 columns, sections as upper-case headers)."""
    exam = "CHEST (PA AND LAT)" if view == "PA" else "CHEST (PORTABLE AP)"

    def block(text: str) -> str:
        return textwrap.fill(text, width=78, initial_indent=" ", subsequent_indent=" ",
                             break_long_words=False, break_on_hyphens=False)

    lines = [" " * 33 + "FINAL REPORT", f" EXAMINATION:  {exam}", " ",
             f" INDICATION:  {indication.strip() or '___'}", " ", f" COMPARISON:  {comparison.strip() or 'None.'}", " "]
    if findings:
        lines += [" FINDINGS:", " ", block(" ".join(findings)), " "]
    if impression:
        lines += [" IMPRESSION:", " ", block(" ".join(impression)), " "]
    return "\n".join(lines) + "\n"
