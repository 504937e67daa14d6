"""Report sections and radiology sentence splitting."""

from __future__ import annotations

import re

import pytest

from medclr.data.readers.openi import read_openi
from medclr.data.text import extract_sections, report_text, sentence_hash, split_sentences

MIMIC_REPORT = """                                 FINAL REPORT
 EXAMINATION:  CHEST (PA AND LAT)

 INDICATION:  ___ year old woman with cough

 COMPARISON:  ___

 FINDINGS:

 ET tube approx. 5 cm above the carina.  Pt. is s/p CABG.  The lungs are clear
 without focal consolidation, effusion or pneumothorax.  Heart size is 2.3 cm
 larger than before.

 IMPRESSION:

 1. No acute cardiopulmonary process.
 2. Stable mild cardiomegaly.
"""


def test_mimic_sections_and_training_text():
    sections = extract_sections(MIMIC_REPORT)
    assert sections["indication"].startswith("___ year old")
    assert sections["findings"].startswith("ET tube") and "IMPRESSION" not in sections["findings"]
    assert sections["impression"].startswith("1. No acute")
    assert split_sentences(report_text(sections)) == [
        "ET tube approx. 5 cm above the carina.",
        "Pt. is s/p CABG.",
        "The lungs are clear without focal consolidation, effusion or pneumothorax.",
        "Heart size is 2.3 cm larger than before.",
        "No acute cardiopulmonary process.",
        "Stable mild cardiomegaly.",
    ]


@pytest.mark.parametrize(
    "header, canonical",
    [("CONCLUSION", "impression"), ("FINDINGS AND IMPRESSION", "impression"), ("PA AND LATERAL VIEWS OF THE CHEST", "findings"),
     ("REASON FOR EXAMINATION", "indication"), ("IMPRESSON", "impression")],
)
def test_header_variants(header, canonical):
    sections = extract_sections(f"INDICATION: cough.\n{header}: Lungs are clear.\n")
    assert sections[canonical] == "Lungs are clear."


def test_fallback_to_last_paragraph():
    sections = extract_sections("EXAMINATION: chest.\nPortable film.\n\nLungs are clear. No effusion.\n")
    assert sections["last_paragraph"] == "Lungs are clear. No effusion."
    assert report_text(sections) == "Lungs are clear. No effusion."
    assert extract_sections("No headers at all.") == {"full report": "No headers at all."}


def test_fragments_and_anonymisation():
    text = "IMPRESSION:\n1. Normal chest x-XXXX.\n2.\n.\n3) XXXX opacity in the left base ___."
    assert split_sentences(text) == ["Normal chest x-___.", "___ opacity in the left base ___."]
    assert split_sentences("") == [] and split_sentences("  \n ") == []
    assert sentence_hash("No  effusion.") == sentence_hash("No effusion.") != sentence_hash("no effusion.")


@pytest.fixture(scope="module")
def openi():
    return read_openi()


def test_openi_has_all_reports_and_clean_sentences(openi):
    assert len(openi) == 3955 and openi["uid"].is_unique
    assert set(openi["split"]) == {"train", "validate", "test"}
    sentences = [s for ss in openi["sentences"] for s in ss]
    assert len(sentences) > 20000
    assert not [s for s in sentences if not re.search("[A-Za-z]{2,}", s)]
    assert not [s for s in sentences if re.fullmatch(r"[A-Z ]+:", s) or re.match(r"\d+[.)]\s", s)]
    assert not [s for s in sentences if "XXXX" in s]
    counts = {}
    for s in sentences:
        counts[s] = counts.get(s, 0) + 1
    assert max(counts, key=counts.get) == "No acute cardiopulmonary abnormality."


def test_openi_mesh_labels(openi):
    assert openi["Cardiomegaly"].sum() > 300 and openi["Pneumothorax"].sum() >= 20
    first = openi.iloc[0]
    assert first["uid"] == "CXR1" and list(first["mesh_major"]) == ["normal"] and first["No Finding"] == 1.0
