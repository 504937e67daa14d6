"""`medclr index build|add|info|search`: the faiss retrieval index of a checkpoint.

A job over files beside ``score``: it loads the checkpoint (``medclr.inference``) and hands the engine to
``medclr.index``, which takes a model but imports none (the engine's ``retrieve`` opens an index, so the arrow
runs inference -> index; docs/ARCHITECTURE.md section 3)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from pathlib import Path

from medclr.errors import MedclrError
from medclr.index.vectors import EXACT_MAX, KINDS
from medclr.progress import add_progress_flag, progress_wanted

HELP = "build or extend a faiss retrieval index from a checkpoint"  # what `medclr --help` shows

# Before torch/faiss load OpenMP: idle OpenMP threads sleep instead of spinning. On a busy CPU the
# default spin-wait made a ResNet-18 forward 15x slower with 2 threads (2.5 s vs 0.16 s, docs/app.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

EPILOG = """examples:
  medclr index build --checkpoint run/checkpoint --manifest manifest.parquet --out run/index
  medclr index build --checkpoint C --manifest M --out DIR --kind hnsw --workers 4   # force approximate search
  medclr index add   --checkpoint C --manifest new_studies.parquet --index DIR        # incremental
  medclr index info  DIR
  medclr index search --checkpoint C --index DIR --text "small left pleural effusion" -k 5
  medclr index search --checkpoint C --index DIR --image study.dcm

--kind auto (default) uses exact search (IndexIDMap2(IndexFlatIP)) up to --exact-max vectors and
HNSW above; cosine similarity of the global embeddings. A text query to an index of an LSE+NL
checkpoint is re-ranked by the checkpoint's head: faiss's top --pool images (default max(10 k, 100))
are scored with head.score on the image cells stored at build time. The index records the
checkpoint it was built from and refuses to serve another model."""


def _default_workers() -> int:
    return max(0, min(4, (os.cpu_count() or 1) - 1))


def _about(text: str) -> str:
    """A subcommand's description, wrapped (the raw formatter that keeps the examples' layout wraps nothing)."""
    return textwrap.fill(text, 79)


def _common(p: argparse.ArgumentParser, need_manifest: bool) -> None:
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="a `medclr train` checkpoint directory, or the name of a model shipped with medclr "
                   "(`medclr models`)")
    if need_manifest:
        p.add_argument("--manifest", required=True, metavar="PARQUET", help="manifest whose images/reports to index")
        p.add_argument("--splits", default=None, help="comma-separated splits to index (default: all)")
        p.add_argument("--batch-size", type=int, default=32, help="images per forward pass (default 32)")
        p.add_argument("--workers", type=int, default=_default_workers(),
                       help="DataLoader workers decoding images (default: min(4, cores-1))")
        add_progress_flag(p)
    p.add_argument("--device", default="cpu", help="torch device for the model (cpu, cuda, cuda:1; default cpu)")
    p.add_argument("--gpu", choices=("auto", "yes", "no"), default="auto",
                   help="faiss search on GPU when faiss's GPU build is present (default: auto)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="index_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="embed a manifest and write a new index", epilog=EPILOG,
                       description=_about("Embed a manifest's images and report sentences with a checkpoint and "
                                          "write a new faiss index to --out (replacing an index there, atomically); "
                                          "unreadable images are recorded, not indexed."),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(b, True)
    b.add_argument("--out", required=True, metavar="DIR", help="index directory to write (replaced atomically)")
    b.add_argument("--kind", choices=KINDS, default="auto", help="faiss index type (default: auto, by size)")
    b.add_argument("--exact-max", type=int, default=EXACT_MAX, help=f"auto: exact search up to this many vectors "
                   f"(default {EXACT_MAX:,})")
    a = sub.add_parser("add", help="add the rows of a manifest that the index does not hold yet", epilog=EPILOG,
                       description=_about("Embed the rows of a manifest that an index does not hold yet (matched "
                                          "by image path, else by report) and add them; the index must have been "
                                          "built from the same checkpoint."),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(a, True)
    a.add_argument("--index", required=True, metavar="DIR",
                   help="the index directory to extend (from `medclr index build`)")
    i = sub.add_parser("info", help="show what an index holds and which model built it",
                       description=_about("Print an index's manifest as JSON: what it holds, its kinds, and the "
                                          "checkpoint that built it."))
    i.add_argument("index", metavar="DIR", help="an index directory (from `medclr index build`)")
    i.add_argument("--verify", action="store_true",
                   help="also check every data file against the size and SHA-256 recorded when it was written "
                        "(opening an index for search, the app or `add` always does)")
    s = sub.add_parser("search", help="query an index from the command line", epilog=EPILOG,
                       description=_about("Find the indexed images closest to a text or to an image, with the "
                                          "checkpoint that built the index; one JSON line per hit (score, manifest "
                                          "index, image path, report)."),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(s, False)
    s.add_argument("--index", required=True, metavar="DIR",
                   help="the index directory to search (from `medclr index build`)")
    q = s.add_mutually_exclusive_group(required=True)
    q.add_argument("--text", help="find images for this text")
    q.add_argument("--image", help="find similar images to this DICOM/PNG/JPG")
    s.add_argument("-k", type=int, default=5, metavar="K", help="how many hits to print (default 5)")
    s.add_argument("--pool", type=int, default=None, metavar="N",
                   help="--text with an LSE+NL checkpoint: faiss candidates the head re-ranks (default max(10 k, 100))")
    parser.set_defaults(run=run)


def _gpu(flag: str):
    return {"auto": "auto", "yes": True, "no": False}[flag]


def run(args: argparse.Namespace) -> int:
    from medclr.index.store import add_to_index, build_index, load_index, read_meta

    if args.index_command == "info":
        meta = read_meta(args.index)
        if args.verify:
            from medclr.index.store import check_files

            if not meta.get("files"):
                raise MedclrError(f"index {args.index!r} records no checksums (built before medclr recorded them), so it "
                                  "cannot be verified; rebuild it with `medclr index build`")
            check_files(Path(args.index), meta, hashes=True)
        print(json.dumps(meta, indent=2, sort_keys=True))
        if args.verify:
            print(f"verified: {len(meta.get('files') or {})} data files match their recorded size and SHA-256",
                  file=sys.stderr)
        return 0
    if args.index_command in ("build", "add"):
        if args.batch_size < 1:
            raise MedclrError("--batch-size: expected >= 1")
        if not Path(args.manifest).is_file():
            raise MedclrError(f"--manifest {args.manifest!r}: no such file (make one with `medclr prepare`)")
    from medclr.inference import load_checkpoint

    engine = load_checkpoint(args.checkpoint, device=args.device)
    if args.index_command == "search":
        index = load_index(args.index, engine, use_gpu=_gpu(args.gpu), verify=True)
        if args.text is not None:
            if not args.text.strip():
                raise MedclrError("--text: expected a non-empty phrase")
            hits = index.search_images_by_text(engine.embed_texts([args.text]), args.k, pool=args.pool)[0]
        else:
            hits = index.search_images(engine.embed_images([args.image]), args.k)[0]
        for h in hits:
            print(json.dumps({"score": round(h["score"], 4), "manifest_index": int(h["manifest_index"]),
                              "image_path": h["image_path"], "report": h["report"]}))
        return 0
    manifest = Path(args.manifest)
    splits = [s.strip() for s in args.splits.split(",") if s.strip()] if args.splits else None
    progress = progress_wanted(args)
    start = time.perf_counter()
    if args.index_command == "build":
        index = build_index(engine, manifest, args.out, kind=args.kind, exact_max=args.exact_max, splits=splits,
                            batch_size=args.batch_size, workers=args.workers, use_gpu=_gpu(args.gpu), progress=progress)
    else:
        index = add_to_index(engine, args.index, manifest, splits=splits, batch_size=args.batch_size,
                             workers=args.workers, use_gpu=_gpu(args.gpu), progress=progress)
    c = index.meta["counts"]
    print(f"index {index.directory}: {c['images']} images ({index.meta['kind']['images']}), {c['sentences']} "
          f"sentences ({index.meta['kind']['sentences']}), {c['errors']} unreadable; "
          f"{time.perf_counter() - start:.1f} s")
    return 0
