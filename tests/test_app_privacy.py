"""Issue 17, items 1 and 7, on the real app (a Gradio server on a free local port, driven over HTTP and
with gradio_client):

* uploads are deleted once read, leave neither their name nor their bytes in the app's temp folder,
  and are never served back through /gradio_api/file= (not even before they are read);
* the temp folder goes when the app process stops (SIGTERM, Ctrl-C, normal exit), and a folder left by a
  killed process goes at the next start;
* result images get a fresh file per request and are never rewritten, so identical concurrent requests
  all download complete, identical pictures.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest_app import app_assets, engine, free_port, index_dir, served_app  # noqa: F401 - fixtures
from tests.dicom_factory import make_dicom

os.environ["HF_HUB_OFFLINE"] = "1"  # gradio_client's own telemetry (docs/app.md, "API")
REPO = Path(__file__).resolve().parents[1]
FAKE_NAME = "Doe_Jane_MRN-778899_chest.dcm"  # a file name as an archive export might write it
PATIENT_ID = "MRN-778899"




def _identified_dicom(folder: Path, name: str = FAKE_NAME, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:256, 0:256] / 256
    img = 3000 - 1800 * (np.exp(-((xx - 0.3) ** 2 / 0.02 + (yy - 0.5) ** 2 / 0.08))
                         + np.exp(-((xx - 0.7) ** 2 / 0.02 + (yy - 0.5) ** 2 / 0.08)))
    img += rng.normal(0, 40, img.shape)
    return make_dicom(folder / name, np.clip(img, 0, 4095).astype(np.uint16), bits_stored=12,
                      PatientName="Doe^Jane", PatientID=PATIENT_ID, PatientBirthDate="19500101")


@pytest.fixture(scope="module")
def server(engine, index_dir):  # noqa: F811
    with served_app(engine, index_dir) as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    from gradio_client import Client

    return Client(server[0], verbose=False, analytics_enabled=False, download_files=False)


def _upload(url: str, path: Path) -> str:
    """POST /gradio_api/upload as the page does; returns the path the server stored the file under."""
    import httpx

    r = httpx.post(f"{url}/gradio_api/upload", files={"files": (path.name, path.read_bytes())}, timeout=60)
    r.raise_for_status()
    return r.json()[0]


def _call(url: str, api_name: str, data: list):
    """The two-step HTTP API: POST the inputs, read the event stream; returns the outputs or the error."""
    import httpx

    r = httpx.post(f"{url}/gradio_api/call/{api_name}", json={"data": data}, timeout=60)
    r.raise_for_status()
    event_id = r.json()["event_id"]
    with httpx.stream("GET", f"{url}/gradio_api/call/{api_name}/{event_id}", timeout=120) as resp:
        event = None
        for line in resp.iter_lines():
            if line.startswith("event: "):
                event = line[7:].strip()
            elif line.startswith("data: ") and event in ("complete", "error"):
                payload = json.loads(line[6:])
                if event == "error":
                    raise RuntimeError(str(payload))
                return payload
    raise AssertionError(f"no result from {api_name}")


def _file(path: str) -> dict:
    return {"path": path, "meta": {"_type": "gradio.FileData"}}


def _leftovers(root: Path, name: str, data: bytes) -> list[str]:
    """Everything under the app's temp folder that carries the upload's name, its bytes or the patient id."""
    found = []
    for f in root.rglob("*"):
        if name in f.name or "Doe_Jane" in str(f) or "778899" in str(f):
            found.append(f"name: {f}")
        elif f.is_file():
            content = f.read_bytes()
            if content == data or PATIENT_ID.encode() in content or b"Doe^Jane" in content:
                found.append(f"content: {f}")
    return found


def test_upload_is_deleted_once_read_and_never_served(server, tmp_path):
    import httpx

    from medclr.app import tempdir

    url, _ = server
    root = tempdir.private_temp_dir()
    src = _identified_dicom(tmp_path)
    data = src.read_bytes()
    stored = _upload(url, src)
    # Gradio stores it in the app's private folder, under its original name ...
    assert Path(stored).is_file() and Path(stored).name == FAKE_NAME and tempdir.is_upload(stored)
    assert oct(root.stat().st_mode & 0o777) == oct(0o700)
    # ... but never sends it back, not even before a request has read it (both file routes)
    for route in (f"/gradio_api/file={stored}", f"/gradio_api/file/{stored}"):
        r = httpx.get(url + route, timeout=30)
        assert r.status_code == 404 and data not in r.content, (route, r.status_code)
    label = _call(url, "zero_shot", [_file(stored)])[0]
    assert len(label["confidences"]) == 5
    # read once, then gone: the file, its per-upload folder, any copy of its bytes or name
    assert not Path(stored).exists() and not Path(stored).parent.exists()
    assert _leftovers(root, FAKE_NAME, data) == []
    r = httpx.get(f"{url}/gradio_api/file={stored}", timeout=30)
    assert r.status_code != 200 and data not in r.content
    # the page keeps the upload's path: the heatmap for it still comes, from the image kept in memory
    image, legend = _call(url, "ground", [_file(stored), "left pleural effusion", "absolute"])
    assert Path(image["path"]).parent == tempdir.results_dir() and "heatmap" in Path(image["path"]).name
    r = httpx.get(f"{url}/gradio_api/file={image['path']}", timeout=30)
    assert r.status_code == 200 and Image.open(io.BytesIO(r.content)).size == (256, 256)
    assert _leftovers(root, FAKE_NAME, data) == []


def test_run_history_is_off(server):
    """Gradio's run history keeps every call's inputs and outputs (radiographs) in the browser, or in a
    Hugging Face bucket that any user of the page may connect: off."""
    import httpx

    url, _ = server
    assert httpx.get(f"{url}/config", timeout=30).json()["run_history"] is False
    assert httpx.get(f"{url}/gradio_api/runs", timeout=30).status_code == 404


def test_uploads_through_gradio_client_and_refused_uploads_leave_nothing(client, server, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from medclr.app import tempdir

    root = tempdir.private_temp_dir()
    src = _identified_dicom(tmp_path, seed=1)
    _, facts = client.predict(handle_file(src), api_name="/preview")
    assert "256 x 256" in facts
    client.predict(handle_file(src), "effusion", api_name="/ground")
    client.predict(handle_file(src), 3, api_name="/retrieve_by_image")
    assert _leftovers(root, FAKE_NAME, src.read_bytes()) == []
    # an upload that cannot be read is deleted as well, and asking again gives the same message
    bad = tmp_path / "Doe_Jane_MRN-778899_truncated.dcm"
    bad.write_bytes(src.read_bytes()[:3000])
    stored = _upload(server[0], bad)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="DICOM"):
            _call(server[0], "zero_shot", [_file(stored)])
    assert not Path(stored).exists()
    assert _leftovers(root, bad.name, bad.read_bytes()) == []
    with pytest.raises(AppError):
        client.predict(handle_file(bad), api_name="/preview")
    assert _leftovers(root, bad.name, bad.read_bytes()) == []


def test_concurrent_identical_heatmaps_are_complete_and_never_rewritten(client, server, app_assets):  # noqa: F811
    """Each request gets its own result file, written complete before its name is handed out; an earlier
    result is never rewritten by a later identical request, so no download can see a half-written file
    (with Gradio's own caching, identical results shared one file that each request wrote again)."""
    import httpx
    from gradio_client import handle_file

    from medclr.app import tempdir

    url, _ = server
    png = app_assets["images"] / "p00" / "s00.png"
    args = (handle_file(png), "left pleural effusion", "relative")
    first = Path(client.predict(*args, api_name="/ground")[0]["path"])
    before = first.stat()
    reference = first.read_bytes()
    n = 8
    jobs = [client.submit(*args, api_name="/ground") for _ in range(n)]
    paths = [Path(job.result(timeout=300)[0]["path"]) for job in jobs]
    assert len(set(paths) | {first}) == n + 1  # a fresh file per request
    after = first.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert first.read_bytes() == reference

    def download(p: Path) -> bytes:
        with httpx.Client(timeout=60) as h:
            r = h.get(f"{url}/gradio_api/file={p}")
            r.raise_for_status()
            return r.content

    with ThreadPoolExecutor(max_workers=n + 1) as pool:
        bodies = list(pool.map(download, [first, *paths]))
    assert all(b == reference for b in bodies)  # complete and identical
    img = Image.open(io.BytesIO(reference))
    img.load()  # a truncated PNG fails here
    assert img.size == (96, 96)
    assert not list(tempdir.results_dir().glob(".part-*"))  # no temporary name left behind


def test_save_png_never_reuses_a_name(tmp_path):
    from medclr.app import render

    a = np.arange(48, dtype=np.uint8).reshape(6, 8)
    p1 = Path(render.save_png(a, tmp_path, "heatmap"))
    st = p1.stat()
    p2 = Path(render.save_png(a, tmp_path, "heatmap"))
    assert p1 != p2 and p1.read_bytes() == p2.read_bytes()
    assert p1.stat().st_ino == st.st_ino and p1.stat().st_mtime_ns == st.st_mtime_ns
    assert np.array_equal(np.asarray(Image.open(p1)), a)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([p1.name, p2.name])  # no .part-* left
    with pytest.raises(FileNotFoundError):  # a removed folder is not made again
        render.save_png(a, tmp_path / "gone", "heatmap")


def test_sweep_removes_old_files_and_empty_folders(tmp_path):
    from medclr.app import tempdir

    now = time.time()
    old_upload = tmp_path / "ab12" / "scan.dcm"
    old_upload.parent.mkdir()
    old_upload.write_bytes(b"x")
    new_result = tmp_path / "results" / "heatmap-1.png"
    new_result.parent.mkdir()
    new_result.write_bytes(b"y")
    fresh_dir = tmp_path / "cd34"
    fresh_dir.mkdir()
    os.utime(old_upload, (now - 3600, now - 3600))
    os.utime(old_upload.parent, (now - 3600, now - 3600))
    assert tempdir.sweep(tmp_path, 1800, now=now) == 1
    assert not old_upload.exists() and new_result.exists() and fresh_dir.exists()
    # the emptied folder stays until it has been unchanged as long (Gradio may be moving a new upload in)
    assert old_upload.parent.exists()
    assert tempdir.sweep(tmp_path, 1800, now=time.time() + 3600) == 1
    assert not old_upload.parent.exists() and not fresh_dir.exists() and not new_result.exists()
    assert (tmp_path / "results").is_dir()


def test_swept_files_leave_gradios_sets(tmp_path):
    """Gradio keeps the path of every file it has served in its blocks' temp_files sets and forgets none while the
    app runs; after each sweep the app drops the names of files gone from the disk (else the sets grow by every
    result picture: the soak's bench_app_soak.py)."""
    import gradio as gr

    from medclr.app.ui import _after_sweep

    with gr.Blocks() as demo:
        picture = gr.Image()
    kept, swept = tmp_path / "kept.png", tmp_path / "swept.png"
    kept.write_bytes(b"x")
    picture.temp_files.update({str(kept), str(swept)})
    _after_sweep(demo)
    assert picture.temp_files == {str(kept)} and any(s is picture.temp_files for s in demo.temp_file_sets)


def _env(base: Path) -> dict:
    return dict(os.environ, GRADIO_TEMP_DIR=str(base), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def test_folder_goes_on_normal_exit_and_a_killed_process_folder_at_next_start(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    # left by a process that was killed outright: its pid is above any pid the kernel hands out
    stale = base / "medclr-app-2147483646-abcd1234"
    (stale / "results").mkdir(parents=True)
    (stale / "results" / "heatmap-1.png").write_bytes(b"x")
    mine = base / f"medclr-app-{os.getpid()}-abcd1234"  # a running process's folder is left alone
    mine.mkdir()
    other = base / "unrelated"
    other.mkdir()
    code = "from medclr.app import tempdir; print(tempdir.private_temp_dir(), flush=True)"
    out = subprocess.run([sys.executable, "-c", code], env=_env(base), capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    made = Path(out.stdout.strip())
    assert made.parent == base.resolve() and made.name.startswith("medclr-app-")
    assert not made.exists() and not stale.exists() and mine.exists() and other.exists()


def test_a_second_sigterm_during_cleanup_does_not_cut_it_short(tmp_path):
    """A supervisor that repeats SIGTERM: the process sends itself a second one inside the `finally` that the
    first one started (Python runs the handler right after os.kill returns), and the cleanup still ends."""
    base = tmp_path / "base"
    base.mkdir()
    code = ("import os, signal\n"
            "from medclr.app import tempdir\n"
            "tempdir.exit_on_signals()\n"
            "root = tempdir.private_temp_dir()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "finally:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    tempdir.remove_private_temp_dir()\n"
            "    print('cleaned', root, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], env=_env(base), capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 128 + signal.SIGTERM, out.stderr
    assert out.stdout.startswith("cleaned"), out.stderr
    assert list(base.iterdir()) == []


def _open_streams(port: int) -> list[socket.socket]:
    """What an open browser tab or client may hold while the app stops: an idle keep-alive connection,
    a session heartbeat, and a response that never ends by itself (Gradio's dev-reload event stream; the
    event stream of a request still queued when the queue stops is another)."""
    socks = []
    for path in ("/config", "/gradio_api/heartbeat/open-tab", "/gradio_api/dev/reload"):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        assert s.recv(12) == b"HTTP/1.1 200", path
        socks.append(s)
    return socks


def _ended(s: socket.socket) -> bool:
    """True once the server has closed the stream (read to its end); False if it is still open after 10 s."""
    s.settimeout(10)
    try:
        while s.recv(1 << 16):
            pass
    except TimeoutError:
        return False
    return True


def test_closing_the_app_ends_open_streams_and_stops_its_server(engine):  # noqa: F811
    """Blocks.close must leave no server running (it would still answer, and write results, after the
    private folder is gone), also while clients hold connections open: uvicorn waits for every open response
    without limit, and Gradio gives up on the server thread after 5 s."""
    from medclr.app.service import AppService
    from medclr.app.ui import build_blocks, launch

    demo = build_blocks(AppService(engine, None))
    port = free_port()
    launch(demo, port=port, block=False)
    socks = _open_streams(port)
    try:
        demo.close(verbose=False)
        assert not demo.server.thread.is_alive()
        assert [_ended(s) for s in socks] == [True, True, True]
    finally:
        for s in socks:
            s.close()
        demo.close(verbose=False)


def _start_app(args: list[str], base: Path, log, sigint_ignored: bool) -> subprocess.Popen:
    """`medclr app ...`; with ``sigint_ignored`` as a shell starts `medclr app &`: SIGINT ignored, inherited."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if sigint_ignored else None
    try:
        return subprocess.Popen([sys.executable, "-m", "medclr", "app", *args], env=_env(base), stdout=log,
                                stderr=subprocess.STDOUT, cwd=REPO)
    finally:
        if sigint_ignored:
            signal.signal(signal.SIGINT, previous)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(proc: subprocess.Popen, sig: int, timeout: float = 60) -> tuple[int, float]:
    """Send ``sig``; (exit code, CPU seconds the process used from the signal to its end). CPU, not wall time:
    on a busy machine the wall time of the same exit varies tenfold."""
    before = _cpu_s(proc.pid)
    proc.send_signal(sig)
    end = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime - before
        if time.monotonic() > end:
            raise TimeoutError(f"the app did not end within {timeout} s of signal {sig}")
        time.sleep(0.05)


@pytest.mark.parametrize("sig, sigint_ignored", [(signal.SIGTERM, False), (signal.SIGINT, False),
                                                 (signal.SIGINT, True)],
                         ids=["SIGTERM", "Ctrl-C", "SIGINT-to-a-background-job"])
def test_app_process_removes_its_temp_folder_when_stopped(sig, sigint_ignored, tmp_path, app_assets,  # noqa: F811
                                                          index_dir):  # noqa: F811
    """Stopped while a client is still connected (a browser tab stays open); SIGINT also stops an app that a
    shell started in the background (`medclr app &`), which Python would otherwise leave ignoring it. Stopping
    costs little CPU: CPython's last garbage collection over every object alive used to cost 1.5-2 s of it."""
    from gradio_client import Client, handle_file

    base = tmp_path / "base"
    base.mkdir()
    port = free_port()
    log = tmp_path / "app.log"
    with open(log, "wb") as fh:
        proc = _start_app(["--checkpoint", str(app_assets["checkpoint"]), "--index", str(index_dir), "--port",
                           str(port), "--threads", "1"], base, fh, sigint_ignored)
    socks = []
    try:
        url = f"http://127.0.0.1:{port}"
        end = time.time() + 240
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.time() < end, "the app did not start:\n" + log.read_text()
                time.sleep(0.5)
        client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
        src = _identified_dicom(tmp_path)
        image, _ = client.predict(handle_file(src), "effusion", api_name="/ground")
        (folder,) = list(base.iterdir())
        assert folder.name.startswith(f"medclr-app-{proc.pid}-") and Path(image["path"]).is_file()
        assert Path(image["path"]).parent == folder.resolve() / "results"
        assert _leftovers(folder, FAKE_NAME, src.read_bytes()) == []
        socks = _open_streams(port)
        code, cpu = _stop(proc, sig)
    finally:
        for s in socks:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert list(base.iterdir()) == [], log.read_text()
    assert code == (128 + signal.SIGTERM if sig == signal.SIGTERM else 0), log.read_text()
    assert cpu < 1.0, f"{cpu:.2f} CPU seconds from the signal to the end"
