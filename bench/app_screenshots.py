"""The app in headless Chromium on six films of known findings: what a clinician sees, as screenshots and JSON lines.

Not a timing benchmark: it serves the real app (a checkpoint and its index) in this process, drives the page
in headless Chromium (``medclr.app.browser``, as the browser test does) and, for one film per CheX5 finding
(the first study of the manifest's test split positive for that finding only, one whose report places it on
one side where the finding has sides) and a normal one (the first test study labelled "No Finding"; a phantom made
before its test split had normal studies gives a validate one), uploads it, presses Analyse and asks for five heatmaps:

* ``map``: the true finding's own phrase, on the side its report names;
* ``negation``: that phrase denied ("no left pleural effusion");
* ``other``: the other side (for a finding without sides, another size: "severe cardiomegaly");
* ``synonym``: the finding in other words ("enlarged heart"; the normal film: "lungs are clear");
* ``absent``: a finding the film does not have.

Per heatmap it prints one JSON line (the film, the phrase, the labels and notes of the findings box, the legend) and
writes ``<film>_<shot>.png`` to --out.

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
SYNONYM = {"Cardiomegaly": "enlarged heart", "Edema": "vascular congestion", "Pleural Effusion": "pleural fluid",
           "Pneumonia": "pneumonitis", "Pneumothorax": "pleural air", "No Finding": "lungs are clear"}
SIZED = {"Cardiomegaly": "severe cardiomegaly", "Edema": "severe pulmonary edema"}  # "other" for findings without sides
ABSENT = {"Cardiomegaly": "pneumothorax", "Edema": "pneumothorax", "Pleural Effusion": "cardiomegaly",
          "Pneumonia": "cardiomegaly", "Pneumothorax": "cardiomegaly", "No Finding": "pneumothorax"}
SIDED = ("Pleural Effusion", "Pneumonia", "Pneumothorax")


def films(manifest: str) -> dict[str, tuple[Path, str | None]]:
    """{finding: (film, the side its report names or None)}."""
    from medclr.data.hard_negatives import meaning_key
    from medclr.data.labels import CHEX5
    from medclr.data.manifest import read_manifest

    m = read_manifest(manifest)
    root = Path(m.attrs["root"] or Path(manifest).parent)

    def where(row) -> Path:
        return Path(row["image_path"]) if Path(row["image_path"]).is_absolute() else root / row["image_path"]

    out = {}
    for c in CHEX5:
        others = [o for o in CHEX5 if o != c]
        rows = m[(m["split"] == "test") & (m[c] == 1.0) & (m[others] != 1.0).all(axis=1)]
        out[c] = (where(rows.iloc[0]), None)
        if c in SIDED:
            for _, row in rows.iterrows():
                keys = [meaning_key(s) for s in row["sentences"]]
                side = next((k.rsplit(":", 1)[1] for k in keys if k.startswith(f"+{c.lower()}:")), None)
                if side:
                    out[c] = (where(row), side)
                    break
    normal = m[m["No Finding"] == 1.0]
    tested = normal[normal["split"] == "test"]
    out["No Finding"] = (where((tested if len(tested) else normal[normal["split"] == "validate"]).iloc[0]), None)
    return out


def shots(finding: str, side: str | None) -> dict[str, str]:
    """{shot: phrase} for one film (module docstring)."""
    own = f"{side} {PHRASE[finding]}" if side else PHRASE[finding]
    if side:
        other = f"{'right' if side == 'left' else 'left'} {PHRASE[finding]}"
    elif finding in SIZED:
        other = SIZED[finding]
    else:
        other = f"left {PHRASE[finding]}"
    return {"map": own, "negation": f"no {own}", "other": other, "synonym": SYNONYM[finding], "absent": ABSENT[finding]}


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
            for finding, (path, side) in films(args.manifest).items():
                for line in shoot(wd, url, finding, path, shots(finding, side), args.out):
                    print(json.dumps(line), flush=True)
            print(json.dumps(retrieval(wd, args.out)), flush=True)
    finally:
        demo.close(verbose=False)


STATUS = "return document.querySelector('#status').innerText.trim();"


def _answer(wd, before: str) -> str:
    """Wait for the status line to change from ``before`` (each answer stamps it), then return the legend."""
    wd.wait_for(f"const s = document.querySelector('#status').innerText.trim(); return s && s !== {json.dumps(before)};",
                what="the answer")
    time.sleep(0.7)  # the picture's paint
    return wd.js("return document.querySelector('#legend').innerText.trim();")


def _set_phrase(wd, phrase: str) -> None:
    wd.js("const t = document.querySelector('#phrase textarea, #phrase input');"
          "t.value = arguments[0]; t.dispatchEvent(new Event('input', {bubbles: true}));", phrase)
    time.sleep(0.4)


def shoot(wd, url: str, finding: str, path: Path, phrases: dict[str, str], out: Path) -> list[dict]:
    wd.get(url)
    wd.cmd("POST", f"/element/{wd.find('#upload_row input[type=file]')}/value", {"text": str(path)})
    wd.wait_for("const i = document.querySelector('#preview img'); return i && i.naturalWidth > 0;", what="preview")
    stem, lines = finding.lower().replace(" ", "_"), []
    for n, (shot, phrase) in enumerate(phrases.items()):
        _set_phrase(wd, phrase)
        before = wd.js(STATUS)
        wd.cmd("POST", f"/element/{wd.find('#analyse' if n == 0 else '#ground_btn')}/click", {})
        legend = _answer(wd, before)
        wd.js("window.scrollTo(0, 0);")
        (out / f"{stem}_{shot}.png").write_bytes(wd.screenshot())
        labels = wd.js("return document.querySelector('#findings').innerText;")
        note = wd.js("return document.querySelector('#findings_note').innerText;")
        lines.append({"film": finding, "image": path.name, "shot": shot, "phrase": phrase,
                      "labels": " ".join(labels.split()), "findings_note": " ".join(note.split()), "legend": legend})
    return lines


def retrieval(wd, out: Path, query: str = "pneumonia") -> dict:
    """The two retrieval tabs on the last film: its similar studies, then the images for ``query``; each
    screenshot with its note (what the results cannot show) and the first captions."""
    from app_a11y import click_text  # noqa: PLC0415 - bench/ is this script's own folder

    found = {}
    for name, button, gallery, note in (("similar", "#similar_btn", "#similar", "#similar_note"),
                                        ("by_text", None, "#by_text", "#text_note")):
        before = wd.js(STATUS)
        if button:
            wd.cmd("POST", f"/element/{wd.find(button)}/click", {})
        else:
            click_text(wd, "button[role=tab]", "Images for a text")
            wd.js("const t = document.querySelector('textarea[placeholder*=pneumothorax]');"
                  "t.value = arguments[0]; t.dispatchEvent(new Event('input', {bubbles: true}));", query)
            time.sleep(0.4)
            click_text(wd, "button", "Search")
        _answer(wd, before)
        wd.js(f"document.querySelector('{gallery}').scrollIntoView();")
        time.sleep(0.5)
        (out / f"{name}.png").write_bytes(wd.screenshot())
        found[name] = {"note": wd.js(f"return document.querySelector('{note}').innerText.trim();"),
                       "captions": wd.js(f"return [...document.querySelectorAll('{gallery} .caption-label')]"
                                         ".slice(0, 4).map(c => c.innerText);")}
    return {"query": query, **found}


if __name__ == "__main__":
    main()
