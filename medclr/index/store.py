"""The retrieval index directory: image and report-sentence embeddings of a manifest, with ids back to it.

Layout (``DIR``)::

    index_manifest.json      written last and atomically: format, model (checkpoint path, weights
                             SHA-256, preprocessing), kinds, counts, sources, and the data folder
    data-000N/images.faiss   one vector per image-report pair with a readable image (id = row id)
    data-000N/images.parquet id, source, manifest_index, image_path (absolute), study_id, dicom_id,
                             split, view, report
    data-000N/sentences.faiss     one vector per distinct report sentence (id = sentence id)
    data-000N/sentences.parquet   id, sentence, hash, manifest_index (list), image_id (list)
    data-000N/errors.parquet      images that could not be read (path, error)
    data-000N/image_cells.npy     LSE+NL checkpoints only: each indexed image's head image side (the
                                  h*w unit cells after the non-local block), N x h*w x D float16
    data-000N/image_cells_ids.npy the image id of each row of image_cells.npy (int64)

Text -> image search ranks by the checkpoint's similarity head (:meth:`RetrievalIndex.search_images_by_text`):
faiss's cosine over the global embeddings draws a candidate pool, and an LSE+NL head re-ranks it with
``head.score`` on the stored cells. For a cosine head the faiss cosine is the head's score and nothing
is re-ranked. Image -> image search stays on global embeddings (a head scores image-sentence pairs).

A build or an add writes a new ``data-*`` folder, then swaps ``index_manifest.json`` with
``os.replace`` and removes the old folder: a reader sees the old index or the new one, never half of
one, and a crash leaves the previous index intact. The index remembers the checkpoint it was built
from; :func:`load_index` with another model refuses with a clear message.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medclr.errors import MedclrError
from medclr.files import check_free_space, file_sha256, refuse_foreign, write_text
from medclr.index.vectors import EXACT_MAX, VectorIndex, choose_kind, normalized

log = logging.getLogger(__name__)

# /2: every version written records each data file's size and SHA-256 (``files``); /1 indexes may lack them
FORMAT = "medclr.index/2"
FORMATS = ("medclr.index/1", FORMAT)  # what this medclr opens
MANIFEST_NAME = "index_manifest.json"
IMAGE_COLUMNS = ("id", "source", "manifest_index", "image_path", "study_id", "dicom_id", "split", "view", "report")
CELLS_NAME, CELL_IDS_NAME = "image_cells.npy", "image_cells_ids.npy"
# text -> image re-ranking: faiss's top max(RERANK_FACTOR * k, RERANK_MIN) by global cosine are scored by the head
RERANK_FACTOR, RERANK_MIN = 10, 100


def rerank_pool(k: int, ntotal: int, pool: int | None = None) -> int:
    """How many faiss candidates the head re-ranks: ``pool`` (default max(10 k, 100)), at least k, at most
    the index size."""
    want = max(RERANK_FACTOR * k, RERANK_MIN) if pool is None else int(pool)
    return max(1, min(max(want, k), ntotal))


def _head(engine):
    """The engine's similarity head (None for an engine without a DualEncoder model)."""
    return getattr(getattr(engine, "model", None), "head", None)


def head_kind(engine) -> str:
    return getattr(_head(engine), "kind", "cosine")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class RetrievalIndex:
    """A loaded index: two vector indexes and their metadata tables."""

    directory: Path
    meta: dict[str, Any]
    images: VectorIndex
    sentences: VectorIndex
    image_table: pd.DataFrame  # indexed by id
    sentence_table: pd.DataFrame  # indexed by id
    errors: pd.DataFrame
    # set by load_index(engine=...) for an LSE+NL checkpoint whose index holds the cells: text queries re-rank
    head: Any = None
    cells: np.ndarray | None = None  # N x h*w x D float16, memory-mapped
    cell_ids: pd.Index | None = None  # image id of each row of ``cells``
    device: Any = None

    @property
    def reranks(self) -> bool:
        """Whether text -> image search re-ranks faiss's candidates with the checkpoint's head."""
        return self.head is not None and self.cells is not None

    def search_images(self, queries: np.ndarray, k: int = 10) -> list[list[dict[str, Any]]]:
        """Per query, up to k image hits by cosine of the global embeddings: {"id", "score", "manifest_index",
        "image_path", "report", ...}. Image -> image search; for a text query see :meth:`search_images_by_text`."""
        return self._hits(self.images, self.image_table, queries, k)

    def search_images_by_text(self, text_emb: np.ndarray, k: int = 10, pool: int | None = None
                              ) -> list[list[dict[str, Any]]]:
        """Per sentence embedding, up to k image hits ranked by the checkpoint's similarity head.

        LSE+NL (:attr:`reranks`): faiss's top ``pool`` images by global cosine (default max(10 k, 100),
        see :func:`rerank_pool`) are re-ranked by ``head.score`` of the sentence against each candidate's
        stored cells; ``score`` is the head's score and ``cosine`` the global cosine faiss ranked by.
        Otherwise (cosine head, or an index without cells) this is :meth:`search_images`.
        """
        if not self.reranks:
            return self.search_images(text_emb, k)
        import torch

        q = normalized(text_emb)
        cos, ids = self.images.search(q, rerank_pool(k, self.images.ntotal, pool))
        out = []
        for qi in range(len(q)):
            keep = ids[qi] >= 0
            cand, cand_cos = ids[qi][keep], cos[qi][keep]
            rows = self.cell_ids.get_indexer(cand)
            if (rows < 0).any():
                raise MedclrError(f"index {str(self.directory)!r}: image id {int(cand[rows < 0][0])} has no stored "
                                  f"cells ({CELLS_NAME} out of step); rebuild it with `medclr index build`")
            order = np.argsort(rows, kind="stable")  # read the memory map in file order
            # float16 -> float32 in torch: numpy's conversion took 6x longer (2.9 vs 0.44 ms for 100 x 64 x 128)
            side = torch.from_numpy(np.ascontiguousarray(self.cells[rows[order]])).to(self.device).float()
            with torch.inference_mode():
                s = self.head.score(side, torch.from_numpy(q[qi:qi + 1]).to(self.device))[:, 0]
            score = np.empty(len(cand), np.float64)
            score[order] = s.double().cpu().numpy()
            hits = []
            for j in np.argsort(-score, kind="stable")[:k]:  # ties keep faiss's order
                rec = self.image_table.loc[int(cand[j])].to_dict()
                rec.update(id=int(cand[j]), score=float(score[j]), cosine=float(cand_cos[j]))
                hits.append(rec)
            out.append(hits)
        return out

    def search_sentences(self, queries: np.ndarray, k: int = 10) -> list[list[dict[str, Any]]]:
        return self._hits(self.sentences, self.sentence_table, queries, k)

    @staticmethod
    def _hits(vi: VectorIndex, table: pd.DataFrame, queries: np.ndarray, k: int) -> list[list[dict[str, Any]]]:
        scores, ids = vi.search(queries, k)
        out = []
        for srow, irow in zip(scores, ids):
            hits = []
            for s, i in zip(srow.tolist(), irow.tolist()):
                if i < 0 or i not in table.index:
                    continue
                rec = table.loc[i].to_dict()
                rec.update(id=int(i), score=float(s))
                hits.append(rec)
            out.append(hits)
        return out

    def check_model(self, engine) -> None:
        """Refuse an index built from another checkpoint (or other preprocessing) than ``engine``'s."""
        check_model(self.meta, engine, self.directory)


def check_model(meta: dict[str, Any], engine, directory: Path) -> None:
    built = meta.get("model", {})
    have = engine.describe()
    if built.get("weights_sha256") != have["weights_sha256"]:
        raise MedclrError(
            f"index {str(directory)!r} was built from checkpoint {built.get('checkpoint')!r} "
            f"(weights {str(built.get('weights_sha256'))[:12]}), not from {have['checkpoint']!r} "
            f"(weights {have['weights_sha256'][:12]}); rebuild it with `medclr index build --checkpoint "
            f"{have['checkpoint']} --manifest M --out DIR`")
    if built.get("preprocess") != have["preprocess"]:
        raise MedclrError(f"index {str(directory)!r} was built with preprocessing {built.get('preprocess')}, "
                          f"the model now uses {have['preprocess']}; rebuild the index")


def read_meta(directory: str | os.PathLike) -> dict[str, Any]:
    d = Path(directory)
    path = d / MANIFEST_NAME
    if not path.is_file():
        raise MedclrError(f"{str(d)!r}: not a medclr index (no {MANIFEST_NAME}; build one with `medclr index build`)")
    try:
        meta = json.loads(path.read_text())
    except ValueError as exc:
        raise MedclrError(f"{path}: not valid JSON ({exc})") from None
    if meta.get("format") not in FORMATS:
        raise MedclrError(f"{path}: format {meta.get('format')!r}, expected {' or '.join(map(repr, FORMATS))}")
    if not meta.get("files") and meta["format"] != FORMATS[0]:
        raise MedclrError(f"{path}: format {meta['format']!r} records the size and SHA-256 of every data file, but "
                          "this one has no 'files' record, so its files cannot be verified (the manifest was edited); "
                          "rebuild the index with `medclr index build`")
    return meta


def load_index(directory: str | os.PathLike, engine=None, use_gpu: bool | str = "auto",
               head: bool = True, verify: bool = False) -> RetrievalIndex:
    """Open an index directory; with ``engine`` (an :class:`~medclr.inference.Inference`), check that
    it was built from the same checkpoint and (``head``) attach the checkpoint's head and the stored cells
    so that :meth:`RetrievalIndex.search_images_by_text` ranks by the head. Every data file's size is checked
    against the manifest's record, and with ``verify`` its SHA-256 (a read of every file: the app's start and
    `medclr index search` ask for it, a library caller opening an index in a loop need not): a damaged index
    is refused in one line."""
    d = Path(directory)
    meta = read_meta(d)
    check_files(d, meta, hashes=verify)
    if engine is not None:
        check_model(meta, engine, d)
    data = d / meta["data"]
    try:
        img_t = pd.read_parquet(data / "images.parquet").set_index("id", drop=False)
        sen_t = pd.read_parquet(data / "sentences.parquet").set_index("id", drop=False)
        errors = pd.read_parquet(data / "errors.parquet")
    except (OSError, ValueError) as exc:
        raise MedclrError(f"index {str(d)!r}: damaged metadata in {meta['data']} ({exc})") from None
    images = VectorIndex.read(data / "images.faiss", meta["kind"]["images"], use_gpu)
    sentences = VectorIndex.read(data / "sentences.faiss", meta["kind"]["sentences"], use_gpu)
    index = RetrievalIndex(d, meta, images, sentences, img_t, sen_t, errors)
    if engine is not None and head and head_kind(engine) != "cosine":
        cells = _read_cells(d, meta, images.ntotal, engine.joint_dim, head_kind(engine))
        if cells is not None:
            index.head, index.device = _head(engine), engine.device
            index.cells, index.cell_ids = cells[0], pd.Index(cells[1])
    return index


def check_files(d: Path, meta: dict[str, Any], hashes: bool = True) -> None:
    """The data folder's files against the sizes and SHA-256 the manifest recorded when they were written. An index
    built before medclr recorded them (format /1) cannot be checked: said once in the log (``index info --verify``
    refuses); a later format without the record is refused by :func:`read_meta`."""
    if not meta.get("files"):
        log.warning("index %s records no sizes or checksums (built before medclr recorded them): damage to its files "
                    "cannot be detected; rebuild it with `medclr index build` to have them checked", d)
    for name, rec in (meta.get("files") or {}).items():
        path = d / meta["data"] / name
        size = path.stat().st_size if path.is_file() else None
        if size != rec["size"] or (hashes and file_sha256(path) != rec["sha256"]):
            what = "missing" if size is None else ("of another size" if size != rec["size"] else "changed since it was written")
            raise MedclrError(f"index {str(d)!r}: {meta['data']}/{name} is {what} (the index manifest records "
                              f"{rec['size']} bytes and their SHA-256); rebuild it with `medclr index build`")


def _read_cells(d: Path, meta: dict[str, Any], ntotal: int, dim: int, kind: str):
    """(cells memory map, ids) of an index built with a ``kind`` head, or None with a warning for an index
    that holds none (built by a medclr before the head re-ranking): text search then ranks by global cosine."""
    hm = meta.get("head") or {}
    if hm.get("kind") != kind or not hm.get("cells"):
        log.warning("index %r holds no %s image cells (built by an older medclr): text -> image search ranks "
                    "by global cosine, not by the checkpoint's head; rebuild it with `medclr index build` to "
                    "rank by the head", str(d), kind)
        return None
    data = d / meta["data"]
    try:
        cells = np.load(data / hm["cells"], mmap_mode="r")
        ids = np.load(data / hm["cell_ids"])
    except (OSError, ValueError) as exc:
        raise MedclrError(f"index {str(d)!r}: damaged head cells in {meta['data']} ({exc}); rebuild it with "
                          "`medclr index build`") from None
    if cells.ndim != 3 or len(cells) != len(ids) or len(ids) != ntotal or cells.shape[2] != dim:
        raise MedclrError(f"index {str(d)!r}: head cells of shape {cells.shape} for {ntotal} images of dim {dim}; "
                          "rebuild it with `medclr index build`")
    return cells, ids


# --------------------------------------------------------------------------------- building
def _rows_from_manifest(manifest: Path, source: int) -> pd.DataFrame:
    from medclr.data.manifest import read_manifest

    df = read_manifest(manifest)
    root = Path(df.attrs.get("root", "") or manifest.parent)
    paths = [os.path.abspath(root / p) if p else "" for p in df["image_path"]]
    return pd.DataFrame({
        "source": np.int64(source), "manifest_index": df["index"].astype("int64"), "image_path": paths,
        "study_id": df["study_id"].astype(str), "dicom_id": df["dicom_id"].astype(str),
        "split": df["split"].astype(str), "view": df["view"].astype(str), "report": df["report"].astype(str),
        "sentences": df["sentences"],
    })


class _CellSink:
    """The head's image side of each embedded image, written as float16 to a scratch .npy memory map as the
    batches arrive (an index of 1e5 images at 8x8 cells x 128 dims holds 1.6 GB of cells)."""

    def __init__(self, head, path: Path, n: int) -> None:
        self.head, self.path, self.n = head, path, n
        self.cells: np.ndarray | None = None
        self.grid: tuple[int, int] | None = None

    def put(self, idx: np.ndarray, features) -> None:
        import torch

        with torch.inference_mode():
            side = self.head.image_side(features).float().cpu().numpy()  # B x h*w x D unit cells
        if self.cells is None:
            self.cells = np.lib.format.open_memmap(self.path, mode="w+", dtype=np.float16,
                                                   shape=(self.n, *side.shape[1:]))
            _reserve(self.path)
            self.grid = tuple(int(g) for g in features.grid)
        self.cells[idx] = side.astype(np.float16)


def _reserve(path: Path) -> None:
    """Allocate the memory map's whole file now: a map over a sparse file on a full disk dies with SIGBUS at the
    first page it cannot place; reserved, a short disk is one line before any image is embedded."""
    size = path.stat().st_size
    if not hasattr(os, "posix_fallocate"):  # macOS, Windows: no reservation, as before
        return
    try:
        with open(path, "r+b") as fh:
            os.posix_fallocate(fh.fileno(), 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise MedclrError(f"{path.parent}: not enough disk space for the index's image cells ({size / 2**20:.0f} MB "
                          "needed); free some space or build the index elsewhere") from None


def remove_stale_scratch(directory: Path) -> list[Path]:
    """Scratch files and half-written data folders that a killed or crashed build left in ``directory`` (their
    writer's process is gone); returns what was removed."""
    removed = []
    for p in list(directory.glob(".cells-scratch*.npy")) + list(directory.glob(".data-*.tmp*")):
        pid = p.stem.rsplit("scratch", 1)[-1] if p.name.startswith(".cells-scratch") else p.name.rsplit(".tmp", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    if removed:
        log.info("index %s: removed %d file(s) a stopped build left behind", directory, len(removed))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _embed_images(engine, paths: list[str], batch_size: int, workers: int, progress: bool | str,
                  cells: _CellSink | None = None):
    vecs = np.zeros((len(paths), engine.joint_dim), np.float32)
    ok = np.zeros(len(paths), bool)
    errors: list[tuple[str, str]] = []
    loader = engine.image_batches(paths, batch_size, workers)  # the engine decodes files its own way
    from medclr.progress import progress_bar

    loader = progress_bar(loader, total=len(loader), desc="embedding images", unit="batch", enabled=progress)
    for batch in loader:
        good = batch["ok"]
        for j in np.flatnonzero(~good.numpy()):
            errors.append((paths[int(batch["i"][j])], batch["error"][j]))
        if good.any():
            idx = batch["i"][good].numpy()
            features = engine.image_features(batch["tensor"][good])
            vecs[idx] = features.global_emb.float().cpu().numpy()
            if cells is not None:
                cells.put(idx, features)
            ok[idx] = True
    return vecs, ok, errors


def _write_version(directory: Path, meta: dict[str, Any], images: VectorIndex, sentences: VectorIndex,
                   image_table: pd.DataFrame, sentence_table: pd.DataFrame, errors: pd.DataFrame,
                   extra: Callable[[Path], None] | None = None) -> None:
    """Write a new data folder (``extra(folder)`` writes more files into it), swap the manifest atomically,
    remove the previous folder."""
    directory.mkdir(parents=True, exist_ok=True)
    old = meta.get("data")
    n = 1 + max([int(p.name.split("-")[1]) for p in directory.glob("data-*") if p.name.split("-")[1].isdigit()],
                default=0)
    name = f"data-{n:04d}"
    tmp = directory / f".{name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    images.write(tmp / "images.faiss")
    sentences.write(tmp / "sentences.faiss")
    image_table.reset_index(drop=True).to_parquet(tmp / "images.parquet", index=False)
    sentence_table.reset_index(drop=True).to_parquet(tmp / "sentences.parquet", index=False)
    errors.reset_index(drop=True).to_parquet(tmp / "errors.parquet", index=False)
    if extra is not None:
        extra(tmp)
    files = {}
    for f in sorted(tmp.iterdir()):  # durable before the switch; sizes and hashes for the readers
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
        files[f.name] = {"size": f.stat().st_size, "sha256": file_sha256(f)}
    os.replace(tmp, directory / name)
    meta = dict(meta, format=FORMAT, data=name, updated=_now(), files=files)  # an /1 index added to becomes /2
    write_text(directory / MANIFEST_NAME, json.dumps(meta, indent=2, sort_keys=True))
    if old and old != name:
        shutil.rmtree(directory / old, ignore_errors=True)


def _sentence_rows(rows: pd.DataFrame, image_ids: np.ndarray) -> dict[str, dict[str, Any]]:
    """hash -> {"sentence", "manifest_index": [...], "image_id": [...]} over the rows' sentences."""
    from medclr.data.text import sentence_hash

    out: dict[str, dict[str, Any]] = {}
    for sents, midx, iid in zip(rows["sentences"], rows["manifest_index"], image_ids):
        for s in sents:
            s = " ".join(str(s).split())
            if not s:
                continue
            rec = out.setdefault(sentence_hash(s), {"sentence": s, "manifest_index": [], "image_id": []})
            rec["manifest_index"].append(int(midx))
            rec["image_id"].append(int(iid))
    return out


def build_index(engine, manifest: str | os.PathLike, out: str | os.PathLike, kind: str = "auto",
                exact_max: int = EXACT_MAX, splits: list[str] | None = None, batch_size: int = 32,
                workers: int = 0, use_gpu: bool | str = "auto", progress: bool = False) -> RetrievalIndex:
    """Embed a manifest's images and report sentences with ``engine`` and write an index at ``out``
    (replacing one there atomically)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise MedclrError(f"--out {str(out)!r} is a file; expected a directory for the index")
    refuse_foreign(out, lambda d: (d / MANIFEST_NAME).is_file(), "a medclr index")
    old_meta = read_meta(out) if (out / MANIFEST_NAME).is_file() else {}
    empty = _empty_index(engine, old_meta, kind, exact_max)
    return _extend(engine, empty, manifest, out, kind, exact_max, splits, batch_size, workers, use_gpu, progress,
                   fresh=True)


def add_to_index(engine, directory: str | os.PathLike, manifest: str | os.PathLike, splits: list[str] | None = None,
                 batch_size: int = 32, workers: int = 0, use_gpu: bool | str = "auto",
                 progress: bool = False) -> RetrievalIndex:
    """Embed the rows of ``manifest`` not yet in the index (by image path, else report) and add them."""
    current = load_index(directory, engine, use_gpu=False, head=False)
    return _extend(engine, current, manifest, Path(directory), current.meta["kind"]["requested"],
                   int(current.meta["kind"].get("exact_max", EXACT_MAX)), splits, batch_size, workers, use_gpu,
                   progress, fresh=False)


def _empty_index(engine, old_meta: dict[str, Any], kind: str, exact_max: int) -> RetrievalIndex:
    meta = {"format": FORMAT, "created": _now(), "data": old_meta.get("data"), "sources": []}
    return RetrievalIndex(Path("."), meta, None, None,  # type: ignore[arg-type]
                          pd.DataFrame(columns=list(IMAGE_COLUMNS)),
                          pd.DataFrame(columns=["id", "sentence", "hash", "manifest_index", "image_id"]),
                          pd.DataFrame(columns=["source", "path", "error"]))


def _key(path: str, report: str) -> str:
    return path if path else "report:" + hashlib.sha1(report.encode()).hexdigest()


def _extend(engine, cur: RetrievalIndex, manifest, out: Path, kind: str, exact_max: int, splits, batch_size: int,
            workers: int, use_gpu, progress: bool, fresh: bool) -> RetrievalIndex:
    scratch = out / f".cells-scratch{os.getpid()}.npy"  # the new images' cells until the version is written
    if out.is_dir():
        remove_stale_scratch(out)
    try:
        return _extend_to(engine, cur, manifest, out, kind, exact_max, splits, batch_size, workers, use_gpu, progress,
                          fresh, scratch)
    finally:
        scratch.unlink(missing_ok=True)


def _extend_to(engine, cur: RetrievalIndex, manifest, out: Path, kind: str, exact_max: int, splits, batch_size: int,
               workers: int, use_gpu, progress: bool, fresh: bool, scratch: Path) -> RetrievalIndex:
    manifest = Path(manifest)
    sources = list(cur.meta.get("sources", []))
    source = len(sources)
    rows = _rows_from_manifest(manifest, source)
    if splits:
        rows = rows[rows["split"].isin(splits)]
    seen = {_key(p, r) for p, r in zip(cur.image_table.get("image_path", []), cur.image_table.get("report", []))}
    rows = rows[[_key(p, r) not in seen for p, r in zip(rows["image_path"], rows["report"])]].reset_index(drop=True)
    first_id = int(cur.image_table["id"].max()) + 1 if len(cur.image_table) else 0
    ids = np.arange(first_id, first_id + len(rows), dtype=np.int64)
    has_path = rows["image_path"] != ""
    paths = rows.loc[has_path, "image_path"].tolist()
    # LSE+NL: each image's head image side goes to image_cells.npy (a cosine head needs none)
    hkind = head_kind(engine)
    old_head = cur.meta.get("head") or {}
    with_cells = hkind != "cosine" and (fresh or (old_head.get("kind") == hkind and bool(old_head.get("cells"))))
    if hkind != "cosine" and not with_cells:
        log.warning("index %r holds no %s image cells (built by an older medclr): the added images get none "
                    "either and text -> image search ranks by global cosine; rebuild it with `medclr index "
                    "build` to rank by the head", str(out), hkind)
    n_sentences = sum(len(s) for s in rows["sentences"])  # an upper bound on the new distinct ones
    check_free_space(out, _space_needed(engine, len(paths), len(cur.image_table), len(cur.sentence_table) + n_sentences,
                                        with_cells), f"the index of {len(paths)} new images")
    out.mkdir(parents=True, exist_ok=True)
    sink = _CellSink(_head(engine), scratch, len(paths)) if with_cells else None
    vecs, ok, errors = _embed_images(engine, paths, batch_size, workers, progress, sink)
    img_ids = ids[has_path.to_numpy()]

    # sentences: new distinct ones get vectors; known ones get more occurrences
    occ = _sentence_rows(rows, ids)
    sen_t = cur.sentence_table.copy()
    known = dict(zip(sen_t.get("hash", []), sen_t.get("id", [])))
    new_hashes = [h for h in occ if h not in known]
    next_sid = int(sen_t["id"].max()) + 1 if len(sen_t) else 0
    sen_ids = np.arange(next_sid, next_sid + len(new_hashes), dtype=np.int64)
    sen_vecs = engine.embed_texts([occ[h]["sentence"] for h in new_hashes]) if new_hashes else \
        np.zeros((0, engine.joint_dim), np.float32)
    if len(sen_t):
        sen_t = sen_t.set_index("hash", drop=False)
        for h in set(occ) & set(known):
            sen_t.at[h, "manifest_index"] = list(sen_t.at[h, "manifest_index"]) + occ[h]["manifest_index"]
            sen_t.at[h, "image_id"] = list(sen_t.at[h, "image_id"]) + occ[h]["image_id"]
    new_sen = pd.DataFrame({"id": sen_ids, "sentence": [occ[h]["sentence"] for h in new_hashes], "hash": new_hashes,
                            "manifest_index": [occ[h]["manifest_index"] for h in new_hashes],
                            "image_id": [occ[h]["image_id"] for h in new_hashes]})
    sen_t = pd.concat([sen_t.reset_index(drop=True), new_sen], ignore_index=True) if len(sen_t) else new_sen

    # vector indexes: fresh build chooses kinds by size; an add keeps the existing ones
    n_img_total = len(cur.image_table) + int(ok.sum())
    if fresh:
        k_img = choose_kind(n_img_total, kind, exact_max)
        k_sen = choose_kind(len(sen_t), kind, exact_max)
        images = VectorIndex.create(engine.joint_dim, k_img, train=vecs[ok], use_gpu=False)
        sentences = VectorIndex.create(engine.joint_dim, k_sen, train=sen_vecs, use_gpu=False)
    else:
        images, sentences = cur.images, cur.sentences
        k_img, k_sen = images.kind, sentences.kind
    images.add(vecs[ok], img_ids[ok])
    sentences.add(sen_vecs, sen_ids)

    table = rows.drop(columns=["sentences"]).assign(id=ids)
    keep = np.ones(len(rows), bool)
    keep[np.flatnonzero(has_path.to_numpy())[~ok]] = False  # unreadable images are not indexed
    table = pd.concat([cur.image_table.reset_index(drop=True), table[keep][list(IMAGE_COLUMNS)]], ignore_index=True)
    err = pd.DataFrame([(source, p, e) for p, e in errors], columns=["source", "path", "error"])
    all_err = pd.concat([cur.errors, err], ignore_index=True) if len(cur.errors) else err
    if errors:
        log.warning("index: %d image(s) could not be read and were skipped, e.g. %s", len(errors), errors[0][1])
    sources.append({"manifest": str(manifest.resolve()), "sha256": file_sha256(manifest), "rows_added": len(rows),
                    "images_added": int(ok.sum()), "errors": len(errors), "splits": splits, "added": _now()})
    meta = dict(cur.meta, sources=sources, model=engine.describe(), dim=engine.joint_dim,
                kind={"images": k_img, "sentences": k_sen, "requested": kind, "exact_max": exact_max},
                counts={"images": images.ntotal, "sentences": sentences.ntotal, "errors": len(all_err)})
    extra = None
    if hkind == "cosine":
        meta["head"] = {"kind": "cosine"}  # the faiss cosine is the head's score: no cells
    elif sink is not None:
        old = _read_cells(out, cur.meta, images.ntotal - int(ok.sum()), engine.joint_dim, hkind) if not fresh else None
        new_rows = np.flatnonzero(ok)
        parts = ([(old[0], np.arange(len(old[1])))] if old is not None else []) + \
            ([(sink.cells, new_rows)] if sink.cells is not None else [])
        cell_ids = np.concatenate([old[1] if old is not None else np.zeros(0, np.int64), img_ids[ok]]).astype(np.int64)
        tail = next((tuple(a.shape[1:]) for a, _ in parts), (0, engine.joint_dim))
        grid = sink.grid or (cur.meta.get("head") or {}).get("grid")
        meta["head"] = {"kind": hkind, "config": _head(engine).to_config(), "cells": CELLS_NAME,
                        "cell_ids": CELL_IDS_NAME, "dtype": "float16", "grid": list(grid) if grid else None,
                        "cells_per_image": int(tail[0]), "bytes_per_image": int(np.prod(tail)) * 2}

        def extra(folder: Path) -> None:
            _write_cells(folder / CELLS_NAME, parts, tail)
            np.save(folder / CELL_IDS_NAME, cell_ids)
    _write_version(out, meta, images, sentences, table, sen_t, all_err, extra)
    return load_index(out, engine if sink is not None else None, use_gpu=use_gpu)


def _space_needed(engine, n_new: int, n_old: int, n_sentences: int, with_cells: bool) -> int:
    """Bytes a build or add writes, roughly: the new version's vectors (float32, images and sentences) and, under
    an LSE+NL head, its float16 cells of every image plus the scratch copy of the new images' cells."""
    vectors = (n_old + n_new + n_sentences) * engine.joint_dim * 4
    if not with_cells:
        return vectors
    return vectors + (n_old + 2 * n_new) * engine.region_cells * engine.joint_dim * 2


def _write_cells(path: Path, parts: list[tuple[np.ndarray, np.ndarray]], tail: tuple[int, ...],
                 chunk: int = 4096) -> None:
    """Concatenate the selected rows of each (array, rows) part into one float16 .npy, chunk by chunk."""
    total = sum(len(r) for _, r in parts)
    dst = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(total, *tail))
    at = 0
    for src, sel in parts:
        for start in range(0, len(sel), chunk):
            rows = sel[start:start + chunk]
            dst[at:at + len(rows)] = src[rows]
            at += len(rows)
    dst.flush()
    del dst
