"""The real page in a real browser: headless Debian Chromium driven through chromedriver's W3C WebDriver
HTTP API (no Selenium needed, nothing downloaded). Uploads the RG1 DICOM through the page's file input,
under a file name that holds a (fake) patient's name, checks that the name appears nowhere in the page,
presses Analyse, and waits for the findings and the heatmap. The screenshot goes to tmp_path, and to
docs/img/app.png when MEDCLR_UPDATE_SCREENSHOT=1.

Skips (with the reason) only when /usr/bin/chromium is absent.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest_app import app_assets, engine, free_port, index_dir, rg1_path  # noqa: F401 - fixtures

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="/usr/bin/chromium is absent (apt-get install -y chromium chromium-driver)")




class WebDriver:
    """The few W3C WebDriver commands this test needs, over plain HTTP."""

    ELEMENT = "element-6066-11e4-a52e-4f735466cecf"

    def __init__(self, driver_url: str, args: list[str]) -> None:
        self.base = driver_url
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": str(CHROMIUM), "args": args}}}}
        self.sid = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read() or b"{}")["value"]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"webdriver {method} {path}: {exc.read()[:500]!r}") from None

    def cmd(self, method: str, path: str, body: dict | None = None):
        return self._call(method, f"/session/{self.sid}{path}", body)

    def get(self, url: str) -> None:
        self.cmd("POST", "/url", {"url": url})

    def find(self, css: str, timeout: float = 30.0) -> str:
        end = time.time() + timeout
        while True:
            found = self.cmd("POST", "/elements", {"using": "css selector", "value": css})
            if found:
                return found[0][self.ELEMENT]
            if time.time() > end:
                raise AssertionError(f"no element {css!r} after {timeout:.0f} s")
            time.sleep(0.2)

    def js(self, script: str, *args):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, script: str, timeout: float = 60.0, what: str = ""):
        end = time.time() + timeout
        while True:
            value = self.js(script)
            if value:
                return value
            if time.time() > end:
                raise AssertionError(f"timed out waiting for {what or script}")
            time.sleep(0.25)

    def screenshot(self) -> bytes:
        return base64.b64decode(self.cmd("GET", "/screenshot"))

    def quit(self) -> None:
        try:
            self._call("DELETE", f"/session/{self.sid}")
        except Exception:  # noqa: BLE001
            pass


@pytest.fixture()
def browser(tmp_path):
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not Path(driver).exists():
        pytest.fail("/usr/bin/chromium is installed but chromedriver is not (apt-get install -y chromium-driver)")
    port = free_port()
    proc = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.time() + 20
        while True:
            try:
                with urllib.request.urlopen(url + "/status", timeout=2) as r:
                    if json.loads(r.read())["value"].get("ready"):
                        break
            except OSError:
                pass
            if time.time() > end:
                raise AssertionError("chromedriver did not start")
            time.sleep(0.2)
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-dev-shm-usage", "--window-size=1400,1000", "--hide-scrollbars",
                f"--user-data-dir={tmp_path / 'profile'}", "--no-first-run", "--disable-extensions",
                "--disable-sync", "--disable-component-update", "--disable-default-apps"]
        wd = WebDriver(url, args)
        yield wd
        wd.quit()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


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
    facts = browser.js("return document.querySelector('#facts').innerText;")
    assert "1841 x 1955" in facts and "MONOCHROME1" in facts
    # the upload control is a button: the file's name is neither shown nor anywhere in the page's markup
    page = browser.js("return document.body.innerText + document.documentElement.outerHTML;")
    assert "Doe_Jane" not in page and "778899" not in page
    # the relative colour scale makes a weak model's heatmap visible in the screenshot
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
    # open the accordion that holds the prompt pairs used
    browser.js("for (const b of document.querySelectorAll('button, .label-wrap, span')) {"
               " if (b.textContent.trim().startsWith('Prompt pairs used')) { b.click(); return true; } } return false;")
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
    if os.environ.get("MEDCLR_UPDATE_SCREENSHOT") == "1":
        target = REPO / "docs" / "img" / "app.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        img = shot.convert("RGB")
        img.save(target, optimize=True)
        if target.stat().st_size >= 1_000_000:
            img.quantize(colors=256).save(target, optimize=True)
        assert target.stat().st_size < 1_000_000
