"""The real page in a real browser: headless Debian Chromium driven through chromedriver's W3C WebDriver
HTTP API (no Selenium needed, nothing downloaded). Uploads the RG1 DICOM through the page's file input,
under a file name that holds a (fake) patient's name, checks that the name appears nowhere in the page,
presses Analyse, and waits for the findings and the heatmap. The screenshot goes to tmp_path (the docs'
screenshots come from a trained demo model: bench/app_screenshots.py).

Skips (with the reason) only when /usr/bin/chromium is absent.
"""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path

import pytest

from medclr.app.browser import CHROMIUM, headless_chromium
from tests.conftest_app import app_assets, engine, free_port, index_dir, rg1_path  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="/usr/bin/chromium is absent (apt-get install -y chromium chromium-driver)")


@pytest.fixture()
def browser(tmp_path):
    try:
        with headless_chromium(tmp_path / "profile") as wd:
            yield wd
    except FileNotFoundError as exc:
        pytest.fail(f"/usr/bin/chromium is installed but {exc}")


@pytest.fixture()
def served(engine, index_dir):  # noqa: F811
    from medclr.app.service import AppService
    from medclr.app.ui import build_blocks, launch
    from medclr.index import load_index

    demo = build_blocks(AppService(engine, load_index(index_dir, engine)))
    _, url = launch(demo, port=free_port(), block=False)
    yield url
    demo.close()


def test_upload_in_the_real_page_shows_findings_and_heatmap(browser, served, tmp_path):
    named = tmp_path / "Doe_Jane_MRN-778899_chest.dcm"  # archive exports name files after the patient
    shutil.copyfile(rg1_path(), named)
    browser.get(served)
    file_input = browser.find("#upload_row input[type=file]")
    browser.cmd("POST", f"/element/{file_input}/value", {"text": str(named)})
    # the preview appears once the upload is read (DICOM rendered, MONOCHROME1 inverted)
    browser.wait_for("const i = document.querySelector('#preview img'); return i && i.naturalWidth > 0;",
                     what="the preview image")
    # the first screen names the model it serves (here a trained checkpoint, by its folder's name only)
    assert browser.js("return document.querySelector('#model_line').innerText;").startswith(
        "Serving the checkpoint checkpoint")
    facts = browser.js("return document.querySelector('#facts').innerText;")
    assert "1841 x 1955" in facts and "MONOCHROME1" in facts
    # the upload control is a button: the file's name is neither shown nor anywhere in the page's markup
    page = browser.js("return document.body.innerText + document.documentElement.outerHTML;")
    assert "Doe_Jane" not in page and "778899" not in page
    # the relative colour scale (the default) makes a weak model's heatmap visible in the screenshot
    assert browser.js("for (const l of document.querySelectorAll('label')) {"
                      " if (l.textContent.trim() === 'relative') { l.click(); return true; } } return false;")
    browser.cmd("POST", f"/element/{browser.find('#analyse')}/click", {})
    text = browser.wait_for(
        "const t = document.querySelector('#findings').innerText; return t.includes('Pneumothorax') ? t : '';",
        what="the CheX5 findings")
    for cls in ("Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax"):
        assert cls in text
    assert browser.wait_for("const i = document.querySelector('#heatmap img'); "
                            "return i && i.complete && i.naturalWidth > 0 ? i.naturalWidth : 0;",
                            what="the heatmap overlay")
    # each answer stamps the status line, so asking again for the same map still shows that it ran
    first = browser.wait_for("const s = document.querySelector('#status [role=status]'); return s ? s.innerText : '';",
                             what="the status line")
    assert first.startswith("Findings and heatmap: answered at")
    time.sleep(1.1)  # the stamp counts seconds
    browser.cmd("POST", f"/element/{browser.find('#ground_btn')}/click", {})
    again = browser.wait_for("const s = document.querySelector('#status [role=status]').innerText;"
                             f"return s !== {first!r} ? s : '';", what="a new status line")
    assert again.startswith("Heatmap: answered at")
    # the output galleries take no uploads (no file input, no "Click to Upload")
    assert browser.js("return document.querySelectorAll('#similar input[type=file], #by_text input[type=file], "
                      "#similar [aria-label*=Upload], #by_text [aria-label*=Upload]').length;") == 0
    # open the accordion that holds the probabilities, their validation and the prompt pairs used
    browser.js("for (const b of document.querySelectorAll('button, .label-wrap, span')) {"
               " if (b.textContent.trim().startsWith('Findings: probabilities')) { b.click(); return true; } } return false;")
    prompts = browser.wait_for("const p = document.querySelector('#prompts'); "
                               "return p && p.textContent.includes('Heart size normal') ? p.textContent : '';",
                               timeout=20, what="the prompt pairs table")
    assert "No signs of pneumonia" in prompts and "Heart size normal" in prompts
    time.sleep(0.5)  # let the last paint settle before the screenshot
    png = browser.screenshot()
    from PIL import Image

    shot = Image.open(io.BytesIO(png))
    assert shot.size[0] >= 1000
    out = tmp_path / "app.png"
    out.write_bytes(png)
    # similar studies: two rows of results (6 a row), every caption whole: not cut at its tile's edge nor at the
    # gallery's (a fixed-height gallery hid the second row's captions below its edge)
    browser.cmd("POST", f"/element/{browser.find('#similar_btn')}/click", {})
    browser.wait_for("return document.querySelectorAll('#similar .thumbnail-item .caption-label').length === 8;",
                     what="8 similar studies")
    captions = browser.js(CAPTIONS_SHOWN)
    assert [c["text"].split(" · ")[0] for c in captions] == [f"#{i}" for i in range(1, 9)]
    assert [c for c in captions if not (c["fits"] and c["in_tile"] and c["in_gallery"])] == []


# Per caption of the similar-studies gallery: its text, whether its box holds all of it (no overflow), and whether
# the box lies within its tile and within the gallery's (1 px of rounding allowed).
CAPTIONS_SHOWN = """
const inside = (a, b) => a.top >= b.top - 1 && a.bottom <= b.bottom + 1 && a.left >= b.left - 1 && a.right <= b.right + 1;
const gallery = document.querySelector('#similar').getBoundingClientRect();
return [...document.querySelectorAll('#similar .thumbnail-item')].map(t => {
  const c = t.querySelector('.caption-label'), box = c.getBoundingClientRect();
  return {text: c.textContent.trim(), fits: c.scrollWidth <= c.clientWidth && c.scrollHeight <= c.clientHeight,
          in_tile: inside(box, t.getBoundingClientRect()), in_gallery: inside(box, gallery)};
});
"""
