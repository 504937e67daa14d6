"""Batch-scoring throughput: decode-only, forward-only and end-to-end images/s in one run, per format, size
and model, as JSON lines; ratio = end-to-end / forward-only (goal >= 0.85 on a GPU).

Sources, made once in --workdir from pydicom-data's chest CR (RG1_UNCR: 1955 x 1841, 15 bits, MONOCHROME1,
its window): RG1 resized to 1024, 1955 (as is) or 3000 rows (area down; bilinear up plus Gaussian noise of
RG1's own high-frequency level, so the codecs see detector noise, not a smooth upsample), each written as
uncompressed DICOM, JPEG 2000 lossless DICOM (pydicom + pylibjpeg-openjpeg) and a q95 JPEG file of what
medclr displays. Per model (``bench_app.build_checkpoint``: small = random ResNet-18 @ 224, biovil =
random ResNet-50 @ 512 -> 480) and source:

* ``decode_only``: what one DataLoader worker does per file (``ImageFiles``: read, decode, resize, crop),
  one process, 1 / the median time per file (``best``: 1 / the shortest); W workers feed at most W x this;
* ``forward_only``: the scorer's model calls (image forward + CheX5 zero-shot head) on a batch already
  decoded, preprocessed and on the device; measured once per model before and once after its sources (the
  mean is the reference; a GPU is synchronised);
* ``end_to_end``: ``medclr.jobs.scoring.score_tree`` on a tree of N links to the source (workers decode
  while the model runs; parts written, tables merged), wall time;
* ``startup``: ``medclr score`` as a command on a small folder: total wall vs its scoring loop.

    python bench/bench_score.py [--models small biovil] [--sizes 1024 1955 3000] [--n 32] [--device cuda]

``--full-decode`` measures the scorer with full decodes and float32 inputs (the app's exact input). The
script also runs against code from before the reduced decode (a before/after comparison: put a copy of it
next to that version's bench_app.py and set PYTHONPATH to that checkout).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the medclr CLI does (docs/app.md)
sys.path.insert(0, str(Path(__file__).resolve().parent))

FORMATS = ("uncompressed", "jpeg2000", "jpeg")
SUFFIX = {"uncompressed": ".dcm", "jpeg2000": ".dcm", "jpeg": ".jpg"}


def emit(metric: str, value, unit: str, vs=None, **extra) -> None:
    print(json.dumps({"bench": "score", "metric": metric, "value": value, "unit": unit, "vs": vs, **extra}), flush=True)


def make_sources(workdir: Path, rows: int) -> dict[str, Path]:
    """RG1 at ``rows`` rows in the three formats (cached)."""
    out = {fmt: workdir / f"rg1_{rows}_{fmt}{SUFFIX[fmt]}" for fmt in FORMATS}
    if all(p.is_file() for p in out.values()):
        return out
    import numpy as np
    import pydicom
    import torch
    from PIL import Image
    from pydicom import uid
    from pydicom.data import get_testdata_file

    from medclr.io import read_image

    ds = pydicom.dcmread(get_testdata_file("RG1_UNCR.dcm"))
    stored = ds.pixel_array.astype(np.float32)
    size = (rows, round(stored.shape[1] * rows / stored.shape[0]))
    x = torch.from_numpy(stored)[None, None]
    if rows < stored.shape[0]:
        pixels = torch.nn.functional.interpolate(x, size=size, mode="area")[0, 0].numpy()
    else:
        pixels = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)[0, 0].numpy()
        if rows > stored.shape[0]:
            smooth = torch.nn.functional.avg_pool2d(x, 3, 1, 1, count_include_pad=False)[0, 0].numpy()
            noise = float(np.std(stored - smooth))  # RG1's own pixel noise
            pixels = pixels + np.random.default_rng(0).normal(0.0, noise, pixels.shape).astype(np.float32)
    ds.PixelData = np.clip(np.round(pixels), 0, 2**ds.BitsStored - 1).astype(np.uint16).tobytes()
    ds.Rows, ds.Columns = size
    ds.save_as(out["uncompressed"], enforce_file_format=True)
    ds.compress(uid.JPEG2000Lossless, encoding_plugin="pylibjpeg")
    ds.save_as(out["jpeg2000"], enforce_file_format=True)
    Image.fromarray(np.round(read_image(out["uncompressed"]) * 255).astype(np.uint8)).save(out["jpeg"], quality=95)
    return out


def link_tree(tree: Path, src: Path, n: int) -> Path:
    if not tree.is_dir() or len(list(tree.iterdir())) != n:
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        for i in range(n):
            os.symlink(src, tree / f"img{i:04d}{src.suffix}")
    return tree


def worker_dataset(paths: list[str], pre, full_decode: bool):
    """The dataset the scorer's workers run, with the scorer's options."""
    from medclr.inference import ImageFiles

    try:
        return ImageFiles(paths, pre, reduced=not full_decode, uint8=not full_decode)
    except TypeError:  # code from before the reduced decode
        return ImageFiles(paths, pre)


def score_options(**kw):
    from medclr.jobs.scoring import ScoreOptions

    names = {f.name for f in dataclasses.fields(ScoreOptions)}
    return ScoreOptions(**{k: v for k, v in kw.items() if k in names})


def decode_rate(src: Path, pre, full_decode: bool, reps: int, seconds: float = 1.0) -> tuple[float, float]:
    """(1 / the median, 1 / the shortest) time of one item, over at least ``reps`` items and ``seconds``. On a
    busy machine the shortest is the cost without interference, the steadier figure to compare versions."""
    data = worker_dataset([str(src)], pre, full_decode)
    assert data[0]["ok"], data[0]["error"]  # warm-up
    times: list[float] = []
    while len(times) < reps or sum(times) < seconds:
        t = time.perf_counter()
        data[0]
        times.append(time.perf_counter() - t)
    times.sort()
    return 1.0 / times[len(times) // 2], 1.0 / times[0]


def forward_rate(engine, tensor, batch_size: int, n: int, seconds: float = 2.0) -> float:
    """Images/s of the model calls on a batch already on the device (at least n images and ``seconds``)."""
    import torch

    batch = tensor[None].expand(batch_size, -1, -1, -1).contiguous().to(engine.device)
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    for _ in range(2):  # warm-up
        engine.zero_shot_scores(engine.image_features(batch))
    sync()
    steps, t = 0, time.perf_counter()
    while steps < max(1, n // batch_size) or time.perf_counter() - t < seconds:
        engine.zero_shot_scores(engine.image_features(batch))  # returns numpy: waits for the device
        steps += 1
    sync()
    return steps * batch_size / (time.perf_counter() - t)


def end_to_end(engine, tree: Path, out: Path, args) -> float:
    for p in (out, out.with_name(out.name + ".parts")):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    opts = score_options(batch_size=args.batch_size, workers=args.workers, part_files=64, progress=False,
                         full_decode=args.full_decode)
    from medclr.jobs.scoring import score_tree

    t = time.perf_counter()
    stats = score_tree(engine, tree, out, opts)
    wall = time.perf_counter() - t
    assert stats["scored"] == len(list(tree.iterdir())), stats
    return stats["scored"] / wall


# The steps of ``medclr score`` before its loop, timed one by one in a fresh interpreter.
PHASES = """
import json, sys, time
t = [time.perf_counter()]
out = {}
def lap(name):
    now = time.perf_counter(); out[name] = round(now - t[0], 2); t[0] = now
import medclr.cli, medclr.jobs.score; lap("import medclr.cli + app.score")
import torch; lap("import torch")
import medclr.jobs.scoring; lap("import app.scoring (pyarrow, pydicom, Pillow)")
from medclr.inference import load_checkpoint; lap("import medclr.inference (torchvision, transformers)")
engine = load_checkpoint(sys.argv[1], device=sys.argv[3]); lap("load_checkpoint")
engine.weights_sha256; lap("weights sha256")
engine.prompt_embeddings(); lap("prompt embeddings")
from pathlib import Path
from medclr.jobs.scoring import find_images, fingerprint
[fingerprint(Path(sys.argv[2]) / f) for f in find_images(Path(sys.argv[2]))]; lap("file walk + stat")
print(json.dumps(out))
"""


def startup(ckpt: Path, tree: Path, out: Path, args) -> dict:
    """``medclr score`` on a small folder as a command: its total wall and its scoring loop; then where the
    time before the loop goes (second of two runs each: the file cache warm)."""
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env = dict(os.environ, PYTHONPATH=path)
    cmd = [sys.executable, "-m", "medclr", "score", "--checkpoint", str(ckpt), "--input", str(tree), "--out",
           str(out), "--batch-size", str(args.batch_size), "--no-progress", "--device", args.device]
    for _ in range(2):
        for p in (out, out.with_name(out.name + ".parts")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        t = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        wall = time.perf_counter() - t
    loop = float(re.search(r" in ([0-9.]+) s;", done.stdout).group(1))
    for _ in range(2):
        t = time.perf_counter()
        phases = subprocess.run([sys.executable, "-c", PHASES, str(ckpt), str(tree), args.device], env=env,
                                capture_output=True, text=True, check=True)
        interpreter = time.perf_counter() - t
    return {"wall_s": round(wall, 2), "loop_s": loop, "startup_s": round(wall - loop, 2),
            "phases_s": json.loads(phases.stdout.strip().splitlines()[-1]), "phases_process_s": round(interpreter, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["small", "biovil"])
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--sizes", nargs="+", type=int, default=[1024, 1955, 3000], help="rows (RG1's aspect)")
    ap.add_argument("--n", type=int, default=32, help="images per end-to-end run (biovil: half)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=None, help="default: the scorer's (medclr.jobs.score)")
    ap.add_argument("--device", default="auto", help="cpu, cuda; auto: cuda when there is one")
    ap.add_argument("--full-decode", action="store_true")
    ap.add_argument("--decode-reps", type=int, default=4)
    ap.add_argument("--no-startup", action="store_true", help="skip the start-up measurement")
    ap.add_argument("--decode-only", action="store_true", help="only the decode-only rates (no model runs)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "medclr_bench")
    args = ap.parse_args()
    import torch

    from bench_app import build_checkpoint
    from medclr.inference import load_checkpoint, preprocess_image
    from medclr.io import read_image

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.workers is None:
        from medclr.jobs import score

        args.workers = (score.default_workers(args.device) if hasattr(score, "default_workers")
                        else score._default_workers())  # code from before the device-aware default
    args.workdir.mkdir(parents=True, exist_ok=True)
    sources = {rows: make_sources(args.workdir, rows) for rows in args.sizes}
    emit("config", os.cpu_count(), "cores", torch_threads=torch.get_num_threads(), workers=args.workers,
         batch_size=args.batch_size, n=args.n, device=args.device, full_decode=args.full_decode,
         load_avg_1min=round(os.getloadavg()[0], 2))
    for name in args.models:
        ckpt = build_checkpoint(name, args.workdir)
        engine = load_checkpoint(ckpt, device=args.device)
        n = args.n if name == "small" else max(args.batch_size, args.n // 2)
        ref = preprocess_image(read_image(sources[args.sizes[0]]["uncompressed"]), engine.preprocess)[0]
        fwd_before = forward_rate(engine, ref, args.batch_size, n)
        rows = []
        for size, by_format in sources.items():
            for fmt in args.formats:
                src = by_format[fmt]
                tag = {"model": name, "format": fmt, "rows": size, "image_size": engine.preprocess.image_size}
                dec, best = decode_rate(src, engine.preprocess, args.full_decode, args.decode_reps)
                emit("decode_only", round(dec, 2), "img/s", **tag, processes=1, best=round(best, 2))
                if args.decode_only:
                    continue
                tree = link_tree(args.workdir / f"tree_{size}_{fmt}_{n}", src, n)
                e2e = end_to_end(engine, tree, args.workdir / f"res_{name}_{size}_{fmt}.parquet", args)
                emit("end_to_end", round(e2e, 2), "img/s", **tag, workers=args.workers)
                rows.append((tag, e2e))
        if args.decode_only:
            continue
        fwd_after = forward_rate(engine, ref, args.batch_size, n)
        fwd = (fwd_before + fwd_after) / 2
        emit("forward_only", round(fwd, 2), "img/s", model=name, image_size=engine.preprocess.image_size,
             before=round(fwd_before, 2), after=round(fwd_after, 2))
        for tag, e2e in rows:
            emit("end_to_end_vs_forward_only", round(e2e / fwd, 3), "ratio", vs="goal >= 0.85 (GPU)", **tag)
    if not (args.no_startup or args.decode_only):
        small = link_tree(args.workdir / "tree_startup", sources[args.sizes[0]]["jpeg"], 8)
        emit("startup", startup(build_checkpoint("small", args.workdir), small, args.workdir / "startup.parquet",
                                args), "s", model="small", files=8)
    emit("load_avg_1min_end", round(os.getloadavg()[0], 2), "processes")


if __name__ == "__main__":
    main()
