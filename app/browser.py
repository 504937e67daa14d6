"""Headless Chromium driving the app: the W3C WebDriver commands the browser test and the screenshots
of the docs (bench/app_screenshots.py) need, over plain HTTP to Debian's chromedriver (no Selenium, nothing
downloaded). Chromium starts with ``--headless --no-sandbox --disable-gpu --disable-background-networking``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from medclr.app.background import free_port

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage",
        "--hide-scrollbars", "--no-first-run", "--disable-extensions", "--disable-sync", "--disable-component-update",
        "--disable-default-apps"]


class WebDriver:
    """The few W3C WebDriver commands the app's browser test and screenshots need, over plain HTTP."""

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
            raise RuntimeError(f"webdriver {method} {path}: {exc.read()[:500]!r}") from None

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
                raise TimeoutError(f"no element {css!r} after {timeout:.0f} s")
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
                raise TimeoutError(f"timed out waiting for {what or script}")
            time.sleep(0.25)

    def screenshot(self) -> bytes:
        return base64.b64decode(self.cmd("GET", "/screenshot"))

    def quit(self) -> None:
        try:
            self._call("DELETE", f"/session/{self.sid}")
        except Exception:  # noqa: BLE001
            pass


@contextlib.contextmanager
def headless_chromium(profile: Path, window: tuple[int, int] = (1400, 1000)) -> Iterator[WebDriver]:
    """A WebDriver session in a fresh headless Chromium (its profile under ``profile``); chromedriver and the
    browser stop when the block ends. Raises FileNotFoundError when chromedriver is not installed."""
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not Path(driver).exists():
        raise FileNotFoundError("chromedriver is not installed (apt-get install -y chromium chromium-driver)")
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
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.2)
        wd = WebDriver(url, [*ARGS, f"--window-size={window[0]},{window[1]}", f"--user-data-dir={profile}"])
        try:
            yield wd
        finally:
            wd.quit()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
