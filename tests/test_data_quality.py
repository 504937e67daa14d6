"""The data-quality summary a training run and `lm fit` write: each count against a hand-built manifest."""

from __future__ import annotations

import json

import pandas as pd

from medclr.data.quality import LONG_REPORT_SENTENCES, data_quality, summary_line, write_quality


def test_counts_what_trains_badly(tmp_path):
    rows = pd.DataFrame({
        "study_id": ["s1", "s1", "s2", "s3", "s4", "s5"],
        "image_path": ["a.png", "a.png", "b.png", "c.png", "d.png", "e.png"],
        "sentences": [["No acute process."], ["Left effusion."], ["No acute process."], [],
                      ["x."] * (LONG_REPORT_SENTENCES + 1), ["Heart\x00 size normal."]],
    })
    q = data_quality(rows)
    assert q["rows"] == 6 and q["image_used_twice"] == 1 and q["study_with_two_reports"] == 1
    assert q["empty_report"] == 1 and q["long_report"] == 1 and q["control_characters"] == 1
    assert q["repeated_report_rows"] == 2 and q["examples"]["repeated_report"] == ["No acute process."]
    line = summary_line(q)
    assert line.startswith("data quality of 6 rows: 1 image used twice; 1 study with two reports;") and "\n" not in line
    path = write_quality(q, tmp_path)
    assert json.loads(path.read_text())["long_report"] == 1
    clean = data_quality(rows.iloc[[2]])
    assert summary_line(clean) == "data quality of 1 rows: no issues"


def test_blank_images_are_counted_only_where_the_pixels_were_read():
    """`lm fit` reads no image: its summary leaves the field null; training passes what its cache found."""
    rows = pd.DataFrame({"study_id": ["s1", "s2"], "image_path": ["a.png", "b.png"],
                         "sentences": [["No acute process."], ["Left effusion."]]})
    assert data_quality(rows)["blank_image"] is None and summary_line(data_quality(rows)).endswith("no issues")
    q = data_quality(rows, blank_image=1)
    assert q["blank_image"] == 1 and summary_line(q) == "data quality of 2 rows: 1 blank image"
