"""App soak: thousands of mixed requests from concurrent gradio_client clients against the real server; does it
stay up, answer every request, and keep its memory?

``medclr app --checkpoint C --index I`` runs as its own process (so its resident memory is the server's alone,
read from /proc/PID/status); C client threads, one ``gradio_client.Client`` each, send requests drawn with a
seeded generator from five kinds, in equal shares:

* ``zero_shot``: upload a study image from the manifest, the findings' probabilities;
* ``heatmap``: upload an image, the heatmap of a phrase (/ground);
* ``retrieve_image``: upload an image, its nearest indexed studies (/retrieve_by_image);
* ``retrieve_text``: a phrase, the studies whose images match it (/retrieve_by_text);
* ``inspector``: a report sentence of the manifest, its eta_LM, zeta and nearest sentences (/inspect_sentence).

Images are drawn from ``--images`` files of the manifest's test split, more than the app's upload cache holds,
so most uploads are read and encoded again. ``--warmup`` requests go first (the first forward passes allocate,
prompts get encoded, thumbnails are drawn); the server's RSS is read then and at the end, and sampled every
few seconds in between. A reply that is not what the kind returns (no probabilities, no image, an empty
gallery, no sentence) counts as an error, like an exception.

JSON lines: per kind the request count, errors and p50 / p95 / max latency (upload + queue wait + work + reply);
the RSS after warm-up, at the end, its peak, its value at each tenth of the run, and the growth (goal: at most
5 %).

    python bench/bench_app_soak.py --checkpoint W/checkpoint --index W/index --manifest W/manifest.parquet
    python bench/bench_app_soak.py ... --requests 200 --clients 4      # a short run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # gradio_client's own telemetry (docs/app.md)
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

import numpy as np  # noqa: E402

KINDS = ("zero_shot", "heatmap", "retrieve_image", "retrieve_text", "inspector")
PHRASES = ("left pleural effusion", "cardiomegaly", "right lower lobe opacity", "pneumothorax", "pulmonary edema")
GOAL_GROWTH = 0.05


def emit(metric: str, value, unit: str, vs=None, **extra) -> None:
    print(json.dumps({"bench": "app_soak", "metric": metric, "value": value, "unit": unit, "vs": vs, **extra}),
          flush=True)


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def inputs(manifest: str, n_images: int) -> tuple[list[str], list[str]]:
    """(the first ``n_images`` test images of the manifest, its distinct report sentences in first-seen order)."""
    from medclr.data.manifest import read_manifest

    m = read_manifest(manifest)
    root = Path(m.attrs.get("root") or Path(manifest).parent)
    test = m[m["split"] == "test"] if (m["split"] == "test").any() else m
    images = [str(p if Path(p).is_absolute() else root / p) for p in test["image_path"].iloc[:n_images]]
    sentences = list(dict.fromkeys(s for row in m["sentences"].iloc[:500] for s in row))
    return images, sentences


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, "-m", "medclr", "app", "--checkpoint", str(args.checkpoint), "--index", str(args.index),
           "--port", str(port), "--threads", str(args.threads)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(args.server_log, "w"))


def wait_until_up(url: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the app exited with status {proc.returncode} before serving (see its log)")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"the app did not answer at {url} within {timeout_s:.0f} s")


def call(client, kind: str, rng: np.random.Generator, images: list[str], sentences: list[str]) -> str | None:
    """One request of ``kind``; None when the reply is what the kind returns, else what was wrong."""
    from gradio_client import handle_file

    image = images[int(rng.integers(len(images)))]
    phrase = PHRASES[int(rng.integers(len(PHRASES)))]
    if kind == "zero_shot":
        label, _table, _note = client.predict(handle_file(image), api_name="/zero_shot")
        return None if label and label.get("confidences") else f"no probabilities: {str(label)[:80]}"
    if kind == "heatmap":
        overlay, legend = client.predict(handle_file(image), phrase, "relative", api_name="/ground")
        return None if overlay and legend else f"no heatmap: {str(legend)[:80]}"
    if kind == "retrieve_image":
        gallery, _note = client.predict(handle_file(image), 5, api_name="/retrieve_by_image")
        return None if gallery else "an empty gallery"
    if kind == "retrieve_text":
        gallery, _note = client.predict(phrase, 5, api_name="/retrieve_by_text")
        return None if gallery else "an empty gallery"
    sentence = sentences[int(rng.integers(len(sentences)))]
    out = client.predict(sentence, api_name="/inspect_sentence")
    return None if isinstance(out, dict) and out.get("sentence") else f"no sentence: {str(out)[:80]}"


def run_requests(url: str, plan: list[str], clients: int, images: list[str], sentences: list[str],
                 seed: int) -> list[tuple[str, float, str | None]]:
    """Send ``plan`` (a kind per request) from ``clients`` threads, each taking the next request as it is free;
    returns (kind, seconds, error or None) per request."""
    from gradio_client import Client

    results: list[tuple[str, float, str | None]] = []
    lock = threading.Lock()
    todo = iter(range(len(plan)))
    gate = threading.Barrier(clients)

    def worker(c: int) -> None:
        client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
        rng = np.random.default_rng([seed, c])
        gate.wait()
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            t0 = time.perf_counter()
            try:
                err = call(client, plan[i], rng, images, sentences)
            except Exception as exc:  # noqa: BLE001 - counted; the soak goes on
                err = f"{type(exc).__name__}: {str(exc)[:120]}"
            dt = time.perf_counter() - t0
            with lock:
                results.append((plan[i], dt, err))

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


class RssSampler(threading.Thread):
    """Samples the server's RSS every ``every_s`` seconds until stopped."""

    def __init__(self, pid: int, every_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s, self.samples = pid, every_s, []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.samples.append(rss_mib(self.pid))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--manifest", required=True, help="manifest whose test images and sentences are sent")
    ap.add_argument("--requests", type=int, default=2000, help="measured requests (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--images", type=int, default=48, help="distinct images uploaded (the app caches 8)")
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-log", type=Path, default=Path("app_soak_server.log"))
    args = ap.parse_args()
    from medclr.app.background import free_port

    images, sentences = inputs(args.manifest, args.images)
    rng = np.random.default_rng(args.seed)
    plan = [KINDS[int(k)] for k in rng.integers(len(KINDS), size=args.warmup + args.requests)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(args, port)
    tag = {"clients": args.clients, "server_threads": args.threads, "images": len(images),
           "checkpoint": str(args.checkpoint)}
    try:
        wait_until_up(url, proc)
        emit("rss_start", round(rss_mib(proc.pid), 1), "MiB", load_avg_1min=round(os.getloadavg()[0], 2), **tag)
        warm = run_requests(url, plan[:args.warmup], args.clients, images, sentences, args.seed)
        rss_warm = rss_mib(proc.pid)
        sampler = RssSampler(proc.pid)
        sampler.start()
        t0 = time.perf_counter()
        done = run_requests(url, plan[args.warmup:], args.clients, images, sentences, args.seed + 1)
        wall = time.perf_counter() - t0
        sampler.stop.set()
        rss_end = rss_mib(proc.pid)
        alive = proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    errors = [e for _, _, e in done if e]
    emit("requests", len(done), "requests", warmup=len(warm), warmup_errors=sum(1 for *_, e in warm if e), **tag)
    emit("errors", len(errors), "requests", vs="goal 0", first_errors=errors[:3], **tag)
    emit("server_alive_at_end", alive, "bool", **tag)
    for kind in KINDS:
        lat = [dt for k, dt, e in done if k == kind and not e]
        n_err = sum(1 for k, _, e in done if k == kind and e)
        if lat:
            emit(f"{kind}_latency", {"p50": round(float(np.percentile(lat, 50)), 3),
                                     "p95": round(float(np.percentile(lat, 95)), 3),
                                     "max": round(max(lat), 3)}, "s", n=len(lat), errors=n_err, **tag)
    all_lat = [dt for _, dt, e in done if not e]
    if all_lat:
        emit("all_latency", {"p50": round(float(np.percentile(all_lat, 50)), 3),
                             "p95": round(float(np.percentile(all_lat, 95)), 3)}, "s", n=len(all_lat), **tag)
    emit("throughput", round(len(done) / wall, 2), "requests/s", wall_s=round(wall, 1), **tag)
    growth = rss_end / rss_warm - 1
    emit("rss_after_warmup", round(rss_warm, 1), "MiB", **tag)
    emit("rss_end", round(rss_end, 1), "MiB", peak=round(max([rss_end, *sampler.samples]), 1),
         samples=len(sampler.samples), **tag)
    # a leak climbs to the end; caches and the allocator's arenas level off
    trace = [rss_warm, *sampler.samples, rss_end]
    emit("rss_trajectory", [round(trace[round(i * (len(trace) - 1) / 10)], 1) for i in range(11)], "MiB",
         vs="after warm-up, then each tenth of the run", **tag)
    emit("rss_growth", round(100 * growth, 2), "%", vs=f"goal <= {100 * GOAL_GROWTH:g} %",
         met=bool(growth <= GOAL_GROWTH), load_avg_1min_end=round(os.getloadavg()[0], 2), **tag)


if __name__ == "__main__":
    main()
