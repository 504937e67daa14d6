"""medclr.index with the checkpoint's similarity head (issue 13): text -> image search re-ranks faiss's
global-cosine candidates with an LSE+NL head's ``score`` on the image cells stored at build time.

(a) a pool covering the index gives the top-k of a float64 brute force of head.score over all images;
(b) a smaller pool gives faiss's candidates re-ordered by the head; (c) an index without cells (built
by an older medclr) falls back to global cosine with a logged warning; (d) a cosine-head checkpoint
gives exactly what the global-cosine search gave before.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from medclr.index import MANIFEST_NAME, add_to_index, build_index, load_index
from medclr.index.store import CELL_IDS_NAME, CELLS_NAME, rerank_pool
from tests.conftest_app import SENTENCES, _draw_cxr, build_text_model, synthetic_test_manifest

N_IMAGES = 30
QUERIES = SENTENCES[:6] + ["small left pleural effusion", "right pneumothorax"]


def _checkpoint(out: Path, text_dir: Path, head: str) -> Path:
    from medclr.inference import CheckpointMeta, weights_sha256, write_metadata
    from medclr.models.dual import build_dual_encoder

    torch.manual_seed(3)
    cfg = {"type": "lse_nl", "gamma": 20.0} if head == "lse_nl" else "cosine"
    model = build_dual_encoder(text_dir, arch="resnet18", joint_dim=32, head=cfg, image_pretrained="none")
    if head == "lse_nl":
        # a non-identity non-local block (its output projection starts at zero) so that the head's cells
        # differ from the projected regions the global embedding averages
        torch.nn.init.normal_(model.head.nl.out.weight, std=0.5)
        model.head.trained = True
    model.save_pretrained(out)
    write_metadata(out, CheckpointMeta(image_size=128, weights_sha256=weights_sha256(out)))  # 4 x 4 region grid
    return out


@functools.cache
def _assets(root: str) -> dict[str, Path]:
    base = Path(root) / "head_assets"
    text = build_text_model(root)
    return {"manifest": synthetic_test_manifest(base, N_IMAGES, seed=7, prefix="i"),
            "lse_nl": _checkpoint(base / "ckpt_lse", text, "lse_nl"),
            "cosine": _checkpoint(base / "ckpt_cos", text, "cosine"), "base": base}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    torch.set_num_threads(1)
    return _assets(str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def lse(assets):
    from medclr.inference import load_checkpoint

    engine = load_checkpoint(assets["lse_nl"])
    out = assets["base"] / "index_lse"
    if not (out / MANIFEST_NAME).is_file():
        build_index(engine, assets["manifest"], out, workers=0)
    return engine, out


def _brute_force(index, engine, q: np.ndarray) -> np.ndarray:
    """float64 head.score of every query against every stored image: Q x N, columns in cell_ids order."""
    cells = torch.from_numpy(np.asarray(index.cells, dtype=np.float64))
    head = engine.model.head
    with torch.inference_mode():
        return head.score(cells, torch.from_numpy(q).double()).T.numpy()


def test_index_stores_head_cells(lse):
    engine, out = lse
    meta = json.loads((out / MANIFEST_NAME).read_text())
    head = meta["head"]
    assert head["kind"] == "lse_nl" and head["grid"] == [4, 4] and head["dtype"] == "float16"
    assert head["cells_per_image"] == 16 and head["bytes_per_image"] == 16 * 32 * 2
    assert head["config"]["gamma"] == pytest.approx(20.0)
    cells = np.load(out / meta["data"] / CELLS_NAME, mmap_mode="r")
    ids = np.load(out / meta["data"] / CELL_IDS_NAME)
    assert cells.dtype == np.float16 and cells.shape == (N_IMAGES, 16, 32) and isinstance(cells, np.memmap)
    assert sorted(ids.tolist()) == list(range(N_IMAGES))
    assert not list(out.glob(".cells-scratch*"))
    idx = load_index(out, engine)
    assert idx.reranks and isinstance(idx.cells, np.memmap)
    assert not load_index(out).reranks  # no engine: no head to score with
    # the stored cells are the head's image side (NL-contextualised unit cells) to float16 precision
    from medclr.inference import Inference

    paths = idx.image_table.set_index("id").loc[ids, "image_path"].tolist()
    batch = torch.stack([engine.prepare(p)[0] for p in paths])
    with torch.inference_mode():
        fresh = engine.model.head.image_side(Inference.image_features(engine, batch)).numpy()
    assert np.abs(np.asarray(cells, np.float32) - fresh).max() < 1e-3
    assert np.allclose(np.linalg.norm(np.asarray(cells, np.float32), axis=-1), 1.0, atol=2e-3)


def test_full_pool_equals_float64_brute_force(lse):
    engine, out = lse
    idx = load_index(out, engine)
    q = engine.embed_texts(QUERIES)
    ref = _brute_force(idx, engine, q)
    ids = idx.cell_ids.to_numpy()
    k = 8
    assert rerank_pool(k, N_IMAGES) == N_IMAGES  # the default pool max(10 k, 100) covers this index
    reordered = 0
    for pool in (None, N_IMAGES):
        hits = idx.search_images_by_text(q, k, pool=pool)
        for qi, row in enumerate(hits):
            order = np.argsort(-ref[qi], kind="stable")[:k]
            got = [h["id"] for h in row]
            assert got == ids[order].tolist()
            assert np.allclose([h["score"] for h in row], ref[qi][order], atol=1e-5, rtol=0)
            faiss_order = [h["id"] for h in idx.search_images(q[qi:qi + 1], k)[0]]
            reordered += got != faiss_order
    assert reordered > 0  # the head ranks differently from global cosine here, so the test can tell


def test_small_pool_reorders_faiss_candidates(lse):
    engine, out = lse
    idx = load_index(out, engine)
    q = engine.embed_texts(QUERIES)
    ref = dict(zip(idx.cell_ids.to_numpy().tolist(), _brute_force(idx, engine, q).T))
    pool, k = 10, 4
    cos, cand = idx.images.search(q, pool)
    hits = idx.search_images_by_text(q, k, pool=pool)
    for qi, row in enumerate(hits):
        by_head = sorted(cand[qi].tolist(), key=lambda i: -ref[i][qi])[:k]
        assert [h["id"] for h in row] == by_head and set(by_head) <= set(cand[qi].tolist())
        assert np.allclose([h["score"] for h in row], [ref[i][qi] for i in by_head], atol=1e-5, rtol=0)
        faiss_cos = dict(zip(cand[qi].tolist(), cos[qi].tolist()))
        assert [h["cosine"] for h in row] == [pytest.approx(faiss_cos[i], abs=1e-6) for i in by_head]


def test_cli_text_search_prints_head_scores(lse, capsys):
    from medclr.cli import main

    engine, out = lse
    idx = load_index(out, engine)
    capsys.readouterr()
    assert main(["index", "search", "--checkpoint", str(engine.checkpoint_dir), "--index", str(out), "--text",
                 QUERIES[0], "-k", "3", "--pool", "12"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = idx.search_images_by_text(engine.embed_texts([QUERIES[0]]), 3, pool=12)[0]
    assert [p["score"] for p in printed] == [round(h["score"], 4) for h in want]


def test_app_text_retrieval_shows_head_scores(lse):
    from medclr.app.service import SCORE_POOL, AppService, relative_scores
    from medclr.index.store import rerank_pool

    engine, out = lse
    idx = load_index(out, engine)
    gallery = AppService(engine, idx).retrieve_by_text(QUERIES[6], k=5)
    want = idx.search_images_by_text(engine.embed_texts([QUERIES[6]]), 5)[0]
    # captions "#rank · z SD · report N · ...": ranked by the head, z over the head scores of the query's best
    pool = idx.search_images_by_text(engine.embed_texts([QUERIES[6]]), SCORE_POOL,
                                     pool=rerank_pool(5, idx.images.ntotal))[0]
    fields = [c.split(" · ", 3) for _, c in gallery]
    assert fields and [f[1] for f in fields] == [f"{z:+.2f} SD" for z in relative_scores([h["score"] for h in pool])[:5]]
    assert [int(f[2].split()[1]) for f in fields] == [int(h["manifest_index"]) for h in want]


def test_add_keeps_cells_in_step(lse, assets, tmp_path):
    from medclr.data.manifest import read_manifest, write_manifest

    engine, full = lse
    man = read_manifest(assets["manifest"])
    root = man.attrs["root"]
    out = tmp_path / "idx"
    build_index(engine, write_manifest(man.iloc[:18], tmp_path / "a.parquet", root), out, workers=0)
    idx = add_to_index(engine, out, write_manifest(man.iloc[12:], tmp_path / "b.parquet", root), workers=0)
    assert idx.reranks and len(idx.cells) == len(idx.cell_ids) == idx.images.ntotal == N_IMAGES
    assert sorted(p.name for p in out.glob("data-*")) == ["data-0002"] and not list(out.glob(".cells-scratch*"))
    ref = load_index(full, engine)
    by_path = dict(zip(ref.image_table["image_path"], ref.image_table["id"]))
    mine = idx.image_table.set_index("id")["image_path"]
    for row, i in enumerate(idx.cell_ids):  # the same image's cells as in the one-go build
        j = ref.cell_ids.get_loc(by_path[mine[i]])
        assert np.abs(idx.cells[row].astype(np.float32) - ref.cells[j].astype(np.float32)).max() < 2e-3
    q = engine.embed_texts(QUERIES)
    got = [[mine[h["id"]] for h in row] for row in idx.search_images_by_text(q, 5)]
    want = [[h["image_path"] for h in row] for row in ref.search_images_by_text(q, 5)]
    assert got == want


def test_older_index_without_cells_falls_back_with_a_warning(lse, assets, tmp_path, caplog):
    engine, full = lse
    old = tmp_path / "old"
    shutil.copytree(full, old)
    meta = json.loads((old / MANIFEST_NAME).read_text())
    del meta["head"], meta["files"]  # what an index written before the head re-ranking looks like
    meta["format"] = "medclr.index/1"
    for name in (CELLS_NAME, CELL_IDS_NAME):
        (old / meta["data"] / name).unlink()
    (old / MANIFEST_NAME).write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="medclr.index.store"):
        idx = load_index(old, engine)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # two things an older index lacks, each said once: the cells (text search by global cosine), the checksums
    assert len(lines) == 2 and all("rebuild it with `medclr index build`" in line for line in lines)
    assert any("global cosine" in line for line in lines) and any("records no sizes or checksums" in line for line in lines)
    assert not idx.reranks
    q = engine.embed_texts(QUERIES)
    assert idx.search_images_by_text(q, 5) == idx.search_images(q, 5)
    # an add to it cannot give the older images cells: it stays a global-cosine index, and says so
    from PIL import Image

    from medclr.data.manifest import read_manifest, write_manifest

    Image.fromarray(_draw_cxr(np.random.default_rng(99), 64)).save(tmp_path / "new.png")
    row = read_manifest(assets["manifest"]).iloc[:1].assign(image_path="new.png", report="Pulmonary edema is present.")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="medclr.index.store"):
        added = add_to_index(engine, old, write_manifest(row, tmp_path / "new.parquet", tmp_path), workers=0)
    assert any("rebuild it with `medclr index build`" in r.getMessage() for r in caplog.records)
    assert added.images.ntotal == N_IMAGES + 1 and "head" not in added.meta
    assert not load_index(old, engine).reranks and not list((old / added.meta["data"]).glob("*.npy"))


def test_cosine_head_is_unchanged(assets):
    from medclr.inference import load_checkpoint

    engine = load_checkpoint(assets["cosine"])
    out = assets["base"] / "index_cos"
    idx = build_index(engine, assets["manifest"], out, workers=0)
    assert idx.meta["head"] == {"kind": "cosine"} and not list((out / idx.meta["data"]).glob("*.npy"))
    idx = load_index(out, engine)
    assert not idx.reranks
    q = engine.embed_texts(QUERIES)
    for k in (1, 5, N_IMAGES):
        assert idx.search_images_by_text(q, k) == idx.search_images(q, k)
    # and the faiss cosine is the head's score
    from medclr.inference import Inference

    paths = idx.image_table.sort_index()["image_path"].tolist()
    batch = torch.stack([engine.prepare(p)[0] for p in paths])
    with torch.inference_mode():
        s = engine.model.head(Inference.image_features(engine, batch), torch.from_numpy(q)).T.numpy()
    for qi, row in enumerate(idx.search_images_by_text(q, 5)):
        assert np.allclose([h["score"] for h in row], s[qi][[h["id"] for h in row]], atol=1e-5)


def test_a_full_disk_is_one_line_and_stale_scratch_is_cleaned(lse, assets, tmp_path, monkeypatch):
    """The cells' scratch memory map is allocated before any image is embedded: a disk too small for it is one
    line (not SIGBUS), and the scratch is gone; a later build removes what a killed build left behind."""
    import errno
    import os

    from medclr.errors import MedclrError

    engine, full_index = lse
    out = tmp_path / "idx"
    shutil.copytree(full_index, out)  # an index a build was killed in
    dead = out / ".cells-scratch999999999.npy"  # no such process
    dead.write_bytes(b"x" * 100)
    half = out / ".data-0001.tmp999999999"
    half.mkdir()
    alive = out / f".cells-scratch{os.getppid()}.npy"  # a running process's: kept
    alive.write_bytes(b"y")

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(MedclrError, match=r"not enough disk space for the index's image cells \(\d+ MB needed\)") as e:
        build_index(engine, assets["manifest"], out, workers=0)
    assert "\n" not in str(e.value)
    assert not dead.exists() and not half.exists() and alive.exists()
    assert not list(out.glob(f".cells-scratch{os.getpid()}*"))
    monkeypatch.undo()
    build_index(engine, assets["manifest"], out, workers=0)
    assert load_index(out, engine).reranks
