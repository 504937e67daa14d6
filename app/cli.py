"""`medclr app`: serve the clinician web app (Gradio) for a checkpoint and a retrieval index."""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import re
from pathlib import Path

from medclr.errors import MedclrError
from medclr.inference.heatmap import SMOOTH_SIGMA

HELP = "serve the clinician web app (Gradio) on 127.0.0.1"  # what `medclr --help` shows

log = logging.getLogger("medclr.app")

# Before torch/faiss load OpenMP: idle OpenMP threads sleep instead of spinning. On a busy CPU the
# default spin-wait made a ResNet-18 forward 15x slower with 2 threads (2.5 s vs 0.16 s, docs/app.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

EPILOG = """examples:
  medclr app --checkpoint run/checkpoint --index run/index             # http://127.0.0.1:7860
  medclr app --checkpoint C --index DIR --port 8080 --auth-file users.txt
  MEDCLR_APP_AUTH=alice:s3cret medclr app --checkpoint C --index DIR   # one user from the environment
  medclr app --checkpoint C --index DIR --host 0.0.0.0 --allowed-hosts cxr-ws01 --auth-file users.txt

The app binds 127.0.0.1 (this machine only) unless --host says otherwise; it is never shared through
a public Gradio link, and sends no telemetry. It answers only requests addressed to localhost, the
bound address or an --allowed-hosts name, and refuses cross-origin requests (DNS rebinding, other
sites' pages: see docs/app.md). Named API endpoints for gradio_client: /preview,
/zero_shot, /ground, /retrieve_by_image, /retrieve_by_text, /inspect_sentence (see docs/app.md)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="a `medclr train` checkpoint directory, or the name of a model shipped with medclr "
                        "(`medclr models`)")
    parser.add_argument("--index", metavar="DIR", help="retrieval index from `medclr index build` (same checkpoint)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 exposes "
                        "the app to the network: use --auth)")
    parser.add_argument("--allowed-hosts", action="append", metavar="NAME[,NAME]", help="host names the app is "
                        "reached under besides localhost and the bound address (e.g. the machine's name, or a "
                        "reverse proxy's public name); requests whose Host header names anything else are refused "
                        "(DNS rebinding). Repeatable or comma-separated; * turns the Host check off")
    parser.add_argument("--port", type=int, default=7860,
                        help="port (default 7860; 0 = the first free port from 7860 up; the address is printed once "
                             "the server listens)")
    parser.add_argument("--auth", metavar="USER:PASSWORD", help="require this login (prefer --auth-file or "
                        "MEDCLR_APP_AUTH: command lines are visible to other users)")
    parser.add_argument("--auth-file", metavar="FILE", help="file of USER:PASSWORD lines")
    parser.add_argument("--max-upload-mb", type=float, default=64.0, help="largest upload accepted (default 64 MB)")
    parser.add_argument("--max-pixels", type=int, default=50_000_000, help="largest image accepted, in pixels "
                        "(default 50 million)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: all cores)")
    parser.add_argument("--queue-size", type=int, default=32, help="requests waiting before new ones are refused")
    parser.add_argument("--smoothing", type=float, default=SMOOTH_SIGMA, help="heatmap Gaussian sigma in grid cells "
                        f"(BioViL: {SMOOTH_SIGMA}; 0 = raw)")
    parser.add_argument("--keep-minutes", type=float, default=30.0, help="result images (preview, heatmap, "
                        "thumbnails) and uploads no request has read are deleted after this many minutes "
                        "(default 30); everything goes when the app stops")
    parser.set_defaults(run=run)


def parse_auth(auth: str | None, auth_file: str | None) -> list[tuple[str, str]] | None:
    pairs: list[tuple[str, str]] = []
    lines: list[tuple[str, str]] = []
    env = os.environ.get("MEDCLR_APP_AUTH")
    if auth:
        lines.append(("--auth", auth))
    if env:
        lines.append(("MEDCLR_APP_AUTH", env))
    if auth_file:
        path = Path(auth_file)
        if not path.is_file():
            raise MedclrError(f"--auth-file {str(path)!r}: no such file")
        lines += [(f"{path}:{n}", ln.strip()) for n, ln in enumerate(path.read_text().splitlines(), 1)
                  if ln.strip() and not ln.lstrip().startswith("#")]
    for where, text in lines:
        user, sep, password = text.partition(":")
        if not sep or not user or not password:
            raise MedclrError(f"{where}: expected USER:PASSWORD")
        pairs.append((user, password))
    return pairs or None


def _mb(value: float) -> str:
    return f"{int(value * 1024)}kb"


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise MedclrError(f"--port {args.port}: expected 0..65535")
    if args.max_upload_mb <= 0:
        raise MedclrError("--max-upload-mb: expected > 0")
    if args.keep_minutes <= 0:
        raise MedclrError("--keep-minutes: expected > 0")
    from medclr.pretrained import resolve

    try:  # a checkpoint folder, or a model shipped in the package by name (its files checked here, once)
        checkpoint = resolve(args.checkpoint)
    except MedclrError as exc:
        raise MedclrError(f"--checkpoint: {exc}") from None
    if not checkpoint.is_dir():
        raise MedclrError(f"--checkpoint {args.checkpoint!r}: no such directory (expected a `medclr train` output)")
    if args.index and not Path(args.index).is_dir():
        raise MedclrError(f"--index {args.index!r}: no such directory (build one with `medclr index build`)")
    auth = parse_auth(args.auth, args.auth_file)
    from medclr.app.hosts import WILDCARD_BINDS, parse_allowed_hosts

    allowed_hosts = parse_allowed_hosts(getattr(args, "allowed_hosts", None))
    if args.host not in ("127.0.0.1", "localhost", "::1") and not auth:
        log.warning("app: binding %s without --auth: anyone who can reach this machine can use the app", args.host)
    if not re.fullmatch(r"[\w.:\-\[\]]+", args.host):
        raise MedclrError(f"--host {args.host!r}: expected an IP address or host name")
    if args.host in WILDCARD_BINDS and not allowed_hosts:
        log.warning("app: bound to every interface: it answers requests addressed to an IP address or localhost; "
                    "give the names it is reached under with --allowed-hosts")
    from medclr.app import tempdir

    # SIGTERM/SIGHUP end the process through `finally` and atexit (their default action skips both), so
    # the private temp folder (uploads, results) is removed however the app is stopped, short of SIGKILL
    tempdir.exit_on_signals()
    # At exit CPython's last garbage collection walks every object still alive (torch, transformers, gradio: some
    # 600k), 1.5-2 s of CPU after the app has cleaned up, seconds of wall time on a busy machine; frozen, they are
    # freed by their reference counts alone. Registered before torch and gradio load, it runs after their exit
    # handlers (the last registered runs first).
    atexit.register(gc.freeze)
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from medclr.app.service import AppService
    from medclr.app.ui import build_blocks, launch, serve_until_interrupted
    from medclr.index import load_index
    from medclr.inference import load_checkpoint

    engine = load_checkpoint(checkpoint, device=args.device)
    index = load_index(args.index, engine, verify=True) if args.index else None  # hashes checked once, at start
    if index is None:
        log.warning("app: no --index given; the retrieval tab will say so")
    service = AppService(engine, index, max_pixels=args.max_pixels,
                         max_upload_bytes=int(args.max_upload_mb * 2**20), smoothing=args.smoothing)
    demo = build_blocks(service)
    try:
        launch(demo, host=args.host, port=args.port or None, auth=auth, max_file_size=_mb(args.max_upload_mb),
               queue_size=args.queue_size, block=False, keep_minutes=args.keep_minutes, allowed_hosts=allowed_hosts)
        # the port the server bound (with --port 0, the first free one), printed once it is listening
        print(f"medclr app: serving {args.checkpoint} on http://{args.host}:{demo.server_port} (Ctrl+C stops); "
              f"temporary files in {tempdir.private_temp_dir()} (removed on exit)", flush=True)
        serve_until_interrupted(demo)
    finally:
        demo.close(verbose=False)  # no request can write into the folder once it is gone
        tempdir.remove_private_temp_dir()
    return 0
