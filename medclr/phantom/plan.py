"""Study specs: which findings, which report text, which view, for study number k of a seed.

A spec is a pure function of (material, source, seed, k): workers rebuild it
from those numbers, so results never depend on the worker count.

``openi``: study k takes report ``perm[k mod R]`` of a seed-shuffled list of the
usable Open-i reports (R = 3,832: 'No Indexing' reports are left out); its
findings are the MeSH terms that a sentence of the report states.
``composed``: the finding set is drawn from the CheXpert training label sets
(positives only), sides from the Open-i MeSH side frequencies, device kinds
from ``DEVICE_KINDS``; the text is composed from real Open-i sentences.
``both``: even k are Open-i, odd k composed.

Latent class (vocab.latent_class): rendered findings with their stated side.
``class_model_prob``: the class probability under the generating distribution
(composed: exact product of the sampling probabilities; openi: the class
frequency among the R reports; both: the 50/50 mixture).
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np

from medclr.phantom import reports as R, vocab as V
from medclr.phantom.renderer import stream

SOURCES = ("openi", "composed", "both")
# The evaluation sets (test split) are drawn class by class: CheX5 classes single-positive (the paper's
# CheX5 set, CheXpert 5x200-style), then the other three MS-CXR grounding categories with no CheX5
# finding. Their random streams are keyed from EVAL_K0 on, far above any study number of the pool.
CHEX5_TARGETS = ("cardiomegaly", "edema", "pleural_effusion", "pneumonia", "pneumothorax")
GROUNDING_TARGETS = ("atelectasis", "consolidation", "opacity")
# Normal studies (no finding at all) close the test split, so the app's checks and its screenshots have a
# normal film to show; they follow every other evaluation and validation study, leaving those unchanged.
NORMAL_TARGET = "normal"
EVAL_K0 = 1 << 40
# The class-balanced validation studies (split "validate", on subjects of their own) are drawn the same
# way from streams of their own: what training fits each finding's calibration on, never the test split.
VAL_K0 = 3 << 40
DEVICE_KINDS = {"central_line": 0.4, "tube": 0.25, "pacemaker": 0.2, "sternotomy": 0.1, "surgical_clips": 0.05}
KIND_CHOICES = {"nodule": (("nodule", 0.55), ("calcified", 0.3), ("mass", 0.15)),
                "atelectasis": (("plate", 0.7), ("wedge", 0.3)), "tube": (("et", 0.6), ("ng", 0.4)),
                "central_line": (("ij", 0.45), ("subclavian", 0.3), ("picc", 0.25))}
DEFAULTS = {"size": (("small", 0.5), ("moderate", 0.35), ("large", 0.15)),
            "severity": (("mild", 0.5), ("moderate", 0.35), ("severe", 0.15)),
            "zone": (("lower", 0.35), ("base", 0.25), ("mid", 0.15), ("upper", 0.15), ("perihilar", 0.1))}
_ZONE_OK = {"apex", "upper", "mid", "perihilar", "lingula", "middle lobe", "lower", "base", "diffuse"}


def _choice(rng: np.random.Generator, pairs) -> str:
    values = [p[0] for p in pairs]
    probs = np.asarray([p[1] for p in pairs], dtype=np.float64)
    return values[int(np.searchsorted(np.cumsum(probs / probs.sum()), rng.random(), side="right").clip(0, len(values) - 1))]


def _fill(f: dict, material, rng: np.random.Generator) -> None:
    """Rendering attributes the text left open (recorded in the ground truth, not in the class)."""
    dist = material.attr_dist.get(f["name"], {})
    if f["name"] in V.LATERAL and not f["side"]:
        f["side"] = _choice(rng, dist.get("side") or (("right", 0.4), ("left", 0.4), ("bilateral", 0.2)))
    if f["name"] in ("pleural_effusion", "pneumothorax", "hiatal_hernia") and not f["size"]:
        f["size"] = _choice(rng, dist.get("size") or DEFAULTS["size"])
    if f["name"] in ("cardiomegaly", "edema") and not f["severity"]:
        f["severity"] = _choice(rng, dist.get("severity") or DEFAULTS["severity"])
    if f["name"] in ("pneumonia", "consolidation", "opacity", "atelectasis", "nodule", "scarring") and \
            f["zone"] not in _ZONE_OK:
        zones = [z for z in dist.get("zone", []) if z[0] in _ZONE_OK]
        f["zone"] = _choice(rng, zones or DEFAULTS["zone"])
    if f["name"] in KIND_CHOICES and f["kind"] not in dict(KIND_CHOICES[f["name"]]):
        f["kind"] = _choice(rng, KIND_CHOICES[f["name"]])


def openi_tables(material):
    """Per report: the kept findings and its latent class; class frequencies over the reports."""
    cache = getattr(material, "_openi", None)
    if cache is not None:
        return cache
    kept, classes = [], []
    for rep in material.reports:
        fs = [f for f in rep["findings"] if f["name"].startswith("other:") or f["name"] == "technical"
              or (f["name"] in V.CHEXPERT_OF and f["sentence"] >= 0)]
        kept.append(fs)
        classes.append(V.latent_class([f for f in fs if f["name"] in V.CHEXPERT_OF and f["name"] != "technical"]))
    counts = Counter(classes)
    material._openi = (kept, classes, {c: n / len(classes) for c, n in counts.items()})
    return material._openi


@lru_cache(maxsize=16)
def _perm(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 7])).permutation(n)


def _composed_tables(material):
    cache = getattr(material, "_composed", None)
    if cache is None:
        banks = material.banks["positive"]
        sides = {}
        for name in V.LATERAL:
            avail = [s for s in V.SIDES if banks.get(f"{name}|{s}")]
            dist = dict(material.attr_dist.get(name, {}).get("side", [])) or {"right": 0.4, "left": 0.4, "bilateral": 0.2}
            pairs = [(s, dist.get(s, 0.02)) for s in avail]
            total = sum(p for _, p in pairs) or 1.0
            sides[name] = [(s, p / total) for s, p in pairs]
        kinds = [(k, p) for k, p in DEVICE_KINDS.items() if banks.get(f"{k}|")]
        total = sum(p for _, p in kinds)
        kinds = [(k, p / total) for k, p in kinds]
        cum = np.cumsum(material.chex_probs)
        cache = {"sides": sides, "kinds": kinds, "cum": cum / cum[-1]}
        material._composed = cache
    return cache


def composed_class_prob(material, latent_class: str) -> float:
    """P(class) under the composed sampler: P(CheXpert set) x P(device kind) x P(side) per lateral finding."""
    t = _composed_tables(material)
    index = t.get("index")
    if index is None:
        index = t["index"] = {s: i for i, s in enumerate(material.chex_sets)}
    tokens = [] if latent_class == V.NORMAL else latent_class.split("|")
    base, p = [], 1.0
    for tok in tokens:
        name, _, side = tok.partition(":")
        if name in DEVICE_KINDS:
            p *= dict(t["kinds"]).get(name, 0.0)
            name = "device"
        if name in V.LATERAL:
            p *= dict(t["sides"].get(name, [])).get(side, 0.0)
        base.append(name)
    i = index.get(tuple(sorted(base)))
    return 0.0 if i is None or len(set(base)) != len(base) else p * float(material.chex_probs[i])


def class_model_prob(material, source: str, latent_class: str) -> float:
    """Probability of ``latent_class`` under the generating distribution of ``source``."""
    if source == "openi":
        return openi_tables(material)[2].get(latent_class, 0.0)
    if source == "composed":
        return composed_class_prob(material, latent_class)
    return 0.5 * class_model_prob(material, "openi", latent_class) + 0.5 * composed_class_prob(material, latent_class)


def _plan_openi(material, seed: int, j: int, rng) -> dict:
    kept, classes, _ = openi_tables(material)
    perm = _perm(seed, len(kept))
    r = int(perm[j % len(kept)])
    rep = material.reports[r]
    findings = []
    for f in kept[r]:
        g = {key: f[key] for key in V.FINDING_KEYS}
        g["rendered"] = g["name"] in V.CHEXPERT_OF
        g["sentence_text"] = rep["sentences"][f["sentence"]] if f["sentence"] >= 0 else ""
        if g["rendered"] and g["name"] != "technical":
            _fill(g, material, rng)
        findings.append(g)
    sents = rep["sentences"]
    return {"source": "openi", "uid": rep["uid"], "findings": findings,
            "findings_text": [s for s, sec in zip(sents, rep["sections"]) if sec == "F"],
            "impression_text": [s for s, sec in zip(sents, rep["sections"]) if sec == "I"],
            "indication": rep["indication"], "comparison": rep["comparison"], "negated": list(rep["negated"]),
            "latent_class": classes[r]}


def _target_cum(material, target: str) -> np.ndarray:
    """Cumulative CheXpert set probabilities restricted to sets holding ``target`` and no other CheX5 finding
    (for NORMAL_TARGET: the empty set, CheXpert's "No Finding")."""
    t = _composed_tables(material)
    cache = t.setdefault("target_cum", {})
    if target not in cache:
        others = set(CHEX5_TARGETS) - {target}
        if target == NORMAL_TARGET:
            keep = np.array([not s for s in material.chex_sets], dtype=np.float64)
        else:
            keep = np.array([target in s and not (others & set(s)) for s in material.chex_sets], dtype=np.float64)
        if not keep.any():
            raise ValueError(f"no CheXpert label set holds {target} alone")
        cum = np.cumsum(material.chex_probs * keep)
        cache[target] = cum / cum[-1]
    return cache[target]


def _plan_composed(material, rng, target: str | None = None) -> dict:
    t = _composed_tables(material)
    cum = t["cum"] if target is None else _target_cum(material, target)
    idx = int(np.searchsorted(cum, rng.random(), side="right").clip(0, len(cum) - 1))
    findings = []
    for name in material.chex_sets[idx]:
        if name == "device":
            name = _choice(rng, t["kinds"])
        f = V.finding(name)
        if name in V.LATERAL:
            f["side"] = _choice(rng, t["sides"][name])
            f["side_stated"] = True
        _fill(f, material, rng)
        f["rendered"] = True
        findings.append(f)
    donor = material.reports[int(rng.integers(len(material.reports)))]
    text = R.compose(findings, material.banks, rng)
    findings = [f for f in findings if f.get("sentence_text")]  # a finding no sentence states is not drawn
    return {"source": "composed", "uid": "", "findings": findings, "findings_text": text["findings"],
            "impression_text": text["impression"], "indication": donor["indication"], "comparison": "",
            "negated": text["negated"], "latent_class": V.latent_class([f for f in findings if f["name"] != "technical"])}


def eval_targets(per_class: int) -> list[str]:
    """The target finding of each evaluation study, in order: ``per_class`` for every CheX5 class, then
    ``per_class // 5`` (at least 1) for each other grounding category; none when ``per_class`` is 0."""
    if per_class <= 0:
        return []
    other = per_other_category(per_class)
    return [c for c in CHEX5_TARGETS for _ in range(per_class)] + [c for c in GROUNDING_TARGETS for _ in range(other)]


def per_other_category(per_class: int) -> int:
    """Test studies of each other grounding category, and normal studies by default: ``per_class // 5``, at least 1
    (0 without evaluation sets)."""
    return max(1, per_class // 5) if per_class > 0 else 0


def plan_eval_study(material, seed: int, j: int, target: str, split: str = "test") -> dict:
    """Evaluation study ``j`` (``split`` test) or balanced validation study ``j`` (``validate``): a composed
    study whose findings include ``target`` and no other CheX5 finding (redrawn until a sentence states the
    target; for NORMAL_TARGET, a study with no finding). Independent of the pool's size."""
    k = (EVAL_K0 if split == "test" else VAL_K0) + int(j)
    for attempt in range(64):
        rng = stream(seed, k, "plan", attempt)
        spec = _plan_composed(material, rng, target)
        if (not spec["findings"]) if target == NORMAL_TARGET else any(f["name"] == target for f in spec["findings"]):
            break
    else:
        raise ValueError(f"evaluation study {j}: no sentence states {target} after 64 draws")
    _view(spec, rng)
    spec.update(seed=int(seed), k=k, eval_target=target, eval_split=split)
    return spec


def _view(spec: dict, rng) -> None:
    names = {f["name"] for f in spec["findings"]}
    icu = bool(names & {"central_line", "tube", "edema", "pneumothorax"})
    spec["view"] = "AP" if rng.random() < (0.55 if icu else 0.2) else "PA"


def plan_study(material, source: str, seed: int, k: int) -> dict:
    """The spec of study ``k``: findings (with attributes and sentence), report text, view, class."""
    rng = stream(seed, k, "plan")
    if source == "both":
        spec = _plan_openi(material, seed, k // 2, rng) if k % 2 == 0 else _plan_composed(material, rng)
    elif source == "openi":
        spec = _plan_openi(material, seed, k, rng)
    else:
        spec = _plan_composed(material, rng)
    _view(spec, rng)
    spec.update(seed=int(seed), k=int(k), eval_target="")
    return spec
