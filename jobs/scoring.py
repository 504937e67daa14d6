"""Batch scoring of a radiograph archive: CheX5 (or ``--prompts``) zero-shot probabilities (and embeddings) per image.

The probabilities are the engine's calibrated ones (``Inference.calibrated``): a finding the checkpoint
does not read is NaN, and the column ``<class> reason`` says why (null where the finding is read; the
"not validated" notice, with the raw softmax, for a checkpoint that records no validation).

Crash safety (append-only parts + a done-set):

* results go to ``OUT.parts/`` as parquet parts, each written to a temporary name and renamed, so a
  part is either complete or absent; a part holds one row per file it covers (``ok`` rows with scores,
  error rows with the one-line reason);
* every row keeps the file's size and mtime (ns) as stat'ed just before it was read, and the run that
  wrote it (``run``, one more than any run in the parts);
* on start, the done-set is the paths whose newest row (highest ``run``) still matches the file's size
  and mtime; only other files are scored, so after a crash (even SIGKILL) the files of the part in flight
  are scored again and nothing twice, and a file changed in place since it was scored is scored again;
* at the end ``OUT`` (scores, sorted by path) and ``OUT`` with ``.errors.parquet`` (unreadable files)
  are rebuilt from the newest row of each path in all parts, atomically (a rescored file's older row
  stays in its part, superseded). Rerunning on a grown archive scores only the new and changed files.
* ``OUT.parts/run.json`` records the checkpoint (weights SHA-256), preprocessing, options and the
  archive's root: resuming with a different model, options or archive is refused (relative paths of
  two archives would otherwise count as done for each other and mix in one table).
* ``OUT`` and its errors table replace only tables `medclr score` wrote (:func:`check_out`); any other file
  there is refused in one line unless ``--overwrite``.
* a run that ends with no scored row (every file unreadable, or none found) is an error naming the first
  reason, after the tables are written (the errors table holds every reason).

Sharding: under ``torchrun`` (RANK / WORLD_SIZE set), rank r takes files r, r + W, r + 2W, ... of the
sorted list and writes its own parts; rank 0 merges after a barrier (gloo).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medclr.distributed import env_world, init_group
from medclr.errors import MedclrError
from medclr.files import atomic_path, check_free_space, refuse_foreign, write_text
from medclr.io import IMAGE_SUFFIXES
from medclr.io.dicom import ARCHIVE_FIELDS, is_dicom

log = logging.getLogger("medclr.score")
RUN_NAME = "run.json"


def find_images(root: Path, skip: Path | None = None) -> tuple[list[str], int]:
    """(sorted posix paths, relative to ``root``, of DICOM/PNG/JPEG files; how many other files were passed over).
    Extensionless files count when they carry the DICOM magic. Hidden files and folders are skipped, uncounted."""
    out, others = [], 0
    skip = skip.resolve() if skip is not None else None
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and (skip is None or (here / d).resolve() != skip))
        for name in filenames:
            if name.startswith("."):
                continue
            suffix = Path(name).suffix.lower()
            if suffix in IMAGE_SUFFIXES or (suffix == "" and is_dicom(here / name)):
                out.append((here / name).relative_to(root).as_posix())
            else:
                others += 1
    return sorted(out), others


def parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


OUTPUT_SUFFIXES = (".parquet", ".csv")  # the results table's format, by the suffix of --out


def errors_path(out: Path) -> Path:
    """results.parquet -> results.errors.parquet; results.csv -> results.errors.csv."""
    return out.with_name(out.stem + ".errors" + out.suffix)


# columns every table `medclr score` writes (results and errors) holds: how a rerun knows its own earlier output
OWN_COLUMNS = ("path", "size", "mtime_ns")


def is_score_table(path: Path) -> bool:
    """Whether ``path`` holds a results or errors table of `medclr score` (its own columns, in Parquet or CSV)."""
    try:
        if path.suffix == ".csv":
            import csv

            with open(path, newline="", encoding="utf-8") as fh:
                columns = next(csv.reader(fh), [])
        else:
            columns = pq.read_schema(path).names
    except (OSError, UnicodeDecodeError, ValueError, pa.ArrowException):
        return False
    return set(OWN_COLUMNS) <= set(columns)


def check_out(out: Path, overwrite: bool = False) -> None:
    """Refuse, in one line, an ``--out`` (or its errors table) that holds a file `medclr score` did not write,
    unless ``overwrite``: an earlier run's tables are replaced (their parts resume), nothing else is."""
    if out.is_dir():
        raise MedclrError(f"--out {str(out)!r} is a directory; expected a .parquet file path")
    for path, what in ((out, "a `medclr score` table"), (errors_path(out), "a `medclr score` errors table")):
        refuse_foreign(path, is_score_table, what, overwrite=overwrite)


def fingerprint(path: Path) -> tuple[int, int]:
    """(size, mtime in ns) of a file, (-1, -1) when it cannot be stat'ed: one stat, no read.

    Not a content hash: hashing would read the whole archive on every resume (as many bytes as scoring
    it), a stat is one metadata call per file. A rewrite that keeps both size and mtime to the
    nanosecond (e.g. ``touch -r`` after editing) is not noticed."""
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1)
    return (int(st.st_size), int(st.st_mtime_ns))


def scored(parts: Path) -> dict[str, tuple[int, tuple[int, int] | None]]:
    """path -> (run, (size, mtime_ns)) of its newest row in the parts; the fingerprint is None for rows
    written before fingerprints were kept (they count as done, as they did then)."""
    latest: dict[str, tuple[int, tuple[int, int] | None]] = {}
    for p in sorted(parts.glob("part-*.parquet")):
        names = pq.read_schema(p).names
        cols = pq.read_table(p, columns=[c for c in ("path", "run", "size", "mtime_ns") if c in names]).to_pydict()
        n = len(cols["path"])
        runs = cols.get("run", [0] * n)
        sizes, mtimes = cols.get("size", [None] * n), cols.get("mtime_ns", [None] * n)
        for path, run, size, mtime in zip(cols["path"], runs, sizes, mtimes):
            if path not in latest or run > latest[path][0]:
                latest[path] = (run, None if size is None else (size, mtime))
    return latest


def done_set(latest: dict[str, tuple[int, tuple[int, int] | None]], prints: dict[str, tuple[int, int]]) -> set[str]:
    """The files of ``prints`` (path -> current fingerprint) whose newest row still matches them."""
    return {f for f, fp in prints.items() if f in latest and latest[f][1] in (None, fp)}


def _write_atomic(table: pa.Table, path: Path) -> None:
    """Parquet, or CSV for a path ending in .csv (the parts are always Parquet)."""
    with atomic_path(path) as tmp:
        if path.suffix == ".csv":
            from pyarrow import csv

            csv.write_csv(table, tmp)
        else:
            pq.write_table(table, tmp)


@dataclass
class ScoreOptions:
    batch_size: int = 16
    workers: int = 1
    embeddings: bool = False
    part_files: int = 256  # rows per part (the last part: the rest); a crash loses fewer, plus the batch in flight
    max_pixels: int = 50_000_000
    progress: bool | str = "auto"  # medclr.progress: "auto" draws the bar when stderr is a terminal
    # decode every pixel and pass float32: the app's exact input. Off: JPEG and JPEG 2000 decode at a reduced
    # size and 8-bit sources travel as uint8 (docs/scoring.md, "Throughput")
    full_decode: bool = False
    # the DICOM header's view position and study / series / instance UIDs as columns, so the table joins back
    # to the PACS (identifiers: the table is then as sensitive as the archive; docs/scoring.md)
    uids: bool = True
    # class -> {"positive": [...], "negative": [...]} (``medclr.prompts.load_prompts``); None: the CheX5 pairs,
    # the only prompts the checkpoint's validation calibrated (others give the raw softmax, with a reason)
    prompts: dict | None = None
    # where baseline JPEG and uncompressed DICOM finish decoding (``medclr.inference.device_decode``): auto = on
    # a CUDA model's GPU, else in the CPU workers; cpu; device = on the model's device whatever it is
    decoder: str = "auto"
    # replace whatever --out (and its errors table) holds; without it only an earlier `medclr score` table is
    overwrite: bool = False

    @property
    def decode(self) -> str:
        return "full" if self.full_decode else "reduced"


# what differs between a recorded run and this one, as the refusal says it: "holds a run scored <this>"
_RUN_DIFFERS = {"weights_sha256": "with other model weights", "preprocess": "with other preprocessing",
                "embeddings": "with another --embeddings setting", "classes": "for other classes",
                "tau": "at another temperature (tau)", "root": "from another --input root",
                "decode": "with another decode (--full-decode)", "findings": "with another validation record",
                "uids": "with another --uids setting", "prompts": "with other prompts"}


def _check_run(parts: Path, run: dict[str, Any]) -> None:
    path = parts / RUN_NAME
    if path.is_file():
        before = json.loads(path.read_text())
        before.setdefault("decode", "full")  # runs recorded before the reduced decode decoded in full
        before.setdefault("findings", None)  # runs recorded before calibration: raw probabilities
        before.setdefault("uids", False)  # runs recorded before the archive columns
        before.setdefault("prompts", None)  # runs recorded before --prompts: the CheX5 pairs
        for key in ("weights_sha256", "preprocess", "embeddings", "classes", "tau", "root", "decode", "findings",
                    "uids", "prompts"):
            if key == "root" and key not in before:
                continue  # runs recorded before the archive root was checked
            if before.get(key) != run.get(key):
                shown = ("or none" if key == "findings"
                         else f"recorded {before.get(key)!r}, now {run.get(key)!r}")
                raise MedclrError(
                    f"{parts} holds a run scored {_RUN_DIFFERS[key]} ({shown}); "
                    + ("resume it with --full-decode, or " if key == "decode" and before[key] == "full" else "")
                    + ("resume it with --no-uids, or " if key == "uids" and not before[key] else "")
                    + "use another --out, or delete that folder to start over")
    else:
        write_text(path, json.dumps(run, indent=2, sort_keys=True))


def score_tree(engine, root: str | os.PathLike, out: str | os.PathLike,
               opts: ScoreOptions | None = None) -> dict[str, Any]:
    """Score every image under ``root`` (a folder, or one image file) into ``out`` (resumable). Returns counts
    for this process."""
    opts = opts or ScoreOptions()
    root, out = Path(root), Path(out)
    single = root.name if root.is_file() else None
    if single is not None:
        root = root.parent
    elif not root.is_dir():
        raise MedclrError(f"--input {str(root)!r}: no such file or directory")
    check_out(out, opts.overwrite)
    rank, world, _ = env_world()
    parts = parts_dir(out)
    parts.mkdir(parents=True, exist_ok=True)
    classes = list(engine.prompt_embeddings(opts.prompts))
    run = {"weights_sha256": engine.weights_sha256, "checkpoint": str(engine.checkpoint_dir),
           "preprocess": {"image_size": engine.preprocess.image_size, "resize": engine.preprocess.resize_to},
           "embeddings": bool(opts.embeddings), "classes": classes, "tau": engine.tau,
           "root": str((root / single if single else root).resolve()),
           "decode": opts.decode, "findings": engine.findings_record, "uids": bool(opts.uids),
           "prompts": opts.prompts}
    if rank == 0:
        _check_run(parts, run)
    group = _init_group(world)
    if rank != 0:
        _barrier(group)  # rank 0 has checked/written run.json
        _check_run(parts, run)
    else:
        _barrier(group)

    found, not_images = ([single], 0) if single else find_images(root, skip=parts)
    files = found[rank::world]
    # stat'ed before reading: a file changed while it is read keeps its old fingerprint and is rescored
    prints = {f: fingerprint(root / f) for f in files}
    latest = scored(parts)
    done = done_set(latest, prints)
    todo = [f for f in files if f not in done]
    changed = sum(f in latest for f in todo)
    # newer than every row in the parts: a rescored file's new row supersedes its old one
    this_run = 1 + max((r for r, _ in latest.values()), default=0)
    seq = 1 + max((int(p.stem.split("-")[2]) for p in parts.glob(f"part-r{rank:03d}-*.parquet")), default=0)
    log.info("score: rank %d/%d: %d files, %d already done, %d to score (%d changed since scored)", rank, world,
             len(files), len(files) - len(todo), len(todo), changed)
    stats = {"files": len(files), "skipped_done": len(files) - len(todo), "changed": changed, "scored": 0,
             "errors": 0, "parts": 0, "header_blanked": 0, "seconds": 0.0, "not_images": not_images}
    check_free_space(out, _space_needed(found, len(todo), len(classes), engine.joint_dim, opts),
                     f"the score table of {len(found)} files")
    start = time.perf_counter()
    if todo:
        stats.update(_score_files(engine, root, todo, prints, this_run, parts, rank, seq, classes, opts))
    notes = engine.finding_notes(classes, opts.prompts)
    stats["seconds"] = time.perf_counter() - start
    _barrier(group)
    if rank == 0:
        stats["merged"] = merge(out, classes, opts.embeddings, notes, opts.uids)
    _barrier(group)
    if rank == 0 and stats["merged"]["rows"] == 0:  # after the last barrier: no rank is left waiting
        raise MedclrError(_nothing_scored(root / single if single else root, len(found), not_images, out,
                                          stats["merged"]["first_error"]))
    return stats


def _nothing_scored(root: Path, found: int, not_images: int, out: Path, first: tuple[str, str] | None) -> str:
    if not found:
        return (f"--input {root}: no DICOM, PNG or JPEG file found ({not_images} other "
                f"{'file' if not_images == 1 else 'files'} passed over); nothing was scored")
    # a reader's reason names the file itself ("a.dcm: truncated ..."); it is not named twice
    where = (f" (first: {first[1] if first[1].startswith(f'{first[0]}: ') else f'{first[0]}: {first[1]}'})"
             if first else "")
    return (f"--input {root}: none of its {found} {'image' if found == 1 else 'images'} could be read, nothing was "
            f"scored{where}; every reason is in {errors_path(out)}")


def _score_files(engine, root: Path, todo: list[str], prints: dict[str, tuple[int, int]], this_run: int,
                 parts: Path, rank: int, seq: int, classes: list[str], opts: ScoreOptions) -> dict[str, int]:
    from medclr.inference.device_decode import describe, device_formats, model_inputs
    from medclr.inference.engine import NON_FINITE
    from medclr.inference.preprocess import image_loader

    fast = not opts.full_decode
    formats = device_formats(opts.decoder, engine.device, opts.full_decode)
    log.info("score: %s", describe(formats, engine.device, opts.workers))
    loader = image_loader([root / f for f in todo], engine.preprocess, opts.batch_size, opts.workers,
                          max_pixels=opts.max_pixels, reduced=fast, uint8=fast,
                          pin_memory=engine.device.type == "cuda", device_formats=formats)
    from medclr.progress import progress_bar

    bar = progress_bar(total=len(todo), unit="img", desc=f"scoring (rank {rank})" if env_world()[1] > 1 else "scoring",
                       enabled=opts.progress)
    pending: list[dict[str, Any]] = []
    counts = {"scored": 0, "errors": 0, "parts": 0, "header_blanked": 0}
    engine.prompt_embeddings(opts.prompts)  # encode the prompts once, before the loop (the engine caches them)

    def flush(last: bool = False) -> None:
        """Parts of exactly --part-files rows (a batch larger than that fills several); the last one the rest."""
        nonlocal seq, pending
        while pending and (last or len(pending) >= opts.part_files):
            rows, pending = pending[:opts.part_files], pending[opts.part_files:]
            _write_atomic(_table(rows, classes, opts.embeddings, opts.uids),
                          parts / f"part-r{rank:03d}-{seq:06d}.parquet")
            seq += 1
            counts["parts"] += 1

    for batch in loader:
        images = model_inputs(batch, engine.preprocess, engine.device)  # a file the device cannot read: not ok now
        ok = batch["ok"]
        probs = emb = finite = None
        if ok.any():
            feats = engine.image_features(images)
            finite = feats.global_emb.isfinite().all(dim=1).tolist()  # NaN/inf: an error row, never a score
            _, raw, s_pos, s_neg = engine.zero_shot_scores(feats, opts.prompts)
            probs, _notes = engine.calibrated(classes, raw, s_pos, s_neg, opts.prompts)
            emb = feats.global_emb.float().cpu().numpy() if opts.embeddings else None
        k = 0
        for j, i in enumerate(batch["i"].tolist()):
            error = batch["error"][j].replace(str(root / todo[i]), todo[i])  # paths relative to --input
            size, mtime_ns = prints[todo[i]]
            good = bool(ok[j])
            if good:
                pos, k = k, k + 1  # its place among the batch's decoded images
                if not finite[pos]:
                    good, error = False, NON_FINITE
            counts["header_blanked"] += bool(batch["fields"][j].get("blanked"))
            row: dict[str, Any] = {"path": todo[i], "ok": good, "error": error, "size": size, "mtime_ns": mtime_ns,
                                   "run": this_run, "height": int(batch["height"][j]), "width": int(batch["width"][j]),
                                   "caution": batch["caution"][j], "fields": batch["fields"][j]}
            if good:
                row["probs"] = probs[pos]
                row["embedding"] = emb[pos] if emb is not None else None
                counts["scored"] += 1
            else:
                counts["errors"] += 1
            pending.append(row)
        bar.update(len(batch["i"]))
        flush()
    flush(last=True)
    bar.close()
    if counts["header_blanked"] and opts.uids:
        log.warning("score: %d file(s) hold a view or UID in their DICOM header that is not a DICOM code string or UID "
                    "(a damaged or crafted header); written as \"\" in the table, never as read (medclr.io.codes)",
                    counts["header_blanked"])
    return counts


def _space_needed(found: list[str], todo: int, classes: int, dim: int, opts: ScoreOptions) -> int:
    """Bytes of the parts still to write and of the merged tables, uncompressed (parquet writes less): per row its
    path, the fixed columns, a probability and a reason per class, the UIDs and the embedding when asked for."""
    row = 64 + 64 * classes + 64 * len(ARCHIVE_FIELDS) * opts.uids + 4 * dim * opts.embeddings
    mean_path = sum(len(f.encode()) for f in found) / max(len(found), 1)
    return round((todo + len(found)) * (row + mean_path))


def _table(rows: list[dict[str, Any]], classes: list[str], embeddings: bool, uids: bool) -> pa.Table:
    n = len(rows)
    cols: dict[str, Any] = {
        "path": pa.array([r["path"] for r in rows], pa.string()),
        "ok": pa.array([r["ok"] for r in rows], pa.bool_()),
        "error": pa.array([r["error"] for r in rows], pa.string()),
        "size": pa.array([r["size"] for r in rows], pa.int64()),
        "mtime_ns": pa.array([r["mtime_ns"] for r in rows], pa.int64()),
        "run": pa.array([r["run"] for r in rows], pa.int32()),
        "height": pa.array([r["height"] for r in rows], pa.int32()),
        "width": pa.array([r["width"] for r in rows], pa.int32()),
        "caution": pa.array([r["caution"] for r in rows], pa.string()),
    }
    for name in ARCHIVE_FIELDS if uids else ():
        cols[name] = pa.array([r["fields"].get(name, "") for r in rows], pa.string())
    for c, name in enumerate(classes):
        cols[name] = pa.array([float(r["probs"][c]) if r["ok"] else None for r in rows], pa.float32())
    if embeddings:
        cols["embedding"] = pa.array([r["embedding"].astype(np.float32).tolist() if r["ok"] else None for r in rows],
                                     pa.list_(pa.float32()))
    assert all(len(v) == n for v in cols.values())
    return pa.table(cols)


def merge(out: Path, classes: list[str], embeddings: bool, notes: dict[str, str | None] | None = None,
          uids: bool = True) -> dict[str, int]:
    """Rebuild OUT (ok rows) and the errors table from the newest row of each path in all parts, atomically;
    OUT gets a ``<class> reason`` column per class from ``notes`` (``Inference.calibrated``)."""
    parts = sorted(parts_dir(out).glob("part-*.parquet"))
    if parts:
        table = pa.concat_tables([pq.read_table(p) for p in parts], promote_options="default")
    else:
        table = _table([], classes, embeddings, uids)
    if "run" not in table.column_names:  # parts written before runs were numbered
        table = table.append_column("run", pa.array(np.zeros(table.num_rows, np.int32)))
    newest: dict[str, tuple[int, int]] = {}  # path -> (run, row)
    runs = table.column("run").fill_null(0).to_pylist()
    for i, (path, run) in enumerate(zip(table.column("path").to_pylist(), runs)):
        if path in newest and newest[path][0] == run:  # cannot happen by construction; refuse to hide it
            raise MedclrError(f"{parts_dir(out)}: {path} has two rows of the same run; "
                              "the parts folder was edited by hand?")
        if path not in newest or run > newest[path][0]:
            newest[path] = (run, i)
    table = table.take(pa.array([newest[p][1] for p in sorted(newest)], pa.int64())).drop_columns(["run"])
    ok = table.column("ok")
    good = table.filter(ok).drop_columns(["ok", "error"])
    for name in classes:
        note = (notes or {}).get(name)
        good = good.append_column(f"{name} reason", pa.array([note] * good.num_rows, pa.string()))
    bad = table.filter(pc.invert(ok))
    bad = bad.select([c for c in ("path", "error", "size", "mtime_ns") if c in bad.column_names])
    meta = {b"medclr": json.dumps(json.loads((parts_dir(out) / RUN_NAME).read_text())).encode()}
    _write_atomic(good.replace_schema_metadata(meta), out)
    _write_atomic(bad.replace_schema_metadata(meta), errors_path(out))
    first = bad.select(["path", "error"]).slice(0, 1).to_pylist()
    return {"rows": good.num_rows, "errors": bad.num_rows,
            "first_error": (first[0]["path"], first[0]["error"]) if first else None}


# --------------------------------------------------------------------------------- torchrun
def _init_group(world: int):
    if world <= 1:
        return None
    import torch.distributed as dist

    init_group("gloo", timeout_s=12 * 3600.0)  # a barrier only: gloo also between GPU processes
    return dist.group.WORLD


def _barrier(group) -> None:
    if group is not None:
        import torch.distributed as dist

        dist.barrier(group=group)


