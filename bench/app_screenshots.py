"""The app in headless Chromium on six kinds of film: what a clinician sees, as screenshots and JSON lines.

Not a timing benchmark: it serves the real app (a checkpoint and its index) in this process, drives the page
in headless Chromium (``medclr.app.browser``, as the browser test does), and for one film per CheX5
finding plus a normal one (the first study of the manifest's test split positive for that finding only, and
the first validate study labelled "No Finding") uploads it, presses Analyse with the finding's own phrase,
then asks for the heatmap of a finding that is not on the film. Per film it prints one JSON line (the labels
shown, the greyed-out findings, both legends) and writes two screenshots to --out.

    python bench/app_screenshots.py --checkpoint W/checkpoint --index W/index --manifest W/manifest.parquet --out shots/
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

PHRASE = {"Cardiomegaly": "cardiomegaly", "Edema": "pulmonary edema", "Pleural Effusion": "pleural effusion",
          "Pneumonia": "pneumonia", "Pneumothorax": "pneumothorax", "No Finding": "pleural effusion"}
ABSENT = {"Cardiomegaly": "pneumothorax", "Edema": "pneumothorax", "Pleural Effusion": "pneumothorax",
          "Pneumonia": "cardiomegaly", "Pneumothorax": "cardiomegaly", "No Finding": "pneumothorax"}


# the legend's text once Gradio's progress line has gone, and when it differs from PREVIOUS
LEGEND = ("const l = document.querySelector('#legend').innerText.trim(); "
          "return l.length > 10 && !/processing|\\d+\\.\\ds/.test(l) && l !== PREVIOUS ? l : '';")


def films(manifest: str) -> dict[str, Path]:
    from medclr.data.labels import CHEX5
    from medclr.data.manifest import read_manifest

    m = read_manifest(manifest)
    root = Path(m.attrs["root"] or Path(manifest).parent)

    def where(row) -> Path:
        return Path(row["image_path"]) if Path(row["image_path"]).is_absolute() else root / row["image_path"]

    out = {}
    for c in CHEX5:
        others = [o for o in CHEX5 if o != c]
        out[c] = where(m[(m["split"] == "test") & (m[c] == 1.0) & (m[others] != 1.0).all(axis=1)].iloc[0])
    out["No Finding"] = where(m[(m["split"] == "validate") & (m["No Finding"] == 1.0)].iloc[0])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    from medclr.app.background import free_port
    from medclr.app.browser import headless_chromium
    from medclr.app.service import AppService
    from medclr.app.ui import build_blocks, launch
    from medclr.index import load_index
    from medclr.inference import load_checkpoint

    args.out.mkdir(parents=True, exist_ok=True)
    engine = load_checkpoint(args.checkpoint)
    demo = build_blocks(AppService(engine, load_index(args.index, engine)))
    _, url = launch(demo, port=free_port(), block=False)
    try:
        with tempfile.TemporaryDirectory() as profile, headless_chromium(Path(profile), (1400, 900)) as wd:
            for finding, path in films(args.manifest).items():
                print(json.dumps(shoot(wd, url, finding, path, args.out)), flush=True)
    finally:
        demo.close()


def _set_phrase(wd, phrase: str) -> None:
    wd.js("const t = document.querySelector('#phrase textarea, #phrase input');"
          "t.value = arguments[0]; t.dispatchEvent(new Event('input', {bubbles: true}));", phrase)


def shoot(wd, url: str, finding: str, path: Path, out: Path) -> dict:
    wd.get(url)
    wd.cmd("POST", f"/element/{wd.find('#upload_row input[type=file]')}/value", {"text": str(path)})
    wd.wait_for("const i = document.querySelector('#preview img'); return i && i.naturalWidth > 0;", what="preview")
    _set_phrase(wd, PHRASE[finding])
    time.sleep(0.5)
    wd.cmd("POST", f"/element/{wd.find('#analyse')}/click", {})
    wd.wait_for("return document.querySelector('#findings').innerText.length > 3 || "
                "document.querySelector('#findings_note').innerText.length > 3;", what="findings")
    present = wd.wait_for(LEGEND.replace("PREVIOUS", '""'), what="the legend")
    time.sleep(0.7)
    stem = finding.lower().replace(" ", "_")
    (out / f"{stem}.png").write_bytes(wd.screenshot())
    labels = wd.js("return document.querySelector('#findings').innerText;")
    note = wd.js("return document.querySelector('#findings_note').innerText;")
    _set_phrase(wd, ABSENT[finding])
    time.sleep(0.5)
    wd.cmd("POST", f"/element/{wd.find('#ground_btn')}/click", {})
    absent = wd.wait_for(LEGEND.replace("PREVIOUS", json.dumps(present)), what="the second legend")
    time.sleep(0.7)
    (out / f"{stem}_absent.png").write_bytes(wd.screenshot())
    return {"film": finding, "image": path.name, "labels": " ".join(labels.split()), "not_shown": note,
            "phrase": PHRASE[finding], "legend": present, "absent_phrase": ABSENT[finding], "absent_legend": absent}


if __name__ == "__main__":
    main()
