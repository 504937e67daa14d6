"""Batch-scoring throughput as a ratio to model-forward-only throughput on the same images.

For each format (uncompressed DICOM = RG1_UNCI, JPEG 2000 lossless DICOM = RG1_J2KR; 1955 x 1841,
MONOCHROME1) a tree of N links to the file is scored by ``medclr.app.scoring.score_tree`` (DataLoader
workers decode while the model runs; parts written as it goes). "Forward-only" runs the same model
calls (image forward + CheX5 zero-shot head) on the same images already decoded and preprocessed in
memory, same batch size. ratio = scoring img/s / forward-only img/s (goal >= 0.85). Decode-only
throughput of one process is printed too: it bounds what W workers can feed (W x decode rate).

    OMP_NUM_THREADS=2 python bench/bench_score.py [--models small biovil] [--n 48] [--workers 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the medclr CLI does (docs/app.md)
sys.path.insert(0, str(Path(__file__).resolve().parent))



def emit(metric: str, value, unit: str, vs=None, **extra) -> None:
    print(json.dumps({"bench": "score", "metric": metric, "value": value, "unit": unit, "vs": vs, **extra}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["small", "biovil"])
    ap.add_argument("--n", type=int, default=48, help="images per format")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "medclr_bench")
    args = ap.parse_args()
    import torch
    from pydicom.data import get_testdata_file

    from bench_app import build_checkpoint
    from medclr.app.scoring import ScoreOptions, score_tree
    from medclr.inference import load_checkpoint, preprocess_image
    from medclr.io import read_image

    args.workdir.mkdir(parents=True, exist_ok=True)
    emit("config", os.cpu_count(), "cores", torch_threads=torch.get_num_threads(), workers=args.workers,
         batch_size=args.batch_size, n=args.n, load_avg_1min=round(os.getloadavg()[0], 2))
    formats = {"uncompressed": get_testdata_file("RG1_UNCI.dcm"), "jpeg2000": get_testdata_file("RG1_J2KR.dcm")}
    for fmt, src in formats.items():
        t = time.perf_counter()
        for _ in range(3):
            read_image(src)
        emit("decode_only_1proc", round(3 / (time.perf_counter() - t), 2), "img/s", format=fmt)
    for name in args.models:
        engine = load_checkpoint(build_checkpoint(name, args.workdir))
        for fmt, src in formats.items():
            tag = {"model": name, "format": fmt, "image_size": engine.preprocess.image_size}
            tree = args.workdir / f"tree_{fmt}"
            if not tree.is_dir() or len(list(tree.glob("*.dcm"))) != args.n:
                shutil.rmtree(tree, ignore_errors=True)
                tree.mkdir(parents=True)
                for i in range(args.n):
                    os.symlink(src, tree / f"img{i:04d}.dcm")
            # forward only: the same images, decoded and preprocessed beforehand
            tensor = preprocess_image(read_image(src), engine.preprocess)[0]
            batch = tensor[None].expand(args.batch_size, -1, -1, -1).contiguous()
            for _ in range(2):  # warm-up
                engine.zero_shot_scores(engine.image_features(batch))
            t = time.perf_counter()
            for _ in range(0, args.n, args.batch_size):
                engine.zero_shot_scores(engine.image_features(batch))
            fwd = args.n / (time.perf_counter() - t)
            out = args.workdir / f"res_{name}_{fmt}.parquet"
            for p in (out, out.with_name(out.name + ".parts")):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            opts = ScoreOptions(batch_size=args.batch_size, workers=args.workers, part_files=16, progress=False)
            t = time.perf_counter()
            stats = score_tree(engine, tree, out, opts)
            wall = time.perf_counter() - t
            assert stats["scored"] == args.n, stats
            score = args.n / wall
            emit("forward_only", round(fwd, 2), "img/s", **tag)
            emit("scoring", round(score, 2), "img/s", **tag, workers=args.workers)
            emit("scoring_vs_forward_only", round(score / fwd, 3), "ratio", vs="goal >= 0.85", **tag,
                 workers=args.workers)
    emit("load_avg_1min_end", round(os.getloadavg()[0], 2), "processes")


if __name__ == "__main__":
    main()
