"""The app's private temporary folder: everything Gradio and the app write while serving goes into one
folder per process, made with ``tempfile.mkdtemp`` (mode 0700), removed when the process ends.

* Gradio is pointed at it through ``GRADIO_TEMP_DIR`` (Gradio 6 reads the variable when a Blocks and
  its server are built, so it is set when this module is imported, before the page is built). Uploads
  land in ``<root>/<sha256 of the content>/<the uploaded file's name>``; the service deletes each one
  (and its folder) as soon as it has read it.
* Result images (preview, heatmap, thumbnails) are written to ``<root>/results/`` under fresh random
  names (``render.save_png``): a file that is being downloaded is never rewritten.
* ``RefuseUploadDownloads`` keeps ``/gradio_api/file=<path>`` from serving anything under the root
  except ``results/``: an uploaded original is never sent back, not even before it has been read.
* ``sweep`` removes what is older than the retention time (results, uploads no request ever read,
  the empty ``tmp*`` files Gradio 6.31 leaves per file event); the root itself goes on exit (atexit,
  and SIGTERM/SIGHUP become a normal exit in ``medclr app``, SIGINT a Ctrl-C even when inherited
  ignored), and a root left by a process that was
  killed outright (SIGKILL, power loss) is removed by the next start in the same base folder.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("medclr.app")

PREFIX = "medclr-app-"
RESULTS = "results"
_STALE = re.compile(re.escape(PREFIX) + r"(\d+)-[A-Za-z0-9_]+")

_lock = threading.Lock()
_root: Path | None = None
_sweeper: threading.Thread | None = None


def private_temp_dir() -> Path:
    """This process's private folder (made on the first call, inside ``GRADIO_TEMP_DIR`` if the user set
    one, else the system temp folder); sets ``GRADIO_TEMP_DIR`` to it."""
    global _root
    with _lock:
        if _root is None:
            base = Path(os.environ.get("GRADIO_TEMP_DIR") or tempfile.gettempdir())
            base.mkdir(parents=True, exist_ok=True)
            remove_stale(base)
            root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base)).resolve()
            (root / RESULTS).mkdir(mode=0o700)
            atexit.register(remove_private_temp_dir)
            _root = root
        os.environ["GRADIO_TEMP_DIR"] = str(_root)
        return _root


def results_dir() -> Path:
    return private_temp_dir() / RESULTS


def remove_private_temp_dir() -> None:
    """Delete the private folder and everything in it (idempotent)."""
    global _root
    with _lock:
        root, _root = _root, None
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale(base: Path) -> list[Path]:
    """Remove the private folders in ``base`` left by app processes of this user that no longer run."""
    removed = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for d in entries:
        m = _STALE.fullmatch(d.name)
        if not m or d.is_symlink() or not d.is_dir():
            continue
        try:
            if d.stat().st_uid != os.getuid() or _alive(int(m.group(1))):
                continue
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    if removed:
        log.info("app: removed %d temporary folder(s) left by app processes that no longer run", len(removed))
    return removed


def _inside(path: str, folder: str) -> bool:
    # compared case-insensitively, like Gradio's own blocked_paths: on a case-insensitive file system
    # /TMP/X and /tmp/x are the same file
    path, folder = path.lower(), folder.lower().rstrip(os.sep)
    return path == folder or path.startswith(folder + os.sep)


def is_upload(path: str | os.PathLike) -> bool:
    """True for a file under the private folder that is not a result: an upload (or Gradio's scratch)."""
    with _lock:
        root = _root
    if root is None:
        return False
    for p in {os.path.abspath(path), os.path.realpath(path)}:
        if _inside(p, str(root)) and not _inside(p, str(root / RESULTS)):
            return True
    return False


def discard_upload(path: str | os.PathLike) -> None:
    """Delete an uploaded file, and its Gradio folder ``<root>/<sha256>/`` when that is left empty."""
    if not is_upload(path):
        return
    p = Path(os.path.abspath(path))
    try:
        p.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("app: could not delete an upload (%s)", type(exc).__name__)
        return
    root = private_temp_dir()
    if p.parent != root and is_upload(p.parent):
        try:
            p.parent.rmdir()
        except OSError:  # not empty: the same content uploaded under another name, not yet read
            pass


def sweep(root: Path, max_age_s: float, now: float | None = None) -> int:
    """Remove files under ``root`` last modified more than ``max_age_s`` ago, then empty folders as old
    (a new upload folder is never removed before Gradio has moved its file in). Returns files removed."""
    now = time.time() if now is None else now
    removed = 0
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            f = os.path.join(dirpath, name)
            try:
                if now - os.lstat(f).st_mtime > max_age_s:
                    os.unlink(f)
                    removed += 1
            except OSError:
                pass
        d = Path(dirpath)
        if d == root or d == root / RESULTS:
            continue
        try:
            if now - os.lstat(d).st_mtime > max_age_s:
                d.rmdir()  # only when empty
        except OSError:
            pass
    return removed


def start_sweeper(max_age_s: float, every_s: float = 60.0, after: Callable[[], None] | None = None) -> None:
    """Sweep the private folder every ``every_s`` seconds, in a daemon thread (once per process); ``after``: run
    after each sweep (what else a long-running server tidies once a minute)."""
    global _sweeper
    root = private_temp_dir()
    with _lock:
        if _sweeper is not None:
            return

        def loop():
            while True:
                time.sleep(every_s)
                with _lock:
                    current = _root
                if current is None:
                    return
                n = sweep(current, max_age_s)
                if n:
                    log.info("app: removed %d temporary file(s) older than %.0f min", n, max_age_s / 60)
                if after is not None:
                    after()

        _sweeper = threading.Thread(target=loop, name="medclr-app-sweeper", daemon=True)
        _sweeper.start()
    log.debug("app: temporary files in %s, kept at most %.0f min", root, max_age_s / 60)


def exit_on_signals(signals=(signal.SIGTERM, signal.SIGHUP)) -> None:
    """Turn these signals into ``SystemExit`` (128 + signal number) so that ``finally`` blocks and atexit
    run (the default action of SIGTERM ends the process without either), and make SIGINT raise
    ``KeyboardInterrupt`` even where the process inherited it ignored. Main thread only.

    The first of these signals starts the exit; later ones are ignored, so that a supervisor repeating
    SIGTERM cannot cut the cleanup short and leave the folder behind (SIGKILL still ends it at once)."""

    def handler(signum, frame):  # noqa: ARG001
        for s in signals:
            signal.signal(s, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for s in signals:
        signal.signal(s, handler)
    # A shell starts `cmd &` (and everything cmd starts) with SIGINT ignored, and Python then keeps it
    # ignored: `kill -INT` would never stop the app, nor remove its folder (a CI run started in the
    # background hung in tests/test_app_privacy.py for that reason). Like uvicorn, stop on it anyway.
    signal.signal(signal.SIGINT, signal.default_int_handler)


class RefuseUploadDownloads:
    """ASGI middleware: ``/gradio_api/file=<path>`` (and the older ``/gradio_api/file/<path>``) answers
    404 for any path under the private folder except ``results/``. Gradio serves every file in its
    upload folder to anyone who names it; here an uploaded original is never served back."""

    _ROUTE = re.compile(r"/gradio_api/file[=/]")

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") == "http":
            m = self._ROUTE.search(scope.get("path", ""))
            if m and is_upload(scope["path"][m.end():]):
                from starlette.responses import PlainTextResponse

                await PlainTextResponse("Not found", status_code=404)(scope, receive, send)
                return
        await self.app(scope, receive, send)
