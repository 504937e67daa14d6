"""The real material the phantom is made of, read from the torchxrayvision wheel and cached.

- Open-i reports (``medclr.data.readers.openi.read_openi``): sentences, MeSH
  findings linked to the sentence that states them, CheX labels negated in text.
- CheXpert training labels: the distribution of finding sets (co-occurrence).
- 518 real lung masks: the usable pairs, cropped to the lungs, as soft masks.
- NIH ChestX-ray14 boxes: lesion sizes per finding.

Building takes ~20-40 s (pysbd over 3,955 reports, decoding masks); the result is
cached in ``$MEDCLR_CACHE`` (default ``~/.cache/medclr``) as JSON + NPZ, keyed by
the source files' sizes and this module's ``VERSION``. Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image
from scipy import ndimage as ndi
from skimage.morphology import convex_hull_image

from medclr.errors import MedclrError
from medclr.files import atomic_path
from medclr.phantom import textmatch as tm, vocab as V

log = logging.getLogger(__name__)
VERSION = 3
MASK_RES = 160
_FILES = ("NLMCXR_reports.tgz", "chexpert_train.csv.gz", "semantic_masks_v7labs_lungs.zip", "BBox_List_2017.csv.gz")
# CheXpert observation -> canonical name used by the composed source ('device' is resolved to a kind later)
CHEX_TO_CANONICAL = {
    "Cardiomegaly": "cardiomegaly", "Pleural Effusion": "pleural_effusion", "Pneumothorax": "pneumothorax",
    "Edema": "edema", "Pneumonia": "pneumonia", "Consolidation": "consolidation", "Lung Opacity": "opacity",
    "Atelectasis": "atelectasis", "Lung Lesion": "nodule", "Fracture": "fracture", "Pleural Other": "pleural_thickening",
    "Enlarged Cardiomediastinum": "mediastinal_widening", "Support Devices": "device",
}
NIH_NAMES = {"Atelectasis": "atelectasis", "Cardiomegaly": "cardiomegaly", "Effusion": "pleural_effusion",
             "Infiltrate": "opacity", "Mass": "mass", "Nodule": "nodule", "Pneumonia": "pneumonia",
             "Pneumothorax": "pneumothorax"}


@dataclass
class Material:
    reports: list[dict]  # usable Open-i reports (see _report)
    chex_sets: list[tuple[str, ...]]  # distinct canonical finding sets in CheXpert
    chex_probs: np.ndarray  # their frequencies (sum 1)
    attr_dist: dict  # name -> attribute -> [[value, prob], ...] (from Open-i MeSH)
    lungs: np.ndarray  # (N, 2, R, R) uint8 soft masks of the lung pair crop: [0] patient right, [1] patient left
    lung_aspect: np.ndarray  # (N,) height / width of each lung pair crop
    boxes: dict  # canonical name -> (k, 4) float32 NIH boxes x, y, w, h as fractions of the 1024 px image
    banks: dict  # sentence banks (medclr.phantom.reports.build_banks)


def data_dir() -> Path:
    """torchxrayvision's data folder, found without importing it (its import pulls in torch)."""
    import importlib.util

    spec = importlib.util.find_spec("torchxrayvision")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a declared dependency
        raise MedclrError("torchxrayvision is not installed; the phantom needs the data files inside its wheel")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def cache_dir() -> Path:
    return Path(os.environ.get("MEDCLR_CACHE") or Path.home() / ".cache" / "medclr")


def _key(folder: Path) -> str:
    """Source file sizes + this package's text-rule code: editing the rules rebuilds the cache."""
    here = Path(__file__).parent
    parts = [str(VERSION)] + [hashlib.sha1((here / f).read_bytes()).hexdigest()
                              for f in ("vocab.py", "textmatch.py", "reports.py", "material.py")]
    for name in _FILES:
        path = folder / name
        if not path.is_file():
            raise MedclrError(f"{path}: missing from the torchxrayvision wheel (reinstall torchxrayvision)")
        parts.append(f"{name}:{path.stat().st_size}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- Open-i reports
def terminate(sentence: str) -> str:
    """End a sentence with a full stop so that joined sentences split back the same way."""
    sentence = sentence.strip()
    return sentence if not sentence or sentence[-1] in ".!?" else sentence + "."


def _section_of(sentences: list[str], findings: str) -> list[str]:
    """'F' or 'I' per sentence: findings sentences come first and occur in the findings text."""
    norm = " ".join(findings.split())
    out, in_findings, cursor = [], True, 0
    for s in sentences:
        pos = norm.find(s[: max(8, len(s) // 2)], cursor) if in_findings and norm else -1
        if pos < 0:
            in_findings = False
        else:
            cursor = pos
        out.append("F" if in_findings else "I")
    return out


def _link(f: dict, sentences: list[str], sections: list[str]) -> int:
    """Index of the sentence that best states finding ``f`` (-1: none)."""
    best, best_score = -1, -1e9
    for i, s in enumerate(sentences):
        state = tm.mention_state(s, f["name"]) if f["name"] in tm.KEYWORDS else ""
        if state not in ("pos", "hedge"):
            continue
        side = tm.sentence_side(s)
        score = (1.0 if sections[i] == "F" else 0.0) + (0.5 if state == "pos" else 0.0)
        if f["side"]:
            score += 2.0 if side == f["side"] else (-3.0 if side in V.SIDES else 0.0)
        score -= 0.1 * len(tm.positives(s, V.RENDERED))
        if score > best_score:
            best, best_score = i, score
    return best


def _report(row) -> dict | None:
    terms = list(row.mesh_major)
    if any(t.strip().lower() == "no indexing" for t in terms) or not len(row.sentences):
        return None
    from medclr.data.text import split_sentences

    raw = [terminate(x) for x in row.sentences]
    raw_sections = _section_of(list(row.sentences), row.findings)
    # the sentences a reader will split from the report file we write (sections joined by spaces)
    if raw == list(row.sentences):  # already terminated: joining them splits back the same way
        parts = [[x for x, c in zip(raw, raw_sections) if c == sec] for sec in "FI"]
    else:
        parts = [split_sentences(" ".join(x for x, c in zip(raw, raw_sections) if c == sec)) for sec in "FI"]
    sentences = parts[0] + parts[1]
    sections = ["F"] * len(parts[0]) + ["I"] * len(parts[1])
    if not sentences:
        return None
    findings = V.merge_findings([f for t in terms for f in V.parse_mesh(t)])
    for f in findings:
        f["sentence"] = _link(f, sentences, sections) if not f["name"].startswith("other:") else -1
        if f["name"] in V.LATERAL and not f["side"] and f["sentence"] >= 0:
            side = tm.sentence_side(sentences[f["sentence"]])
            if side in V.SIDES:
                f.update(side=side, side_stated=True)
    positive = V.chexpert_positive(findings)
    negated = set()
    for name, chex in V.CHEXPERT_OF.items():
        if chex and chex not in positive and name in tm.KEYWORDS and any(
                tm.mention_state(s, name) == "neg" for s in sentences):
            negated.add(chex)
    header = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in row.report.split("\n") if ":" in line}
    return {"uid": row.uid, "sentences": sentences, "sections": sections, "findings": findings,
            "negated": sorted(negated), "indication": header.get("INDICATION", ""),
            "comparison": header.get("COMPARISON", ""), "mesh": terms}


def _attr_dist(reports: list[dict]) -> dict:
    counts: dict = {}
    for rep in reports:
        for f in rep["findings"]:
            d = counts.setdefault(f["name"], {a: Counter() for a in ("side", "size", "severity", "zone", "kind")})
            for attr in d:
                if f[attr] and (attr != "side" or f["side_stated"]):
                    d[attr][f[attr]] += 1
    out = {}
    for name, d in counts.items():
        out[name] = {a: [[v, c / sum(cnt.values())] for v, c in sorted(cnt.items())] for a, cnt in d.items() if cnt}
    return out


# ---------------------------------------------------------------- CheXpert, masks, boxes
def _chexpert_sets(path: Path) -> tuple[list[tuple[str, ...]], np.ndarray]:
    df = pd.read_csv(path, usecols=list(CHEX_TO_CANONICAL))
    pos = (df.to_numpy() == 1.0)
    names = np.array([CHEX_TO_CANONICAL[c] for c in df.columns])
    keys = Counter(tuple(sorted(str(n) for n in names[r])) for r in pos)
    sets = sorted(keys, key=lambda k: (-keys[k], k))
    counts = np.array([keys[k] for k in sets], dtype=np.float64)
    return sets, counts / counts.sum()


def _lung_pair(data: bytes) -> np.ndarray | None:
    img = Image.open(io.BytesIO(data))
    img.draft("L", (400, 400))
    img = img.convert("L")
    scale = min(1.0, 200 / max(img.size))
    img = img.resize((max(1, int(img.width * scale)), max(1, int(img.height * scale))), Image.BILINEAR)
    mask = ndi.binary_opening(ndi.binary_fill_holes(np.asarray(img) > 127), structure=np.ones((5, 5)))
    lab, k = ndi.label(mask)
    if k < 2:
        return None
    sizes = ndi.sum(mask, lab, range(1, k + 1))
    order = np.argsort(sizes)[::-1]
    a, b = lab == order[0] + 1, lab == order[1] + 1
    if sizes[order[1]] < 0.45 * sizes[order[0]] or sizes[order[2:]].sum() > 0.05 * sizes[order[:2]].sum():
        return None
    if np.nonzero(a)[1].mean() > np.nonzero(b)[1].mean():
        a, b = b, a  # a: image-left = patient right
    both = a | b
    ys, xs = np.nonzero(both)
    h, w = np.ptp(ys) + 1, np.ptp(xs) + 1
    if not (0.6 <= h / w <= 1.05):
        return None
    for lung in (a, b):
        ly, lx = np.nonzero(lung)
        if np.ptp(ly) < 0.8 * h or lung.sum() / max(1, convex_hull_image(lung).sum()) < 0.84:
            return None
        box = lung[ly.min():ly.max() + 1, lx.min():lx.max() + 1]
        if box.mean() < 0.55:
            return None
    # medial gap at the heart level must look normal (heart drawn on top of it)
    rows = range(ys.min() + int(0.6 * h), ys.min() + int(0.85 * h))
    gap = [np.nonzero(b[y])[0].min() - np.nonzero(a[y])[0].max() for y in rows
           if a[y].any() and b[y].any()]
    if not gap or max(gap) / w > 0.4 or min(gap) / w < 0.06:
        return None
    out = []
    for lung in (a, b):
        crop = lung[ys.min():ys.max() + 1, xs.min():xs.max() + 1].astype(np.float32)
        crop = ndi.gaussian_filter(crop, 0.6 * max(crop.shape) / MASK_RES)
        out.append(np.asarray(Image.fromarray((crop * 255).astype(np.uint8)).resize((MASK_RES, MASK_RES), Image.BILINEAR)))
    return np.stack(out), h / w


def _lungs(path: Path) -> tuple[np.ndarray, np.ndarray]:
    masks, aspects = [], []
    with zipfile.ZipFile(path) as z:
        for name in sorted(n for n in z.namelist() if not n.endswith("/")):
            try:
                pair = _lung_pair(z.read(name))
            except (OSError, ValueError):
                pair = None
            if pair is not None:
                masks.append(pair[0])
                aspects.append(pair[1])
    if len(masks) < 20:
        raise MedclrError(f"{path}: too few usable lung masks ({len(masks)})")
    return np.stack(masks), np.asarray(aspects, dtype=np.float32)


def _boxes(path: Path) -> dict:
    df = pd.read_csv(path).iloc[:, :6]
    df.columns = ["image", "label", "x", "y", "w", "h"]
    out = {}
    for label, name in NIH_NAMES.items():
        sub = df[df.label == label][["x", "y", "w", "h"]].to_numpy(np.float32) / 1024.0
        out[name] = sub
    return out


# ---------------------------------------------------------------- build / cache
def _openi_table(folder: Path) -> pd.DataFrame:
    """read_openi's columns the phantom needs, cached (pysbd over 3,955 reports is the slow part)."""
    from medclr.data.readers.openi import read_openi

    src = folder / "NLMCXR_reports.tgz"
    path = cache_dir() / f"openi-sentences-{src.stat().st_size}-v{VERSION}.parquet"
    cols = ["uid", "report", "findings", "sentences", "mesh_major"]
    if path.is_file():
        try:
            return pd.read_parquet(path, columns=cols)
        except (OSError, ValueError):
            pass
    df = read_openi(src)[cols]
    try:
        with atomic_path(path) as tmp:
            df.to_parquet(tmp, index=False)
    except OSError:
        pass
    return df


def _lungs_cached(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    src = folder / "semantic_masks_v7labs_lungs.zip"
    path = cache_dir() / f"lung-masks-{src.stat().st_size}-v{VERSION}-{MASK_RES}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                return z["lungs"], z["aspect"]
        except (OSError, ValueError, KeyError):
            pass
    lungs, aspect = _lungs(src)
    try:
        with atomic_path(path) as tmp:
            np.savez_compressed(tmp, lungs=lungs, aspect=aspect)
    except OSError:
        pass
    return lungs, aspect


def build_material() -> Material:
    folder = data_dir()
    df = _openi_table(folder)
    reports = [r for r in (_report(row) for row in df.itertuples()) if r is not None]
    sets, probs = _chexpert_sets(folder / "chexpert_train.csv.gz")
    from medclr.phantom.reports import build_banks

    lungs, aspect = _lungs_cached(folder)
    return Material(reports=reports, chex_sets=sets, chex_probs=probs, attr_dist=_attr_dist(reports),
                    lungs=lungs, lung_aspect=aspect, boxes=_boxes(folder / "BBox_List_2017.csv.gz"),
                    banks=build_banks(reports))


def _save(m: Material, stem: Path) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    doc = {"reports": m.reports, "chex_sets": [list(s) for s in m.chex_sets], "chex_probs": m.chex_probs.tolist(),
           "attr_dist": m.attr_dist, "banks": m.banks}
    with atomic_path(stem.with_suffix(".npz")) as tmp:
        np.savez_compressed(tmp, lungs=m.lungs, lung_aspect=m.lung_aspect, **{f"box_{k}": v for k, v in m.boxes.items()})
    with atomic_path(stem.with_suffix(".json.gz")) as tmp, gzip.open(tmp, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh)


def _load(stem: Path) -> Material | None:
    if not (stem.with_suffix(".json.gz").is_file() and stem.with_suffix(".npz").is_file()):
        return None
    try:
        with gzip.open(stem.with_suffix(".json.gz"), "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
        with np.load(stem.with_suffix(".npz"), allow_pickle=False) as z:
            lungs, aspect = z["lungs"], z["lung_aspect"]
            boxes = {k[4:]: z[k] for k in z.files if k.startswith("box_")}
    except (OSError, ValueError, EOFError, KeyError) as exc:
        log.warning("phantom material cache %s unreadable (%s); rebuilding", stem, exc)
        return None
    return Material(reports=doc["reports"], chex_sets=[tuple(s) for s in doc["chex_sets"]],
                    chex_probs=np.asarray(doc["chex_probs"]), attr_dist=doc["attr_dist"], lungs=lungs,
                    lung_aspect=aspect, boxes=boxes,
                    banks=doc["banks"])


_MATERIAL: Material | None = None


def load_material() -> Material:
    """The process-wide material (built once per machine, then read from the cache in ~0.3 s)."""
    global _MATERIAL
    if _MATERIAL is None:
        stem = cache_dir() / f"phantom-material-{_key(data_dir())}"
        m = _load(stem)
        if m is None:
            log.info("building the phantom material cache (once per machine, ~30 s) at %s", stem)
            m = build_material()
            try:
                _save(m, stem)
                for old in stem.parent.glob("phantom-material-*"):
                    if not old.name.startswith(stem.name) and not old.name.endswith(".tmp"):
                        old.unlink(missing_ok=True)
            except OSError as exc:  # a read-only home still works, just slower next time
                log.warning("could not write the phantom material cache %s: %s", stem, exc)
        _MATERIAL = m
    return _MATERIAL
