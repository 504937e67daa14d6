"""App latency: zero-shot + heatmap on the real RG1 DICOM (1955 x 1841, MONOCHROME1), after warm-up.

Two model sizes, both random-weight (latency does not depend on the weights):
* ``small``: ResNet-18 at 224, joint dim 32, a 1-layer BERT (the test checkpoint's shape);
* ``biovil``: ResNet-50 at 480 (resize 512), joint dim 128, BioViL's MLP projector, LSE+NL head, a
  BERT-base-shaped text encoder (12 layers, hidden 768) -- the size of the published models.

Measured three ways, each on a fresh upload (the app's per-upload cache is cleared, so the DICOM
decode and the image forward are counted every time):
* ``service``: the handlers the web page calls, in process (decode, preprocess, forward, zero-shot,
  grounding, overlay rendering);
* ``page``: the real Gradio server as the web page uses it: the file is uploaded once
  (POST /gradio_api/upload), then /zero_shot and /ground run on the uploaded file (gradio_client);
  time from the start of the upload to the heatmap;
* ``http``: plain ``gradio_client`` calls, which upload the 7 MB file again for each call
  (upload + /zero_shot, upload + /ground);
* a breakdown of the service path (decode / encode / zero-shot / ground+render).

``--clients C --requests R`` instead runs C concurrent gradio_client clients (one thread and one
``Client`` each) sending R ``/ground`` requests each against the real server: every request uploads a
DICOM of its own (RG1 with a different last pixel, so each is decoded and encoded, none answered from
the app's cache), and the JSON lines give errors, the per-request latency p50/p95/max (upload + queue wait +
decode + forward + heatmap) and the throughput.

    OMP_NUM_THREADS=2 python bench/bench_app.py [--models small biovil] [--runs 10]
    OMP_NUM_THREADS=2 python bench/bench_app.py --models small --clients 8 --requests 10
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the medclr CLI does (docs/app.md)

import numpy as np  # noqa: E402

MODELS = {
    "small": {"arch": "resnet18", "joint_dim": 32, "image_size": 224, "resize": 224, "projector": "linear",
              "text": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}},
    "biovil": {"arch": "resnet50", "joint_dim": 128, "image_size": 480, "resize": 512, "projector": "mlp",
               "text": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                        "intermediate_size": 3072}},
}


def emit(bench: str, metric: str, value, unit: str, vs=None, **extra) -> None:
    print(json.dumps({"bench": bench, "metric": metric, "value": value, "unit": unit, "vs": vs, **extra}), flush=True)


def build_checkpoint(name: str, root: Path) -> Path:
    """A random-weight checkpoint of the given size (cached under ``root``)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from medclr.inference import CheckpointMeta, weights_sha256, write_metadata
    from medclr.inference.stored_prompts import save_prompt_embeddings
    from medclr.lm.fit import train_tokenizer
    from medclr.models.dual import build_dual_encoder
    from medclr.prompts import BUILTIN_PROMPTS, CHEX5_PROMPTS

    spec = MODELS[name]
    out = root / f"ckpt_{name}"
    if (out / "model.safetensors").is_file():
        return out
    text = root / f"text_{name}"
    # a small vocabulary of the words the app is asked here (the weights are random either way)
    sentences = ["left pleural effusion", "right lower lobe opacity",
                 *(p for prompts in BUILTIN_PROMPTS.values() for sides in prompts.values() for side in sides.values()
                   for p in side)]
    tok = train_tokenizer(sentences, vocab_size=200, min_frequency=1)
    tok.save_pretrained(text)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, max_position_embeddings=128, pad_token_id=0, **spec["text"])
    BertForMaskedLM(cfg).save_pretrained(text)
    model = build_dual_encoder(text, arch=spec["arch"], joint_dim=spec["joint_dim"], head="lse_nl",
                               image_pretrained="none", projector=spec["projector"])
    model.head.trained = True  # random weights stand for trained ones (an untrained head is refused at load)
    model.save_pretrained(out)
    sha = weights_sha256(out)  # what training records, and the stored prompt embeddings it writes
    save_prompt_embeddings(out, model, sha, CHEX5_PROMPTS)
    write_metadata(out, CheckpointMeta(image_size=spec["image_size"], resize=spec["resize"], weights_sha256=sha))
    return out


def _upload(url: str, path: str) -> dict:
    """What the page does once per study: upload the file, then refer to it by its server path."""
    import httpx

    with open(path, "rb") as fh:
        r = httpx.post(url.rstrip("/") + "/gradio_api/upload", files={"files": (Path(path).name, fh)}, timeout=60)
    r.raise_for_status()
    return {"path": r.json()[0], "meta": {"_type": "gradio.FileData"}, "orig_name": Path(path).name}


def concurrent_ground(url: str, rg1: str, workdir: Path, clients: int, requests: int, tag: dict) -> None:
    """``clients`` gradio_client clients x ``requests`` /ground requests each, all at once."""
    import threading

    from gradio_client import Client, handle_file

    data = Path(rg1).read_bytes()  # uncompressed: its last two bytes are the bottom-right pixel
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start_gate = threading.Barrier(clients)

    def client_loop(c: int) -> None:
        client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
        path = workdir / f"client{c}.dcm"
        start_gate.wait()
        for r in range(requests):
            n = c * requests + r + 1
            path.write_bytes(data[:-2] + n.to_bytes(2, "little"))  # another file: no cache hit
            t0 = time.perf_counter()
            try:
                image, legend = client.predict(handle_file(path), "left pleural effusion", "absolute",
                                               api_name="/ground")
                ok = bool(image) and "cosine" in legend
                err = None if ok else f"unexpected reply: {legend[:80]!r}"
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                err = f"{type(exc).__name__}: {str(exc)[:120]}"
            dt = time.perf_counter() - t0
            with lock:
                (errors.append(err) if err else latencies.append(dt))

    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    extra = {**tag, "clients": clients, "requests_per_client": requests}
    emit("app_concurrent", "ground_requests", clients * requests, "requests", **extra)
    emit("app_concurrent", "ground_errors", len(errors), "requests", vs="goal 0", **extra,
         first_errors=errors[:3])
    if latencies:
        for q in (50, 95):
            emit("app_concurrent", f"ground_latency_p{q}", round(float(np.percentile(latencies, q)), 3), "s", **extra)
        emit("app_concurrent", "ground_latency_max", round(max(latencies), 3), "s", **extra)
    emit("app_concurrent", "ground_throughput", round(len(latencies) / wall, 3), "requests/s", wall_s=round(wall, 1),
         **extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["small", "biovil"], choices=list(MODELS))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "medclr_bench")
    ap.add_argument("--clients", type=int, default=0, help="concurrent gradio_client clients sending /ground "
                    "(0: the latency benchmark instead)")
    ap.add_argument("--requests", type=int, default=10, help="/ground requests per client (with --clients)")
    args = ap.parse_args()
    import torch
    from pydicom.data import get_testdata_file

    from medclr.app.background import serve_in_background
    from medclr.app.service import AppService
    from medclr.inference import load_checkpoint
    from medclr.io import read_image

    rg1 = get_testdata_file("RG1_UNCI.dcm")
    args.workdir.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    emit("app", "torch_threads", threads, "threads", load_avg_1min=round(os.getloadavg()[0], 2))
    for name in args.models:
        engine = load_checkpoint(build_checkpoint(name, args.workdir))
        service = AppService(engine, None)
        tag = {"model": name, "image_size": engine.preprocess.image_size, "threads": threads}
        if args.clients > 0:
            with serve_in_background(service) as url:
                service.ground(rg1, "left pleural effusion")  # warm-up
                concurrent_ground(url, rg1, args.workdir, args.clients, args.requests, tag)
            continue

        def fresh(service=service):
            service._uploads.clear()

        # warm-up (first forward allocates, prompts get encoded)
        for _ in range(2):
            fresh()
            service.zero_shot(rg1)
            service.ground(rg1, "left pleural effusion")
        total, parts = [], {"decode": [], "encode": [], "zero_shot": [], "ground_render": []}
        for _ in range(args.runs):
            fresh()
            t0 = time.perf_counter()
            service.zero_shot(rg1)
            service.ground(rg1, "left pleural effusion")
            total.append(time.perf_counter() - t0)
            # breakdown on the same path
            t = time.perf_counter()
            img = read_image(rg1)
            t1 = time.perf_counter()
            enc = engine.encode(img)
            t2 = time.perf_counter()
            engine.zero_shot_details(enc)
            t3 = time.perf_counter()
            fresh()
            service.upload(rg1)
            t4 = time.perf_counter()
            service.ground(rg1, "right lower lobe opacity")
            t5 = time.perf_counter()
            parts["decode"].append(t1 - t)
            parts["encode"].append(t2 - t1)
            parts["zero_shot"].append(t3 - t2)
            parts["ground_render"].append(t5 - t4)
        emit("app", "zero_shot+heatmap_p50_service", round(float(np.median(total)), 3), "s", vs="goal <= 1.5 s", **tag)
        emit("app", "zero_shot+heatmap_p90_service", round(float(np.percentile(total, 90)), 3), "s", **tag)
        for k, v in parts.items():
            emit("app", f"{k}_p50", round(float(np.median(v)), 4), "s", **tag)

        from gradio_client import Client, handle_file

        with serve_in_background(service) as url:
            client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
            http = []
            for i in range(args.runs + 2):
                fresh()
                t0 = time.perf_counter()
                client.predict(handle_file(rg1), api_name="/zero_shot")
                client.predict(handle_file(rg1), "left pleural effusion", "absolute", api_name="/ground")
                if i >= 2:
                    http.append(time.perf_counter() - t0)
            page = []
            for i in range(args.runs + 2):
                fresh()
                t0 = time.perf_counter()
                server_file = _upload(url, rg1)
                client.predict(server_file, api_name="/zero_shot")
                client.predict(server_file, "left pleural effusion", "absolute", api_name="/ground")
                if i >= 2:
                    page.append(time.perf_counter() - t0)
            emit("app", "upload+zero_shot+heatmap_p50_page", round(float(np.median(page)), 3), "s",
                 vs="goal <= 1.5 s", **tag)
            emit("app", "upload+zero_shot+heatmap_p90_page", round(float(np.percentile(page, 90)), 3), "s", **tag)
            emit("app", "zero_shot+heatmap_p50_http", round(float(np.median(http)), 3), "s", vs="goal <= 1.5 s",
                 **tag)
            emit("app", "zero_shot+heatmap_p90_http", round(float(np.percentile(http, 90)), 3), "s", **tag)
    emit("app", "load_avg_1min_end", round(os.getloadavg()[0], 2), "processes")


if __name__ == "__main__":
    main()
