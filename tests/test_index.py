"""medclr.index: faiss cosine search (exact and approximate), the index directory (ids back to the
manifest, model check, atomic versions, incremental add) and the `medclr index` command."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from medclr.errors import MedclrError
from medclr.index import (
    MANIFEST_NAME,
    VectorIndex,
    add_to_index,
    build_index,
    choose_kind,
    load_index,
    read_meta,
)
from tests.conftest_app import app_assets, engine, index_dir, rg1_path  # noqa: F401 - fixtures


def _clustered(n: int, d: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(50, d))
    x = centres[rng.integers(0, 50, n)] + 0.3 * rng.normal(size=(n, d))
    return x.astype(np.float32)


def test_choose_kind_by_size_and_override():
    assert choose_kind(10) == "flat" and choose_kind(100_000) == "flat"
    assert choose_kind(100_001) == "hnsw" and choose_kind(50, exact_max=10) == "hnsw"
    assert choose_kind(10, "ivf") == "ivf"
    with pytest.raises(MedclrError, match="index kind"):
        choose_kind(10, "annoy")


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_cosine_search_recall_and_round_trip(kind, tmp_path):
    x = _clustered(3000)
    scale = np.random.default_rng(1).uniform(0.1, 10.0, (len(x), 1)).astype(np.float32)
    ids = np.arange(1000, 1000 + len(x), dtype=np.int64)
    vi = VectorIndex.create(16, kind, train=x, use_gpu=False)
    vi.add(x[:2000] * scale[:2000], ids[:2000])  # unnormalised input: cosine all the same
    vi.add(x[2000:], ids[2000:])  # incremental
    assert vi.ntotal == 3000
    q = x[:100]
    scores, got = vi.search(q * 7.0, 10)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    exact = np.argsort(-(xn[:100] @ xn.T), axis=1)[:, :10] + 1000
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, exact)])
    assert recall >= (1.0 if kind == "flat" else 0.9)
    assert np.all(got[:, 0] == ids[:100]) and np.allclose(scores[:, 0], 1.0, atol=1e-5)
    vi.write(tmp_path / "v.faiss")
    back = VectorIndex.read(tmp_path / "v.faiss", kind, use_gpu=False)
    s2, g2 = back.search(q, 10)
    assert np.array_equal(g2, got) and np.allclose(s2, scores, atol=1e-6)
    with pytest.raises(MedclrError, match="dim"):
        vi.search(np.ones((1, 8), np.float32), 3)


def test_index_dir_maps_ids_to_manifest(engine, index_dir, app_assets):  # noqa: F811
    from medclr.data.manifest import read_manifest

    idx = load_index(index_dir, engine)
    man = read_manifest(app_assets["manifest"])
    meta = json.loads((index_dir / MANIFEST_NAME).read_text())
    assert meta["model"]["weights_sha256"] == engine.weights_sha256 and meta["kind"]["images"] == "flat"
    assert meta["counts"]["images"] == len(man) == idx.images.ntotal
    assert [p.name for p in index_dir.iterdir()] and sorted(p.name for p in index_dir.glob("data-*")) == [meta["data"]]
    assert not list(index_dir.glob(".*tmp*"))
    # every image id points at its manifest row; a query with a stored image finds itself
    emb = engine.embed_images([rg1_path()])
    hit = idx.search_images(emb, 3)[0][0]
    assert hit["score"] == pytest.approx(1.0, abs=1e-4)
    row = man.iloc[int(hit["manifest_index"])]
    assert row["image_path"] == "rg1/RG1_UNCI.dcm" and hit["report"] == row["report"]
    # sentences: one vector per distinct sentence, with every report that holds it
    sent = idx.sentence_table
    assert len(sent) == idx.sentences.ntotal == len({s for ss in man["sentences"] for s in ss})
    for s, mids in zip(sent["sentence"], sent["manifest_index"]):
        assert all(s in man["sentences"].iat[int(m)] for m in mids)
    top = idx.search_sentences(engine.embed_texts(["No pneumothorax."]), 1)[0][0]
    assert top["sentence"] == "No pneumothorax."


def test_index_from_another_model_is_refused(index_dir, app_assets):  # noqa: F811
    from medclr.inference import load_checkpoint

    other = load_checkpoint(app_assets["other_checkpoint"])
    with pytest.raises(MedclrError, match="was built from checkpoint .* not from"):
        load_index(index_dir, other)


def test_incremental_add_and_atomic_versions(engine, app_assets, tmp_path, monkeypatch):  # noqa: F811
    from medclr.data.manifest import read_manifest, write_manifest

    man = read_manifest(app_assets["manifest"])
    root = man.attrs["root"]
    first = man.iloc[:6]
    out = tmp_path / "idx"
    build_index(engine, write_manifest(first, tmp_path / "m1.parquet", root), out)
    # a second manifest: 2 rows already indexed + the 6 others + one broken image
    second = pd.concat([man.iloc[4:], man.iloc[[0]].assign(image_path="missing/gone.png", report="gone")])
    m2 = write_manifest(second, tmp_path / "m2.parquet", root)
    idx = add_to_index(engine, out, m2)
    assert idx.images.ntotal == len(man)  # nothing twice, the broken image skipped
    assert idx.image_table["id"].is_unique and len(idx.errors) == 1 and "gone.png" in idx.errors["path"].iat[0]
    assert sorted(p.name for p in out.glob("data-*")) == ["data-0002"]
    assert [s["rows_added"] for s in idx.meta["sources"]] == [6, 7]
    hits = idx.search_images(engine.embed_images([rg1_path()]), 1)[0]
    assert hits[0]["source"] == 1 and hits[0]["score"] == pytest.approx(1.0, abs=1e-4)

    # a crash while writing the next version leaves the current index intact
    from medclr.index import store

    def boom(self, path):
        raise OSError("disk full")

    monkeypatch.setattr(store.VectorIndex, "write", boom)
    with pytest.raises(OSError):
        add_to_index(engine, out, write_manifest(man.iloc[:1].assign(image_path="p00/s00.png", report="x"),
                                                 tmp_path / "m3.parquet", tmp_path))
    monkeypatch.undo()
    again = load_index(out, engine)
    assert again.images.ntotal == len(man) and again.meta["data"] == "data-0002"


def test_build_refuses_non_index_dir(engine, app_assets, tmp_path):  # noqa: F811
    (tmp_path / "stuff.txt").write_text("mine")
    with pytest.raises(MedclrError, match="not a medclr index"):
        build_index(engine, app_assets["manifest"], tmp_path)
    with pytest.raises(MedclrError, match="not a medclr index"):
        load_index(tmp_path)


def test_index_cli(app_assets, tmp_path, capsys):  # noqa: F811
    from medclr.cli import main

    out = tmp_path / "cli_idx"
    assert main(["index", "build", "--checkpoint", str(app_assets["checkpoint"]), "--manifest",
                 str(app_assets["manifest"]), "--out", str(out), "--workers", "0", "--kind", "hnsw"]) == 0
    meta = json.loads((out / "index_manifest.json").read_text())  # what `medclr demo` waits for
    assert meta["kind"]["images"] == "hnsw" and meta["counts"]["images"] == 12
    capsys.readouterr()
    assert main(["index", "search", "--checkpoint", str(app_assets["checkpoint"]), "--index", str(out), "--image",
                 rg1_path(), "-k", "2"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["manifest_index"] == 11 and first["score"] == pytest.approx(1.0, abs=1e-3)
    assert main(["index", "build", "--checkpoint", str(app_assets["checkpoint"]), "--manifest",
                 str(tmp_path / "none.parquet"), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none.parquet" in err[0] and "Traceback" not in err[0]
    helped = subprocess.run([sys.executable, "-m", "medclr", "index", "build", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert "examples:" in helped.stdout and "--kind" in helped.stdout


def test_damaged_index_files_are_refused_at_open(engine, app_assets, tmp_path, capsys):  # noqa: F811
    """The index manifest records each data file's size and SHA-256: a zeroed image_cells.npy (still a valid
    file of the same size) is refused when opened and by `index info --verify`; a truncated one by its size
    alone, also when hashes are not asked for."""
    import shutil

    from medclr.cli import main as medclr_main

    out = tmp_path / "idx"
    build_index(engine, app_assets["manifest"], out)
    meta = read_meta(out)
    cells = out / meta["data"] / meta["head"]["cells"]
    assert set(meta["files"]) >= {"images.faiss", "sentences.parquet", cells.name}
    assert medclr_main(["index", "info", str(out), "--verify"]) == 0 and "verified" in capsys.readouterr().err
    good = tmp_path / "good"
    shutil.copytree(out, good)
    with open(cells, "r+b") as fh:  # zero the cells after the .npy header
        fh.seek(256)
        fh.write(bytes(cells.stat().st_size - 256))
    with pytest.raises(MedclrError, match=r"image_cells\.npy is changed since it was written .* rebuild it"):
        load_index(out, engine, verify=True)  # as the app's start and `medclr index search` open it
    assert medclr_main(["index", "info", str(out), "--verify"]) == 1
    assert "changed since it was written" in capsys.readouterr().err
    load_index(out, engine)  # by default sizes only: the zeroed file passes, as documented
    with open(good / meta["data"] / "images.parquet", "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(MedclrError, match=r"images\.parquet is of another size"):
        load_index(good, engine, verify=False)
    # an index written before the manifest recorded its files (format /1) cannot be verified: said, never passed
    # silently
    old = tmp_path / "old"
    shutil.copytree(out, old)
    (old / "index_manifest.json").write_text(json.dumps(
        {k: v for k, v in meta.items() if k != "files"} | {"format": "medclr.index/1"}))
    capsys.readouterr()
    assert medclr_main(["index", "info", str(old), "--verify"]) == 1
    assert "records no checksums" in capsys.readouterr().err
    # issue 46: format /2 records them in every version it writes; one without the record was edited: refused in
    # one line by every reader (before: opened with the "built before medclr recorded them" warning)
    assert meta["format"] == "medclr.index/2"
    edited = tmp_path / "edited"
    shutil.copytree(good, edited)
    (edited / "index_manifest.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "files"}))
    for argv in (["index", "info", str(edited)], ["index", "search", "--index", str(edited), "--checkpoint",
                                                   str(engine.checkpoint_dir), "--text", "effusion"]):
        assert medclr_main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert err.endswith("index_manifest.json: format 'medclr.index/2' records the size and SHA-256 of every data "
                            "file, but this one has no 'files' record, so its files cannot be verified (the manifest "
                            "was edited); rebuild the index with `medclr index build`") and "\n" not in err, err
    with pytest.raises(MedclrError, match="has no 'files' record"):
        load_index(edited, engine)


def test_build_refuses_a_folder_that_is_not_an_index(engine, app_assets, tmp_path):  # noqa: F811
    """`index build --out` replaces an earlier index only (medclr.files.refuse_foreign, the rule `medclr score` and
    `medclr export` share): another folder is refused in one line before any image is read, its files kept."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(MedclrError, match=r"^--out \S+mine: the folder holds other files \(not a medclr index\); "
                                          r"choose a new or empty folder$"):
        build_index(engine, app_assets["manifest"], out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"
