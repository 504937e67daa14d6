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

A build or an add writes a new ``data-*`` folder, then swaps ``index_manifest.json`` with
``os.replace`` and removes the old folder: a reader sees the old index or the new one, never half of
one, and a crash leaves the previous index intact. The index remembers the checkpoint it was built
from; :func:`load_index` with another model refuses with a clear message.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medclr.errors import MedclrError
from medclr.index.vectors import EXACT_MAX, VectorIndex, choose_kind

log = logging.getLogger(__name__)

FORMAT = "medclr.index/1"
MANIFEST_NAME = "index_manifest.json"
IMAGE_COLUMNS = ("id", "source", "manifest_index", "image_path", "study_id", "dicom_id", "split", "view", "report")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


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

    def search_images(self, queries: np.ndarray, k: int = 10) -> list[list[dict[str, Any]]]:
        """Per query, up to k image hits: {"id", "score", "manifest_index", "image_path", "report", ...}."""
        return self._hits(self.images, self.image_table, queries, k)

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
    if meta.get("format") != FORMAT:
        raise MedclrError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def load_index(directory: str | os.PathLike, engine=None, use_gpu: bool | str = "auto") -> RetrievalIndex:
    """Open an index directory; with ``engine`` (an :class:`~medclr.inference.Inference`), check that
    it was built from the same checkpoint."""
    d = Path(directory)
    meta = read_meta(d)
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
    return RetrievalIndex(d, meta, images, sentences, img_t, sen_t, errors)


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


def _embed_images(engine, paths: list[str], batch_size: int, workers: int, progress: bool):
    from medclr.inference import image_loader

    vecs = np.zeros((len(paths), engine.joint_dim), np.float32)
    ok = np.zeros(len(paths), bool)
    errors: list[tuple[str, str]] = []
    loader = image_loader(paths, engine.preprocess, batch_size, workers)
    if progress:
        from tqdm import tqdm

        loader = tqdm(loader, total=len(loader), desc="embedding images", unit="batch")
    for batch in loader:
        good = batch["ok"]
        for j in np.flatnonzero(~good.numpy()):
            errors.append((paths[int(batch["i"][j])], batch["error"][j]))
        if good.any():
            idx = batch["i"][good].numpy()
            vecs[idx] = engine.image_features(batch["tensor"][good]).global_emb.float().cpu().numpy()
            ok[idx] = True
    return vecs, ok, errors


def _write_version(directory: Path, meta: dict[str, Any], images: VectorIndex, sentences: VectorIndex,
                   image_table: pd.DataFrame, sentence_table: pd.DataFrame, errors: pd.DataFrame) -> None:
    """Write a new data folder, swap the manifest atomically, remove the previous folder."""
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
    for f in tmp.iterdir():  # durable before the switch
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    os.replace(tmp, directory / name)
    meta = dict(meta, data=name, updated=_now())
    mtmp = directory / (MANIFEST_NAME + ".tmp")
    mtmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    with open(mtmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(mtmp, directory / MANIFEST_NAME)
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
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_NAME).is_file():
        raise MedclrError(f"--out {str(out)!r} exists and is not a medclr index; choose an empty or new directory")
    old_meta = read_meta(out) if (out / MANIFEST_NAME).is_file() else {}
    empty = _empty_index(engine, old_meta, kind, exact_max)
    return _extend(engine, empty, manifest, out, kind, exact_max, splits, batch_size, workers, use_gpu, progress,
                   fresh=True)


def add_to_index(engine, directory: str | os.PathLike, manifest: str | os.PathLike, splits: list[str] | None = None,
                 batch_size: int = 32, workers: int = 0, use_gpu: bool | str = "auto",
                 progress: bool = False) -> RetrievalIndex:
    """Embed the rows of ``manifest`` not yet in the index (by image path, else report) and add them."""
    current = load_index(directory, engine, use_gpu=False)
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
    vecs, ok, errors = _embed_images(engine, rows.loc[has_path, "image_path"].tolist(), batch_size, workers, progress)
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
    sources.append({"manifest": str(manifest.resolve()), "sha256": _file_sha256(manifest), "rows_added": len(rows),
                    "images_added": int(ok.sum()), "errors": len(errors), "splits": splits, "added": _now()})
    meta = dict(cur.meta, sources=sources, model=engine.describe(), dim=engine.joint_dim,
                kind={"images": k_img, "sentences": k_sen, "requested": kind, "exact_max": exact_max},
                counts={"images": images.ntotal, "sentences": sentences.ntotal, "errors": len(all_err)})
    _write_version(out, meta, images, sentences, table, sen_t, all_err)
    return load_index(out, use_gpu=use_gpu)
