"""Accessibility audit of the app's page: axe-core run inside headless Chromium on the page in use.

Not a timing benchmark. It serves the real app (a checkpoint and its index) in this process, drives the page in
headless Chromium (``medclr.app.browser``) through what a clinician does (upload a film, Analyse, the findings
table opened, similar studies, a text search), then injects axe-core and runs its WCAG 2.0/2.1 A and AA rules and
its best practices on the whole page. One JSON line per rule violated (id, impact, how many elements, the first
few of them, axe's help), then a summary line; exit 1 when a rule of impact serious or critical is violated.

axe-core comes from npm, outside the repository (nothing is downloaded at run time):

    npm install --prefix /tmp/axe axe-core
    python bench/app_a11y.py --axe /tmp/axe/node_modules/axe-core/axe.min.js \\
        --checkpoint W/checkpoint --index W/index --image film.png [--screenshot page.png]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]
RUN = """
const done = arguments[arguments.length - 1];
axe.run(document, {runOnly: {type: 'tag', values: arguments[0]}, resultTypes: ['violations']})
  .then(r => done(JSON.stringify(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
      count: v.nodes.length, nodes: v.nodes.slice(0, 4).map(n => ({target: n.target.join(' '),
      summary: (n.failureSummary || '').split('\\n').slice(0, 3).join(' ')}))})))))
  .catch(e => done('error: ' + e));
"""


def click_text(wd, selector: str, text: str) -> None:
    """Click the first ``selector`` element whose text starts with ``text``."""
    assert wd.js("for (const b of document.querySelectorAll(arguments[0])) {"
                 " if (b.textContent.trim().startsWith(arguments[1])) { b.click(); return true; } } return false;",
                 selector, text), f"nothing {selector} reads {text!r}"


def use_page(wd, url: str, image: Path, query: str) -> None:
    wd.get(url)
    wd.cmd("POST", f"/element/{wd.find('#upload_row input[type=file]')}/value", {"text": str(image)})
    wd.wait_for("const i = document.querySelector('#preview img'); return i && i.naturalWidth > 0;", what="preview")
    wd.cmd("POST", f"/element/{wd.find('#analyse')}/click", {})
    wd.wait_for("return document.querySelector('#legend').innerText.trim().length > 20;", what="the legend")
    click_text(wd, "button, .label-wrap, span", "Findings: probabilities")
    wd.cmd("POST", f"/element/{wd.find('#similar_btn')}/click", {})
    wd.wait_for("return document.querySelectorAll('#similar img').length > 0;", what="similar studies")
    click_text(wd, "button[role=tab]", "Images for a text")
    wd.js("const t = document.querySelector('textarea[placeholder*=pneumothorax], input[placeholder*=pneumothorax]');"
          "t.value = arguments[0]; t.dispatchEvent(new Event('input', {bubbles: true}));", query)
    time.sleep(0.5)
    click_text(wd, "button", "Search")
    wd.wait_for("return document.querySelectorAll('#by_text img').length > 0;", what="images for the text")
    time.sleep(1.0)


def audit(wd, axe: Path) -> list[dict]:
    wd.js(axe.read_text())
    wd.cmd("POST", "/timeouts", {"script": 120_000})
    out = wd.cmd("POST", "/execute/async", {"script": RUN, "args": [TAGS]})
    if not isinstance(out, str) or out.startswith("error"):
        raise RuntimeError(f"axe-core did not run: {str(out)[:300]}")
    return json.loads(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--axe", type=Path, required=True, help="axe.min.js from the npm package axe-core")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--image", type=Path, required=True, help="a chest film to upload")
    p.add_argument("--query", default="pleural effusion", help="the text search's query")
    p.add_argument("--screenshot", type=Path, help="also save the audited page as a PNG here")
    args = p.parse_args()
    from medclr.app.background import free_port
    from medclr.app.browser import headless_chromium
    from medclr.app.service import AppService
    from medclr.app.ui import build_blocks, launch
    from medclr.index import load_index
    from medclr.inference import load_checkpoint

    engine = load_checkpoint(args.checkpoint)
    demo = build_blocks(AppService(engine, load_index(args.index, engine)))
    _, url = launch(demo, port=free_port(), block=False)
    try:
        with tempfile.TemporaryDirectory() as profile, headless_chromium(Path(profile), (1400, 1000)) as wd:
            use_page(wd, url, args.image.resolve(), args.query)
            violations = audit(wd, args.axe)
            if args.screenshot:
                args.screenshot.write_bytes(wd.screenshot())
    finally:
        demo.close(verbose=False)
    for v in violations:
        print(json.dumps(v), flush=True)
    serious = [v["id"] for v in violations if v["impact"] in ("serious", "critical")]
    print(json.dumps({"rules_violated": len(violations), "elements": sum(v["count"] for v in violations),
                      "serious_or_critical": serious, "tags": TAGS}))
    return 1 if serious else 0


if __name__ == "__main__":
    sys.exit(main())
