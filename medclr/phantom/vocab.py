"""The phantom's finding vocabulary: canonical names, MeSH parsing, label maps, latent classes.

A *finding* is a dict with a fixed set of keys (``FINDING_KEYS``): ``name`` (a
canonical name from ``RENDERED`` or ``other:<mesh head>``), ``side``
(patient side: left/right/bilateral or ''), ``side_stated`` (the text names
the side), ``size``, ``severity``, ``zone``, ``kind`` and ``count``.

The latent class of a study is its normalised finding set: the sorted,
de-duplicated canonical names, with ``:side`` appended for lateralised
findings whose side the report states (``LATERAL``). Size, severity, zone and
kind are recorded but not part of the class. A study without findings is
``normal``.
"""

from __future__ import annotations

import re

from medclr.data.labels import CHEXPERT_LABELS

FINDING_KEYS = ("name", "side", "side_stated", "size", "severity", "zone", "kind", "count")
SIDES = ("left", "right", "bilateral")
NORMAL = "normal"

# canonical name -> CheXpert observation (None: no CheXpert column)
CHEXPERT_OF: dict[str, str | None] = {
    "cardiomegaly": "Cardiomegaly",
    "pleural_effusion": "Pleural Effusion",
    "pneumothorax": "Pneumothorax",
    "edema": "Edema",
    "pneumonia": "Pneumonia",
    "consolidation": "Consolidation",
    "opacity": "Lung Opacity",
    "atelectasis": "Atelectasis",
    "nodule": "Lung Lesion",
    "interstitial": "Lung Opacity",
    "vascular_prominence": None,
    "scarring": None,
    "hyperinflation": None,
    "hypoinflation": None,
    "elevated_hemidiaphragm": None,
    "tortuous_aorta": None,
    "aortic_calcification": None,
    "calcified_nodes": None,
    "scoliosis": None,
    "degenerative_spine": None,
    "fracture": "Fracture",
    "central_line": "Support Devices",
    "tube": "Support Devices",
    "pacemaker": "Support Devices",
    "sternotomy": "Support Devices",
    "surgical_clips": "Support Devices",
    "hiatal_hernia": None,
    "pleural_thickening": "Pleural Other",
    "mediastinal_widening": "Enlarged Cardiomediastinum",
    "technical": None,
}
RENDERED = tuple(CHEXPERT_OF)
DEVICES = ("central_line", "tube", "pacemaker", "sternotomy", "surgical_clips")
LATERAL = frozenset(
    {"pleural_effusion", "pneumothorax", "pneumonia", "consolidation", "opacity", "atelectasis", "nodule",
     "elevated_hemidiaphragm", "fracture", "pleural_thickening", "scarring"}
)
# canonical name -> MS-CXR category_name (the 8 grounding categories)
MSCXR_OF = {
    "atelectasis": "Atelectasis",
    "cardiomegaly": "Cardiomegaly",
    "consolidation": "Consolidation",
    "edema": "Edema",
    "opacity": "Lung Opacity",
    "pleural_effusion": "Pleural Effusion",
    "pneumonia": "Pneumonia",
    "pneumothorax": "Pneumothorax",
}
# Evaluation-set studies per CheX5 class (the test split, medclr.phantom.plan.eval_targets): >= 250
# positives and >> 250 negatives per class; the paper's CheX5 set has ~1,000 images per task.
EVAL_PER_CLASS = 250
# Balanced validation studies per CheX5 class (split validate): the positives each finding's zero-shot
# calibration is fitted on at the end of training (medclr.findings).
VAL_PER_CLASS = 40
CHEX5_OF = {"cardiomegaly": "Cardiomegaly", "edema": "Edema", "pleural_effusion": "Pleural Effusion",
            "pneumonia": "Pneumonia", "pneumothorax": "Pneumothorax"}

_ZONES = (("upper lobe", "upper"), ("middle lobe", "middle lobe"), ("lower lobe", "lower"), ("lingula", "lingula"),
          ("apex", "apex"), ("base", "base"), ("hilum", "perihilar"), ("diffuse", "diffuse"))
_SIZES = ("small", "moderate", "large")
_SEVERITY = {"borderline": "borderline", "minimal": "mild", "mild": "mild", "moderate": "moderate",
             "severe": "severe", "marked": "severe"}


def finding(name: str, **attrs) -> dict:
    """A finding dict with every key present (defaults '' / False / 1)."""
    out = {"name": name, "side": "", "side_stated": False, "size": "", "severity": "", "zone": "", "kind": "", "count": 1}
    out.update(attrs)
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _canonical(head: str, mods: list[str]) -> list[tuple[str, str]]:
    """(canonical name, kind) pairs for one MeSH chain; [] for 'normal'."""
    has = set(mods).__contains__
    enlarged = any(m in ("enlarged", "prominent", "large", "increased", "widened", "dilatation") for m in mods)
    if head == "normal":
        return []
    simple = {
        "cardiomegaly": "cardiomegaly", "pleural effusion": "pleural_effusion", "hemothorax": "pleural_effusion",
        "pneumothorax": "pneumothorax", "pulmonary edema": "edema", "pulmonary congestion": "edema",
        "edema": "edema", "heart failure": "edema", "pneumonia": "pneumonia", "consolidation": "consolidation",
        "airspace disease": "opacity", "infiltrate": "opacity", "pulmonary atelectasis": "atelectasis",
        "atelectasis": "atelectasis", "volume loss": "atelectasis", "nodule": "nodule",
        "lung diseases, interstitial": "interstitial", "pulmonary fibrosis": "interstitial",
        "fibrosis": "interstitial", "hypertension, pulmonary": "vascular_prominence",
        "pulmonary artery": "vascular_prominence", "cicatrix": "scarring", "emphysema": "hyperinflation",
        "pulmonary emphysema": "hyperinflation", "pulmonary disease, chronic obstructive": "hyperinflation",
        "bullous emphysema": "hyperinflation", "lung, hyperlucent": "hyperinflation",
        "diaphragmatic eventration": "elevated_hemidiaphragm", "aortic aneurysm": "tortuous_aorta",
        "atherosclerosis": "aortic_calcification", "scoliosis": "scoliosis", "spondylosis": "degenerative_spine",
        "osteophyte": "degenerative_spine", "arthritis": "degenerative_spine",
        "hyperostosis, diffuse idiopathic skeletal": "degenerative_spine", "fractures, bone": "fracture",
        "catheters, indwelling": "central_line", "tube, inserted": "tube", "hernia, hiatal": "hiatal_hernia",
        "hernia, diaphragmatic": "hiatal_hernia", "pleura": "pleural_thickening",
        "technical quality of image unsatisfactory": "technical", "stents": "surgical_clips",
        "foreign bodies": "surgical_clips", "medical device": "surgical_clips", "sutures": "sternotomy",
    }
    if head in ("hydropneumothorax", "hemopneumothorax"):
        return [("pleural_effusion", ""), ("pneumothorax", "")]
    if head in ("calcified granuloma", "granuloma"):
        return [("nodule", "calcified")]
    if head == "granulomatous disease":
        return [("nodule", "calcified")]
    if head == "mass":
        return [("nodule", "mass")]
    if head in simple:
        return [(simple[head], "")]
    if head in ("cardiac shadow", "heart", "heart ventricles", "heart atria"):
        return [("cardiomegaly", "")] if enlarged or not mods else [(f"other:{_slug(head)}", "")]
    if head == "costophrenic angle":
        return [("pleural_effusion", "blunting")] if has("blunted") else [(f"other:{_slug(head)}", "")]
    if head in ("opacity", "density"):
        if has("interstitial") or has("reticular"):
            return [("interstitial", "")]
        if head == "density" and not (has("lung") or any(z in mods for z, _ in _ZONES)):
            return [(f"other:{_slug(head)}", "")]
        return [("opacity", "")]
    if head == "markings":
        return [("interstitial", "")] if has("interstitial") else [("vascular_prominence", "")]
    if head == "lung":
        if has("interstitial"):
            return [("interstitial", "")]
        if has("hilum") and enlarged:
            return [("vascular_prominence", "")]
        if has("hyperdistention"):
            return [("hyperinflation", "")]
        if has("hypoinflation"):
            return [("hypoinflation", "")]
    if head == "diaphragm":
        if has("flattened"):
            return [("hyperinflation", "")]
        if has("elevated"):
            return [("elevated_hemidiaphragm", "")]
    if head in ("aorta", "aorta, thoracic"):
        if any(m in ("tortuous", "ectatic", "enlarged", "dilatation", "prominent", "unfolded") for m in mods):
            return [("tortuous_aorta", "")]
    if head == "calcinosis":
        if any("aorta" in m for m in mods):
            return [("aortic_calcification", "")]
        if any(m in ("lymph nodes", "hilum", "mediastinum") for m in mods):
            return [("calcified_nodes", "")]
        if has("lung"):
            return [("nodule", "calcified")]
    if head == "lymph nodes" and has("calcified"):
        return [("calcified_nodes", "")]
    if head in ("thoracic vertebrae", "spine", "lumbar vertebrae", "cervical vertebrae") and has("degenerative"):
        return [("degenerative_spine", "")]
    if head == "implanted medical device":
        if any("valve" in m or m in ("heart atria", "heart", "pulmonary artery") for m in mods):
            return [("surgical_clips", "valve")]
        if any(m in ("shoulder", "humerus", "spine", "ribs", "thoracic vertebrae") for m in mods):
            return [("other:orthopedic_hardware", "")]
        return [("pacemaker", "")]
    if head == "surgical instruments":
        if has("mediastinum") or has("sternum"):
            return [("sternotomy", "")]
        return [("surgical_clips", "abdomen" if has("abdomen") else "")]
    if head == "deformity" and has("ribs"):
        return [("fracture", "healed")]
    if head == "thickening" and (has("pleura") or has("pleural")):
        return [("pleural_thickening", "")]
    if head == "mediastinum" and enlarged:
        return [("mediastinal_widening", "")]
    return [(f"other:{_slug(head)}", "")]


def parse_mesh(term: str) -> list[dict]:
    """One MeSH major term (``'Pleural Effusion/right/small'``) -> canonical finding dicts.

    Returns [] for ``normal``; ``No Indexing`` maps to ``other:no_indexing``.
    """
    parts = [p.strip() for p in term.split("/")]
    head, mods = parts[0].lower(), [p.lower() for p in parts[1:] if p]
    side = next((s for s in SIDES if s in mods), "")
    size = next((s for s in _SIZES if s in mods), "")
    severity = next((_SEVERITY[m] for m in mods if m in _SEVERITY), "")
    zone = next((z for key, z in _ZONES if key in mods), "")
    count = 3 if ("multiple" in mods or "scattered" in mods or head == "granulomatous disease") else 1
    out = []
    for name, kind in _canonical(head, mods):
        out.append(finding(name, side=side, side_stated=bool(side), size=size, severity=severity, zone=zone,
                           kind=kind, count=count))
    return out


def merge_findings(findings: list[dict]) -> list[dict]:
    """Merge findings of the same (name, side) keeping the most specific attributes; stable order."""
    merged: dict[tuple[str, str], dict] = {}
    for f in findings:
        key = (f["name"], f["side"])
        # an unsided mention folds into a sided one of the same name (and vice versa)
        if not f["side"]:
            key = next((k for k in merged if k[0] == f["name"]), key)
        elif (f["name"], "") in merged:
            merged[key] = merged.pop((f["name"], ""))
            merged[key].update(side=f["side"], side_stated=f["side_stated"])
        if key not in merged:
            merged[key] = dict(f)
            continue
        cur = merged[key]
        for attr in ("size", "severity", "zone", "kind"):
            if not cur[attr] and f[attr]:
                cur[attr] = f[attr]
        cur["count"] = max(cur["count"], f["count"])
    # left + right of one lateral finding = bilateral
    by_name: dict[str, list[tuple[str, str]]] = {}
    for key in merged:
        by_name.setdefault(key[0], []).append(key)
    for name, keys in by_name.items():
        sides = {k[1] for k in keys}
        if {"left", "right"} <= sides:
            first = merged[(name, "left")]
            for k in keys:
                if k != (name, "left"):
                    del merged[k]
            first.update(side="bilateral", side_stated=True)
            merged[(name, "bilateral")] = merged.pop((name, "left"))
    return list(merged.values())


def class_token(f: dict) -> str:
    if f["name"] in LATERAL and f["side_stated"] and f["side"]:
        return f"{f['name']}:{f['side']}"
    return f["name"]


def latent_class(findings: list[dict]) -> str:
    """The study's latent class: '|'-joined sorted class tokens, or 'normal'."""
    tokens = sorted({class_token(f) for f in findings})
    return "|".join(tokens) if tokens else NORMAL


def chexpert_positive(findings: list[dict]) -> set[str]:
    """CheXpert observations asserted by the findings (No Finding excluded)."""
    return {CHEXPERT_OF[f["name"]] for f in findings if CHEXPERT_OF.get(f["name"])}


def chexpert_row(findings: list[dict], negated: set[str] = frozenset()) -> dict[str, float]:
    """14 CheXpert labels: 1.0 asserted, 0.0 negated in the text, NaN not mentioned; No Finding by the usual rule."""
    positive = chexpert_positive(findings)
    row = {name: (1.0 if name in positive else (0.0 if name in negated else float("nan"))) for name in CHEXPERT_LABELS}
    row["No Finding"] = 1.0 if not (positive - {"Support Devices"}) else float("nan")
    return row
