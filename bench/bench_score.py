"""Batch-scoring throughput, and where the time goes: start-up, steady rate and per-stage costs as JSON lines,
per format, size and model; ratio = end-to-end / forward-only (goal >= 0.85 on a GPU).

Sources, made once in --workdir from pydicom-data's chest CR (RG1_UNCR: 1955 x 1841, 15 bits, MONOCHROME1,
its window): RG1 resized to 1024, 1955 (as is) or 3000 rows (area down; bilinear up plus Gaussian noise of
RG1's own high-frequency level, so the codecs see detector noise, not a smooth upsample), each written as
uncompressed DICOM, JPEG 2000 lossless DICOM (pydicom + pylibjpeg-openjpeg) and a q95 JPEG file of what
medclr displays. Per model (``bench_app.build_checkpoint``: small = random ResNet-18 @ 224, biovil =
random ResNet-50 @ 512 -> 480) and source, one line each:

* ``decode_only``: what one DataLoader worker does per file (``ImageFiles``: read, decode, resize, crop),
  one process, 1 / the median time per file (``best``: 1 / the shortest); W workers feed at most W x this;
* ``stage``: the same items split by stage, median ms per image: ``read`` (DICOM: pydicom's parse of the
  whole file; JPEG/PNG: Pillow's open, the header), ``decode`` (the pixel codec; for JPEG/PNG Pillow's load
  also reads the file), ``voi_lut`` (DICOM: rescale, VOI LUT or window, inversion as one table lookup;
  JPEG/PNG: to float in [0, 1]), ``resize`` (onto the model's grid and the centre crop), ``other`` (checks,
  uint8); then, in the main process, ``transfer`` (the batch to the device; CUDA only), ``forward`` (image
  forward + CheX5 head, 1 / forward-only) and ``write`` (parts and the final merge, over the run's images).
  Stages are timed by wrapping the library functions the worker calls (``stage_clock``), nothing else changes;
* ``forward_only``: the scorer's model calls on a batch already decoded, preprocessed and on the device;
  measured once per model before and once after its sources (the mean is the reference; GPU synchronised);
* ``end_to_end``: ``medclr.jobs.scoring.score_tree`` on a tree of N links to the source (workers decode
  while the model runs), with one part per batch so that each part's mtime is the moment its batch was
  scored: ``value`` = N / wall, ``loop_startup_s`` = the call to the first batch scored (file walk, workers'
  start, first decodes), ``steady`` = the images after the first max(1, W) batches over the time from that
  batch to the last (the rate once the pipeline is full; needs N >= 2 batches more than W);
* ``startup``: ``medclr score`` as a command (one part per batch, 8 JPEG files): ``to_first_batch_s`` =
  process start (the parent's Popen) to the first batch scored (its part's mtime), and the steps before the
  loop timed one by one in a fresh interpreter (``phases_s``); with ``--before DIR`` the same for the code
  in DIR (a copy of an older checkout), before and after alternating in the same run.

    python bench/bench_score.py [--models small biovil] [--sizes 1024 1955 3000] [--n 32] [--device cuda]
    git archive HEAD | tar -x -C /tmp/before && python bench/bench_score.py --before /tmp/before --models small

``--full-decode`` measures the scorer with full decodes and float32 inputs (the app's exact input).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the medclr CLI does (docs/app.md)
sys.path.insert(0, str(Path(__file__).resolve().parent))

FORMATS = ("uncompressed", "jpeg2000", "jpeg")
SUFFIX = {"uncompressed": ".dcm", "jpeg2000": ".dcm", "jpeg": ".jpg"}
WORKER_STAGES = ("read", "decode", "voi_lut", "resize")
# The folders that install as medclr.<name> (pyproject's package-dir; tests/test_layout.py's MAPPED): a copy of a
# checkout put on PYTHONPATH needs them under medclr/ to import as they do when installed.
OUTER_PACKAGES = ("app", "jobs", "training", "evaluation")


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


def worker_dataset(paths: list[str], pre, args):
    """The dataset the scorer's workers run, with the scorer's options."""
    from medclr.inference import ImageFiles
    from medclr.inference.device_decode import device_formats

    formats = device_formats(args.decoder, args.device, args.full_decode)
    return ImageFiles(paths, pre, reduced=not args.full_decode, uint8=not args.full_decode, device_formats=formats)


def score_options(**kw):
    from medclr.jobs.scoring import ScoreOptions

    names = {f.name for f in dataclasses.fields(ScoreOptions)}
    return ScoreOptions(**{k: v for k, v in kw.items() if k in names})


# ----------------------------------------------------------------------------------------------- stages
class StageClock:
    """Seconds per stage, from wrappers around the library functions a worker item calls. A stage called
    inside another (Pillow's load inside the JPEG DICOM reduced decode) counts as the outer one."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._depth = 0

    def wrap(self, stage: str, fn):
        def timed(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - t
                self._depth -= 1

        return timed


@contextlib.contextmanager
def stage_clock():
    """Patch the worker path's functions with :class:`StageClock` wrappers for the duration (this process only)."""
    from PIL import Image, ImageFile

    import medclr.inference.preprocess as preprocess
    import medclr.io.dicom as dicom
    import medclr.io.raster as raster

    clock = StageClock()
    targets = [(dicom, "_open", "read"), (Image, "open", "read"),
               (dicom, "decode_pixels", "decode"), (dicom, "_decode_reduced", "decode"),
               (ImageFile.ImageFile, "load", "decode"),
               (dicom, "display", "voi_lut"), (dicom, "display_table", "voi_lut"), (raster, "_grey", "voi_lut"),
               (preprocess, "preprocess_decoded", "resize")]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    try:
        for owner, name, stage in targets:
            setattr(owner, name, clock.wrap(stage, getattr(owner, name)))
        yield clock
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def decode_rate(src: Path, pre, args, seconds: float = 1.0) -> tuple[float, float, dict]:
    """(1 / the median, 1 / the shortest) time of one item, over at least ``--decode-reps`` items and ``seconds``,
    and the median ms per stage. On a busy machine the shortest is the cost without interference, the steadier
    figure to compare versions. A file the device finishes (``--decoder``) adds ``device``: that finish, one
    file at a time, in this process (synchronised), not counted in the worker's rate."""
    import torch

    from medclr.inference.device_decode import finish_on_device

    data = worker_dataset([str(src)], pre, args)
    assert data[0]["ok"], data[0]["error"]  # warm-up
    sync = torch.cuda.synchronize if str(args.device).startswith("cuda") else (lambda: None)
    times: list[float] = []
    per_stage: dict[str, list[float]] = defaultdict(list)
    while len(times) < args.decode_reps or sum(times) < seconds:
        with stage_clock() as clock:
            t = time.perf_counter()
            item = data[0]
            times.append(time.perf_counter() - t)
        for stage in WORKER_STAGES:
            per_stage[stage].append(clock.seconds.get(stage, 0.0))
        per_stage["other"].append(times[-1] - sum(clock.seconds.values()))
        if item["raw"] is not None:
            t = time.perf_counter()
            finish_on_device([item["raw"]], pre, args.device)
            sync()
            per_stage["device"].append(time.perf_counter() - t)
    stages = {k: round(1e3 * statistics.median(v), 3) for k, v in per_stage.items()}
    return 1.0 / statistics.median(times), 1.0 / min(times), stages


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


def transfer_ms(engine, tensor, batch_size: int, reps: int = 10) -> float | None:
    """ms per image to move a pinned uint8 batch to the device and make it float there (None on the CPU)."""
    if engine.device.type != "cuda":
        return None
    import torch

    from medclr.inference.preprocess import model_input

    batch = tensor[None].expand(batch_size, -1, -1, -1).mul(255).round().to(torch.uint8).pin_memory()
    model_input(batch, engine.device)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        model_input(batch, engine.device)
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t) / (reps * batch_size)


# ----------------------------------------------------------------------------------------------- end to end
def _fresh(out: Path) -> None:
    for p in (out, out.with_name(out.name + ".parts")):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def part_times(out: Path) -> list[float]:
    """The epoch seconds at which each part of ``out`` was written, in order (one part per batch)."""
    return sorted(p.stat().st_mtime for p in out.with_name(out.name + ".parts").glob("part-*.parquet"))


def pipeline_rates(started: float, marks: list[float], batch_size: int, n: int, workers: int) -> dict:
    """Start-up to the first batch and the steady rate after the first max(1, W) batches, from part times."""
    first = min(max(1, workers), len(marks) - 1)
    steady = ((n - first * batch_size) / (marks[-1] - marks[first - 1])
              if first >= 1 and marks[-1] > marks[first - 1] else None)
    return {"to_first_batch_s": round(marks[0] - started, 3),
            "steady": round(steady, 2) if steady else None, "steady_after_batches": first}


def end_to_end(engine, tree: Path, out: Path, args) -> dict:
    """``score_tree`` on ``tree`` (one part per batch): the rate, start-up, steady rate and the write stage."""
    import medclr.jobs.scoring as scoring

    _fresh(out)
    opts = score_options(batch_size=args.batch_size, workers=args.workers, part_files=args.batch_size,
                         progress=False, full_decode=args.full_decode, decoder=args.decoder)
    clock = StageClock()
    saved = scoring._write_atomic
    scoring._write_atomic = clock.wrap("write", saved)
    try:
        started, t = time.time(), time.perf_counter()
        stats = scoring.score_tree(engine, tree, out, opts)
        wall = time.perf_counter() - t
    finally:
        scoring._write_atomic = saved
    n = len(list(tree.iterdir()))
    assert stats["scored"] == n, stats
    return {"rate": n / wall, **pipeline_rates(started, part_times(out), args.batch_size, n, args.workers),
            "write_ms": 1e3 * clock.seconds["write"] / n}


# ----------------------------------------------------------------------------------------------- start-up
# The steps of ``medclr score`` before its loop, timed one by one in a fresh interpreter.
PHASES = """
import json, sys, time
t = [time.perf_counter()]
out = {}
def lap(name):
    now = time.perf_counter(); out[name] = round(now - t[0], 2); t[0] = now
import medclr.cli, medclr.jobs.score; lap("import medclr.cli + jobs.score")
import torch; lap("import torch")
import medclr.jobs.scoring; lap("import jobs.scoring (pyarrow, pydicom, Pillow)")
from medclr.inference import load_checkpoint; lap("import medclr.inference (torchvision, torch._dynamo)")
import inspect  # as `medclr score` loads it: without the text tower where the checkpoint stores the prompts
kw = {"text": False} if "text" in inspect.signature(load_checkpoint).parameters else {}
engine = load_checkpoint(sys.argv[1], device=sys.argv[3], **kw)
lap("load_checkpoint (weights; the text tower only without stored prompts)")
engine.weights_sha256; lap("weights sha256")
engine.prompt_embeddings(); lap("prompt embeddings")
from pathlib import Path
from medclr.jobs.scoring import find_images, fingerprint
found = find_images(Path(sys.argv[2]))  # (paths, others) since the summary counts what it passes over
[fingerprint(Path(sys.argv[2]) / f) for f in (found[0] if isinstance(found, tuple) else found)]; lap("file walk + stat")
print(json.dumps(out))
"""


def code_env(code: Path, workdir: Path) -> dict[str, str]:
    """The environment that runs ``code`` (a source tree) as ``medclr``. This checkout runs as installed; another
    runs from a shadow package in ``workdir`` (links to its medclr/ entries plus its outer packages, as
    pyproject's package-dir installs them) put first on PYTHONPATH; neither tree is modified."""
    top = code
    if code != ROOT:
        top = workdir / f"code_{hashlib.sha1(str(code).encode()).hexdigest()[:12]}"
        shadow = top / "medclr"
        if not shadow.is_dir():
            shadow.mkdir(parents=True)
            for entry in (code / "medclr").iterdir():
                (shadow / entry.name).symlink_to(entry)
            for name in OUTER_PACKAGES:
                if (code / name).is_dir() and not (shadow / name).exists():
                    (shadow / name).symlink_to(code / name)
    path = os.pathsep.join([str(top)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return dict(os.environ, PYTHONPATH=path)


def command_startup(code: Path, ckpt: Path, tree: Path, out: Path, args) -> dict:
    """``medclr score`` (the code in ``code``) on ``tree``: process start to its first batch scored, and wall."""
    env = code_env(code, args.workdir)
    cmd = [sys.executable, "-m", "medclr", "score", "--checkpoint", str(ckpt), "--input", str(tree), "--out",
           str(out), "--batch-size", str(args.batch_size), "--part-files", str(args.batch_size), "--no-progress",
           "--device", args.device, "--workers", str(args.workers)]
    if code == ROOT:  # an older version has no --decoder
        cmd += ["--decoder", args.decoder]
    _fresh(out)
    started, t = time.time(), time.perf_counter()
    subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, cwd=args.workdir)
    wall = time.perf_counter() - t
    n = len(list(tree.iterdir()))
    rates = pipeline_rates(started, part_times(out), args.batch_size, n, args.workers)
    return {"to_first_batch_s": rates["to_first_batch_s"], "wall_s": round(wall, 2)}


def startup_phases(code: Path, ckpt: Path, tree: Path, args) -> dict:
    done = subprocess.run([sys.executable, "-c", PHASES, str(ckpt), str(tree), args.device],
                          env=code_env(code, args.workdir), capture_output=True, text=True, check=True,
                          cwd=args.workdir)  # not this checkout: python puts the working directory first
    return json.loads(done.stdout.strip().splitlines()[-1])


def startup(ckpt: Path, tree: Path, args, model: str) -> None:
    """Start-up lines for this code and, with --before, the older code: runs alternate (before, after, before,
    after, ...) so both see the same load; the smallest of the runs is reported (the least disturbed)."""
    codes = {"after": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    runs: dict[str, list[dict]] = defaultdict(list)
    for _ in range(args.startup_runs):
        for label, code in sorted(codes.items(), reverse=True):  # before first
            runs[label].append(command_startup(code, ckpt, tree, args.workdir / f"startup_{label}.parquet", args))
    for label, code in sorted(codes.items(), reverse=True):
        best = min(runs[label], key=lambda r: r["to_first_batch_s"])
        emit("startup", best["to_first_batch_s"], "s", code=label, model=model, files=len(list(tree.iterdir())),
             workers=args.workers, wall_s=best["wall_s"],
             all_to_first_batch_s=[r["to_first_batch_s"] for r in runs[label]],
             phases_s=startup_phases(code, ckpt, tree, args))


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
    ap.add_argument("--decoder", choices=("auto", "cpu", "device"), default="auto",
                    help="medclr score --decoder: where greyscale JPEG and uncompressed DICOM finish decoding")
    ap.add_argument("--decode-reps", type=int, default=4)
    ap.add_argument("--no-startup", action="store_true", help="skip the start-up measurement")
    ap.add_argument("--startup-only", action="store_true", help="only the start-up measurement")
    ap.add_argument("--startup-runs", type=int, default=2, help="command runs per code version")
    ap.add_argument("--before", type=Path, default=None,
                    help="a copy of older code (a checkout's root) whose start-up to compare in the same run")
    ap.add_argument("--decode-only", action="store_true", help="only the decode-only rates (no model runs)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "medclr_bench")
    args = ap.parse_args()
    import torch

    from bench_app import build_checkpoint
    from medclr.inference import load_checkpoint, preprocess_image
    from medclr.io import read_image
    from medclr.jobs import score

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.workers is None:
        args.workers = score.default_workers(args.device)
    args.workdir.mkdir(parents=True, exist_ok=True)
    sources = {rows: make_sources(args.workdir, rows) for rows in args.sizes}
    emit("config", os.cpu_count(), "cores", torch_threads=torch.get_num_threads(), workers=args.workers,
         batch_size=args.batch_size, n=args.n, device=args.device, full_decode=args.full_decode, decoder=args.decoder,
         load_avg_1min=round(os.getloadavg()[0], 2))
    if not (args.no_startup or args.decode_only):
        small = link_tree(args.workdir / "tree_startup", sources[args.sizes[0]]["jpeg"], 8)
        for name in args.models:
            startup(build_checkpoint(name, args.workdir), small, args, name)
    for name in [] if args.startup_only else args.models:
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
                dec, best, stages = decode_rate(src, engine.preprocess, args)
                emit("decode_only", round(dec, 2), "img/s", **tag, processes=1, best=round(best, 2))
                for stage, ms in stages.items():
                    emit("stage", ms, "ms/img", **tag, stage=stage, where="main" if stage == "device" else "worker")
                if args.decode_only:
                    continue
                tree = link_tree(args.workdir / f"tree_{size}_{fmt}_{n}", src, n)
                e2e = end_to_end(engine, tree, args.workdir / f"res_{name}_{size}_{fmt}.parquet", args)
                emit("end_to_end", round(e2e["rate"], 2), "img/s", **tag, workers=args.workers, n=n,
                     loop_startup_s=e2e["to_first_batch_s"], steady=e2e["steady"],
                     steady_after_batches=e2e["steady_after_batches"])
                emit("stage", round(e2e["write_ms"], 3), "ms/img", **tag, stage="write", where="main")
                rows.append((tag, e2e))
        if args.decode_only:
            continue
        fwd_after = forward_rate(engine, ref, args.batch_size, n)
        fwd = (fwd_before + fwd_after) / 2
        emit("forward_only", round(fwd, 2), "img/s", model=name, image_size=engine.preprocess.image_size,
             before=round(fwd_before, 2), after=round(fwd_after, 2))
        emit("stage", round(1e3 / fwd, 3), "ms/img", model=name, stage="forward", where="main")
        moved = transfer_ms(engine, ref, args.batch_size)
        if moved is not None:
            emit("stage", round(moved, 3), "ms/img", model=name, stage="transfer", where="main")
        for tag, e2e in rows:
            emit("end_to_end_vs_forward_only", round(e2e["rate"] / fwd, 3), "ratio", vs="goal >= 0.85 (GPU)", **tag)
            if e2e["steady"]:
                emit("steady_vs_forward_only", round(e2e["steady"] / fwd, 3), "ratio", vs="goal >= 0.85 (GPU)", **tag)
    emit("load_avg_1min_end", round(os.getloadavg()[0], 2), "processes")


if __name__ == "__main__":
    main()
