"""Open-i (Indiana University) chest X-ray reports: the XML files in NLMCXR_reports.tgz.

The torchxrayvision wheel ships the 3,955 reports; this reader keeps what its
own Openi_Dataset throws away: the FINDINGS / IMPRESSION text. One manifest row
per report (no image); MeSH terms are kept as lists (``mesh_major``,
``mesh_automatic``) because they structure each report's findings.
"""

from __future__ import annotations

import os
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd

from medclr.data.labels import CHEXPERT_LABELS
from medclr.data.manifest import normalise
from medclr.data.readers.common import hash_split
from medclr.data.text import normalise_anonymisation, split_sentences
from medclr.errors import MedclrError

SECTIONS = ("COMPARISON", "INDICATION", "FINDINGS", "IMPRESSION")

# MeSH major heading (first element of a term chain) -> CheXpert observation.
MESH_TO_CHEXPERT = {
    "atelectasis": "Atelectasis",
    "pulmonary atelectasis": "Atelectasis",
    "cardiomegaly": "Cardiomegaly",
    "consolidation": "Consolidation",
    "pulmonary edema": "Edema",
    "edema": "Edema",
    "pulmonary congestion": "Edema",
    "mediastinum": "Enlarged Cardiomediastinum",
    "fractures, bone": "Fracture",
    "nodule": "Lung Lesion",
    "mass": "Lung Lesion",
    "lung, hyperlucent": None,
    "opacity": "Lung Opacity",
    "airspace disease": "Lung Opacity",
    "infiltrate": "Lung Opacity",
    "pleural effusion": "Pleural Effusion",
    "pleural effusions": "Pleural Effusion",
    "pleural thickening": "Pleural Other",
    "pneumonia": "Pneumonia",
    "pneumothorax": "Pneumothorax",
    "medical device": "Support Devices",
    "catheters, indwelling": "Support Devices",
    "pacemaker, artificial": "Support Devices",
    "tube, inserted": "Support Devices",
    "implanted medical device": "Support Devices",
}


def default_openi_path() -> Path:
    """The tarball inside the installed torchxrayvision wheel."""
    try:
        import torchxrayvision
    except ImportError:  # pragma: no cover - it is a dependency
        raise MedclrError("torchxrayvision is not installed; pass the path to NLMCXR_reports.tgz or its folder") from None
    return Path(torchxrayvision.__file__).parent / "data" / "NLMCXR_reports.tgz"


def _iter_xml(path: Path):
    """Yield (name, bytes) of every report XML in a .tgz or a directory."""
    if path.is_dir():
        for file in sorted(path.rglob("*.xml")):
            yield file.name, file.read_bytes()
        return
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".xml"):
                    yield member.name, tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise MedclrError(f"{path}: not a readable Open-i tarball ({exc})") from None


def parse_report_xml(data: bytes, name: str = "<xml>") -> dict:
    """One Open-i XML -> uid, the four sections, MeSH terms, image ids."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise MedclrError(f"{name}: malformed Open-i XML ({exc})") from None
    uid_node = root.find("uId")
    if uid_node is None or not uid_node.get("id"):
        raise MedclrError(f"{name}: not an Open-i report (no <uId id=...>)")
    sections = {label: "" for label in SECTIONS}
    for node in root.iter("AbstractText"):
        label = (node.get("Label") or "").upper()
        if label in sections:
            sections[label] = " ".join("".join(node.itertext()).split())
    mesh = root.find("MeSH")
    major = [" ".join(n.text.split()) for n in mesh.iter("major") if n.text] if mesh is not None else []
    automatic = [" ".join(n.text.split()) for n in mesh.iter("automatic") if n.text] if mesh is not None else []
    images = [n.get("id") for n in root.iter("parentImage") if n.get("id")]
    return {"uid": uid_node.get("id"), "sections": sections, "mesh_major": major, "mesh_automatic": automatic, "images": images}


def chexpert_from_mesh(mesh_major: list[str]) -> dict[str, float]:
    """CheXpert-style labels from MeSH major terms: 1 when mentioned, 0 otherwise; 'normal' -> No Finding."""
    labels = {name: 0.0 for name in CHEXPERT_LABELS}
    heads = {term.split("/")[0].strip().lower() for term in mesh_major}
    for head in heads:
        name = MESH_TO_CHEXPERT.get(head)
        if name:
            labels[name] = 1.0
    positives = [n for n in CHEXPERT_LABELS if n not in ("No Finding", "Support Devices") and labels[n] == 1.0]
    labels["No Finding"] = 1.0 if ("normal" in heads and not positives) else 0.0
    return labels


def _report_string(sections: dict[str, str]) -> str:
    return "\n".join(f"{label}: {sections[label]}" for label in SECTIONS if sections[label])


def read_openi(path: str | os.PathLike | None = None, split_seed: int = 0) -> pd.DataFrame:
    """Read Open-i reports (default: the copy inside torchxrayvision) into a manifest.

    Extra columns: ``uid``, ``findings``, ``impression``, ``mesh_major``,
    ``mesh_automatic``, ``images``. Splits are drawn per report from ``split_seed``.
    """
    path = Path(path) if path else default_openi_path()
    if not path.exists():
        raise MedclrError(f"{path}: Open-i reports not found (pass NLMCXR_reports.tgz or its unpacked folder)")
    rows = []
    for name, data in _iter_xml(path):
        rec = parse_report_xml(data, name)
        sec = {k: normalise_anonymisation(v) for k, v in rec["sections"].items()}
        text = " ".join(s for s in (sec["FINDINGS"], sec["IMPRESSION"]) if s)
        rows.append(
            {
                "uid": rec["uid"],
                "subject_id": rec["uid"],
                "study_id": rec["uid"],
                "split": hash_split(rec["uid"], split_seed),
                "report": _report_string(sec),
                "text": text,
                "sentences": split_sentences(sec["FINDINGS"]) + split_sentences(sec["IMPRESSION"]),
                "findings": sec["FINDINGS"],
                "impression": sec["IMPRESSION"],
                "mesh_major": rec["mesh_major"],
                "mesh_automatic": rec["mesh_automatic"],
                "images": rec["images"],
                **chexpert_from_mesh(rec["mesh_major"]),
            }
        )
    if not rows:
        raise MedclrError(f"{path}: no Open-i report XML found")
    df = pd.DataFrame(rows)
    # numeric order of CXR<n>, so row order does not depend on the tar member order
    df = df.iloc[np.argsort([int("".join(ch for ch in u if ch.isdigit()) or 0) for u in df["uid"]], kind="stable")]
    return normalise(df)
