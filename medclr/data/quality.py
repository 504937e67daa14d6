"""What a corpus holds that a user should know before training on it: a data-quality summary of the rows a run
reads (`medclr train`, `medclr lm fit`), one log line and a JSON file next to the run. It refuses nothing: the
readers already refuse what training cannot use (no image path, no sentence); these are the rows that train
but train badly.

Counted: image paths used by more than one row (the same image paired twice), rows of one study that hold
different reports, reports with no sentence, very long reports (a pasted document costs the LM and the text
tower their window), sentences with control characters (binary junk in an export), and reports that repeat
another's text word for word (templates: "No acute cardiopulmonary process." alone; each one is a false
negative of the other in every batch they share), and blank images (one value in every pixel: nothing to
learn from), which only a reader of the pixels can count (training, when it has read them; else null)."""

from __future__ import annotations

import json
import re
from pathlib import Path

LONG_REPORT_SENTENCES = 40  # more sentences than any chest report the project has seen (Open-i: at most 26)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
QUALITY_NAME = "data_quality.json"


def data_quality(manifest, blank_image: int | None = None) -> dict:
    """Counts (and a few examples) over the manifest's rows; see the module docstring. ``blank_image``: the
    blank images among them, where the caller has read the pixels (None: not counted)."""
    sentences = [list(s) if s is not None else [] for s in manifest["sentences"]]
    paths = manifest["image_path"].astype(str)
    dup_paths = paths[paths.duplicated(keep=False) & (paths != "")]
    texts = [" ".join(s) for s in sentences]
    study_reports = {}
    for study, text in zip(manifest["study_id"].astype(str) if "study_id" in manifest else [], texts):
        study_reports.setdefault(study, set()).add(text)
    split_studies = [s for s, t in study_reports.items() if len(t) > 1]
    counts: dict[str, int] = {}
    for text in texts:
        counts[text] = counts.get(text, 0) + 1
    repeated = sorted(((n, t) for t, n in counts.items() if n > 1 and t), reverse=True)
    control = [i for i, s in enumerate(sentences) if any(_CONTROL.search(x) for x in s)]
    return {
        "rows": int(len(manifest)),
        "image_used_twice": int(dup_paths.nunique()),
        "study_with_two_reports": len(split_studies),
        "empty_report": int(sum(not s for s in sentences)),
        "long_report": int(sum(len(s) > LONG_REPORT_SENTENCES for s in sentences)),
        "control_characters": len(control),
        "repeated_report_rows": int(sum(n for n, _ in repeated)),
        "blank_image": blank_image,
        "examples": {"image_used_twice": sorted(set(dup_paths))[:3], "study_with_two_reports": split_studies[:3],
                     "repeated_report": [t[:80] for _, t in repeated[:3]],
                     "control_characters_row": control[:3]},
    }


def summary_line(quality: dict) -> str:
    """One line: the counts that are not zero (or "no issues")."""
    keys = ("image_used_twice", "study_with_two_reports", "empty_report", "long_report", "control_characters",
            "repeated_report_rows", "blank_image")
    found = [f"{quality[k]} {k.replace('_', ' ')}" for k in keys if quality.get(k)]
    return f"data quality of {quality['rows']} rows: " + ("; ".join(found) if found else "no issues")


def write_quality(quality: dict, directory: str | Path) -> Path:
    from medclr.files import write_text

    path = Path(directory) / QUALITY_NAME
    write_text(path, json.dumps(quality, indent=2, sort_keys=True))
    return path
