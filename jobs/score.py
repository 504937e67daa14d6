"""`medclr score`: batch-score a directory tree of radiographs into a parquet table, resumably."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from medclr.errors import MedclrError
from medclr.progress import add_progress_flag, progress_wanted

HELP = "batch-score a directory tree of radiographs, resumably"  # what `medclr --help` shows

# Before torch/faiss load OpenMP: idle OpenMP threads sleep instead of spinning. On a busy CPU the
# default spin-wait made a ResNet-18 forward 15x slower with 2 threads (2.5 s vs 0.16 s, docs/app.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

EPILOG = """examples:
  medclr score --checkpoint run/checkpoint --input /archive/cxr --out results.parquet
  medclr score --checkpoint C --input DIR --out results.parquet --embeddings --workers 6 --device cuda
  medclr score --checkpoint C --input DIR --out results.parquet --full-decode   # the app's exact inputs
  medclr score --checkpoint C --input study.dcm --out results.csv              # one file, a CSV table
  torchrun --nproc_per_node 4 -m medclr score --checkpoint C --input DIR --out results.parquet --device cuda

Writes results.parquet (path, height, width, the DICOM header's view, study_uid, series_uid and sop_uid
(empty for PNG/JPEG; --no-uids leaves them out), one probability column per CheX5 class with its "<class>
reason" column[, embedding]) and results.errors.parquet (path, error) for files that could not be read; a
run that scores nothing (every file unreadable) writes both and exits 1 with the first reason. An --out that
holds a file `medclr score` did not write is refused unless --overwrite. The probabilities are the
checkpoint's calibrated ones: at the end of training each finding's zero-shot score was calibrated (Platt
scaling) on the validation split; a finding whose validation AUC is below 0.70 (or flipped) is NaN and its
reason says so. A checkpoint without that record (older ones) gives the raw softmax over the prompt pair,
with "not validated" in every reason column (docs/scoring.md). Work is saved in results.parquet.parts/ as it
goes: rerun the same command after a crash (or on a grown archive) and only the files not yet scored, or
changed (size or mtime) since they were scored, are scored, each exactly once; a changed file's row is
replaced."""


def available_cores() -> int:
    """CPUs this process may run on: its affinity mask (a container's or taskset's cpuset), not the machine's
    count that ``os.cpu_count()`` reports."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 2


def default_workers(device: str) -> int:
    """Decoding processes: all cores but the main process's one, at most 8 on the CPU (where the model needs
    cores too) and 32 on a GPU (where decoding is the whole CPU load; each worker keeps 4 batches in flight)."""
    return max(1, min(32 if device.startswith("cuda") else 8, available_cores() - 1))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="a `medclr train` checkpoint directory, or the name of a model shipped with medclr "
                        "(`medclr models`)")
    parser.add_argument("--input", required=True, metavar="PATH",
                        help="directory tree of DICOM/PNG/JPEG files, or one such file")
    parser.add_argument("--out", required=True, metavar="TABLE",
                        help="results table to write: .parquet or .csv (the errors table takes the same format)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace whatever --out and its errors table hold (without it, a file there that is not "
                             "a `medclr score` table is refused; an earlier run's table is resumed or replaced)")
    parser.add_argument("--embeddings", action="store_true", help="also store each image's global embedding")
    parser.add_argument("--prompts", metavar="FILE", default=None,
                        help="a .yaml/.yml or .json file of class -> {positive: [...], negative: [...]} to score "
                             "instead of the CheX5 pairs, e.g. the YAML line `Cardiomegaly: {positive: [The heart is "
                             "enlarged], negative: [Heart size normal]}` (each side one prompt or a list); the "
                             "checkpoint's calibration covers the CheX5 pairs only, so these columns hold the raw "
                             "softmax over each pair, with a reason")
    parser.add_argument("--no-uids", dest="uids", action="store_false",
                        help="leave out the DICOM columns view, study_uid, series_uid, sop_uid (on by default so the "
                             "table joins back to the PACS; UIDs identify studies, so the table is then as sensitive "
                             "as the archive)")
    parser.add_argument("--batch-size", type=int, default=16, help="images per forward pass (default 16)")
    parser.add_argument("--workers", type=int, default=None,
                        help="DataLoader processes decoding images (default: cores-1, at most 8 on the CPU and 32 "
                             "with --device cuda)")
    parser.add_argument("--part-files", type=int, default=256,
                        help="files per saved part, each part exactly this many but the last (default 256); a "
                             "crash loses at most the files not yet in a part: fewer than this, plus the batch "
                             "being scored")
    parser.add_argument("--device", default="cpu", help="cpu, cuda (under torchrun: cuda:LOCAL_RANK)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads for the model (default: torch's)")
    parser.add_argument("--max-pixels", type=int, default=50_000_000, help="larger images are recorded as errors")
    parser.add_argument("--full-decode", action="store_true",
                        help="decode every pixel and score float32 inputs, as the app does (default: JPEG and "
                             "JPEG 2000 decode at a reduced size, 8-bit images travel as uint8; docs/scoring.md)")
    parser.add_argument("--decoder", choices=("auto", "cpu", "device"), default="auto",
                        help="where greyscale JPEG files and uncompressed DICOM finish decoding: auto = on the GPU "
                             "with --device cuda (nvJPEG; the DICOM display table and the resize there), else in the "
                             "CPU workers; device = on the model's device whatever it is; cpu = always in the "
                             "workers (docs/scoring.md)")
    add_progress_flag(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for flag in ("batch_size", "part_files"):
        if getattr(args, flag) < 1:
            raise MedclrError(f"--{flag.replace('_', '-')}: expected >= 1")
    if args.workers is not None and args.workers < 0:
        raise MedclrError("--workers: expected >= 0")
    from medclr.jobs.scoring import OUTPUT_SUFFIXES, check_out

    if Path(args.out).suffix not in OUTPUT_SUFFIXES:
        raise MedclrError(f"--out {args.out!r}: expected a path ending in .parquet or .csv")
    if args.embeddings and Path(args.out).suffix == ".csv":
        raise MedclrError("--embeddings needs a .parquet --out (a CSV cell holds no vector)")
    check_out(Path(args.out), args.overwrite)  # before the model loads
    import torch

    from medclr.distributed import cleanup, env_world
    from medclr.inference import load_checkpoint
    from medclr.jobs.scoring import ScoreOptions, score_tree
    from medclr.prompts import load_prompts

    prompts = load_prompts(args.prompts) if args.prompts else None  # a bad file fails before the model loads
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rank, _, local_rank = env_world()
    device = f"cuda:{local_rank}" if args.device == "cuda" else args.device  # one GPU per torchrun process
    # the CheX5 prompts' embeddings are stored in the checkpoint: no text tower unless other prompts are asked for
    engine = load_checkpoint(args.checkpoint, device=device, text=prompts is not None)
    workers = default_workers(device) if args.workers is None else args.workers
    opts = ScoreOptions(batch_size=args.batch_size, workers=workers, embeddings=args.embeddings,
                        part_files=args.part_files, max_pixels=args.max_pixels,
                        progress=progress_wanted(args), full_decode=args.full_decode,
                        uids=args.uids, prompts=prompts, decoder=args.decoder, overwrite=args.overwrite)
    try:
        stats = score_tree(engine, Path(args.input), Path(args.out), opts)
    finally:
        cleanup()
    if rank == 0:
        merged = stats.get("merged", {})
        changed = f", {stats['changed']} changed since scored" if stats.get("changed") else ""
        n_other = stats.get("not_images", 0)
        others = f"; {n_other} other {'file' if n_other == 1 else 'files'} passed over, not radiographs" if n_other else ""
        print(f"scored {stats['scored']} files ({stats['errors']} unreadable, {stats['skipped_done']} already done"
              f"{changed}{others}) "
              f"in {stats['seconds']:.1f} s ({stats['scored'] / max(stats['seconds'], 1e-9):.1f} images/s); "
              f"{args.out}: {merged.get('rows', 0)} rows, "
              f"{merged.get('errors', 0)} in the errors table")
    return 0
