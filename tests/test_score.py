"""`medclr score`: a tree of PNG/DICOM files, a broken file, SIGKILL mid-run, resume: every file once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.conftest_app import app_assets, engine, rg1_path  # noqa: F401 - fixtures
from tests.dicom_factory import make_dicom

N_PNG = 24


def _grey(value: int, shape: tuple[int, int] = (40, 48), dtype=np.uint8) -> np.ndarray:
    """A flat grey image with one pixel a level off: a blank one is refused (medclr.io.limits.blank_problem)."""
    img = np.full(shape, value, dtype)
    img[0, 0] ^= 1
    return img


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    root = tmp_path_factory.mktemp("archive")
    rng = np.random.default_rng(0)
    for i in range(N_PNG):
        d = root / f"site{i % 3}" / f"p{i:03d}"
        d.mkdir(parents=True)
        Image.fromarray(rng.integers(0, 255, (64 + i, 80), dtype=np.uint8)).save(d / f"img{i}.png")
    (root / "dicom").mkdir()
    shutil.copy(rg1_path("RG1_UNCI.dcm"), root / "dicom" / "rg1.dcm")
    shutil.copy(rg1_path("RG1_UNCR.dcm"), root / "dicom" / "NOEXTENSION")  # DICOM found by its magic
    (root / "dicom" / "broken.dcm").write_bytes(b"\0" * 128 + b"DICM" + b"\x01" * 50)
    (root / "notes.txt").write_text("not an image")  # ignored: not an image file
    (root / ".hidden.png").write_bytes(b"x")  # ignored: hidden
    return root


def _cmd(ckpt, root, out, *extra):
    return [sys.executable, "-m", "medclr", "score", "--checkpoint", str(ckpt), "--input", str(root), "--out", str(out),
            "--batch-size", "2", "--part-files", "2", "--workers", "1", "--no-progress", *extra]


def test_find_images(archive):
    from medclr.jobs.scoring import find_images

    files, others = find_images(archive)
    assert others == 1  # notes.txt; hidden files are not counted
    assert len(files) == N_PNG + 3 and "dicom/NOEXTENSION" in files
    assert "notes.txt" not in files and ".hidden.png" not in files and files == sorted(files)


def test_sigkill_mid_run_then_resume_scores_every_file_once(archive, app_assets, tmp_path, capsys):  # noqa: F811
    from medclr.jobs.scoring import find_images, parts_dir

    out = tmp_path / "results.parquet"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(_cmd(app_assets["checkpoint"], archive, out, "--embeddings"), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    parts = parts_dir(out)
    deadline = time.time() + 240
    while len(list(parts.glob("part-*.parquet"))) < 3:
        assert proc.poll() is None, f"scoring ended before it could be killed: {proc.stderr.read()[-2000:]!r}"
        assert time.time() < deadline, "no parts written"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the scorer and its DataLoader worker, mid-run
    proc.wait(30)
    n_parts = len(list(parts.glob("part-*.parquet")))
    assert not out.exists()  # killed before the merge
    done_before = sum(pq.read_metadata(p).num_rows for p in parts.glob("part-*.parquet"))
    assert 0 < done_before < N_PNG + 3

    from medclr.cli import main

    capsys.readouterr()
    assert main(_cmd(app_assets["checkpoint"], archive, out, "--embeddings")[3:]) == 0  # resume, in process
    summary = capsys.readouterr().out
    assert f"{done_before} already done" in summary and "1 other file passed over, not radiographs" in summary
    results, errors = pd.read_parquet(out), pd.read_parquet(tmp_path / "results.errors.parquet")
    expected, _ = find_images(archive)
    # exactly once: parts hold each file once, the merged tables partition the files
    in_parts = pd.concat([pd.read_parquet(p, columns=["path"]) for p in parts.glob("part-*.parquet")])["path"]
    assert in_parts.is_unique and sorted(in_parts) == expected
    assert sorted(list(results["path"]) + list(errors["path"])) == expected
    assert results["path"].is_unique and len(list(parts.glob("part-*.parquet"))) > n_parts
    assert list(errors["path"]) == ["dicom/broken.dcm"] and "broken.dcm" in errors["error"].iat[0]
    for cls in ("Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax"):
        assert results[cls].between(0, 1).all()
    emb = np.stack(results["embedding"].to_numpy())
    assert emb.shape == (N_PNG + 2, 32) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)
    # the same images score the same in the app's engine
    row = results.set_index("path").loc["dicom/rg1.dcm"]
    assert (row["height"], row["width"]) == (1955, 1841)
    from medclr.inference import load_checkpoint

    probs = load_checkpoint(app_assets["checkpoint"]).zero_shot(archive / "dicom" / "rg1.dcm")
    assert row["Edema"] == pytest.approx(probs["Edema"], abs=1e-5)

    # a third run has nothing to do; another model is refused on the same output
    assert main(_cmd(app_assets["checkpoint"], archive, out, "--embeddings")[3:]) == 0
    summary = f"scored 0 files (0 unreadable, {N_PNG + 3} already done; 1 other file passed over, not radiographs)"
    assert summary in capsys.readouterr().out
    assert main(_cmd(app_assets["other_checkpoint"], archive, out)[3:]) == 1
    assert "holds a run scored with other model weights (recorded " in capsys.readouterr().err


def test_score_in_process_with_shards(engine, tmp_path, monkeypatch):  # noqa: F811
    """Two ranks' shards (as torchrun would run them, here one after the other with a fake world) cover
    every file once; the merge happens once all shards are in."""
    from medclr.jobs import scoring

    root = tmp_path / "small"
    root.mkdir()
    for i in range(8):
        Image.fromarray(_grey(20 * i)).save(root / f"{i}.png")
    make_dicom(root / "8.dcm", _grey(300, dtype=np.uint16), Modality="OT")  # read, and flagged
    (root / "bad.jpg").write_bytes(b"\xff\xd8 not really")
    out = tmp_path / "r.parquet"
    opts = scoring.ScoreOptions(batch_size=4, workers=0, part_files=2, progress=False)
    monkeypatch.setattr(scoring, "_init_group", lambda world: None)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        stats = scoring.score_tree(engine, root, out, opts)
        assert "merged" in stats if rank == 0 else "merged" not in stats
    assert stats["files"] == 5
    assert {p.name.split("-")[1] for p in scoring.parts_dir(out).glob("part-*")} == {"r000", "r001"}
    res, err = pd.read_parquet(out), pd.read_parquet(scoring.errors_path(out))
    assert len(res) == 9 and list(err["path"]) == ["bad.jpg"] and res["path"].is_unique
    flagged = res.set_index("path")["caution"]
    assert flagged["8.dcm"].startswith("modality OT") and (flagged.drop("8.dcm") == "").all()


def test_resuming_onto_another_archive_is_refused(engine, tmp_path, monkeypatch):  # noqa: F811
    """Archive B must not inherit archive A's done-set through shared relative paths."""
    from medclr.errors import MedclrError
    from medclr.jobs import scoring

    out = tmp_path / "r.parquet"
    for name in ("A", "B"):
        (tmp_path / name).mkdir()
        Image.fromarray(_grey(10 if name == "A" else 200)).save(tmp_path / name / "same.png")
    opts = scoring.ScoreOptions(batch_size=2, workers=0, progress=False)
    assert scoring.score_tree(engine, tmp_path / "A", out, opts)["scored"] == 1
    with pytest.raises(MedclrError, match="scored from another --input root"):
        scoring.score_tree(engine, tmp_path / "B", out, opts)
    assert len(pd.read_parquet(out)) == 1  # A's table untouched


CLASSES = ["Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax"]


def test_file_changed_in_place_is_rescored_and_its_row_replaced(engine, tmp_path, monkeypatch):  # noqa: F811
    """Same path, same size, new pixels: exactly that file is scored again and the table holds one row for it,
    with the new score; a truncated file completed in place moves from the errors to the results. A crash
    after the rescore's part is written (before the merge) loses nothing and rescores nothing."""
    from medclr.jobs import scoring
    from tests.dicom_factory import make_dicom

    root = tmp_path / "archive"
    root.mkdir()
    rng = np.random.default_rng(1)
    for i in range(5):
        make_dicom(root / f"{i}.dcm", rng.integers(0, 4096, (48, 64), dtype=np.uint16), bits_stored=12)
    full = (root / "4.dcm").read_bytes()
    (root / "4.dcm").write_bytes(full[: len(full) // 2])  # truncated (an interrupted copy)
    out = tmp_path / "r.parquet"
    opts = scoring.ScoreOptions(batch_size=2, workers=0, part_files=2, progress=False)
    stats = scoring.score_tree(engine, root, out, opts)
    assert (stats["scored"], stats["errors"], stats["changed"]) == (4, 1, 0)
    before = pd.read_parquet(out).set_index("path")
    assert list(before.index) == [f"{i}.dcm" for i in range(4)]
    assert list(pd.read_parquet(scoring.errors_path(out))["path"]) == ["4.dcm"]
    st = (root / "1.dcm").stat()
    assert (before.loc["1.dcm", "size"], before.loc["1.dcm", "mtime_ns"]) == (st.st_size, st.st_mtime_ns)

    # new pixels in place, same byte size; the mtime moves on (set explicitly: some file systems stamp
    # in coarse ticks, and two writes inside one tick keep the mtime: docs/scoring.md)
    changed = root / "1.dcm"
    make_dicom(changed, np.tile(np.arange(64, dtype=np.uint16) * 64, (48, 1)), bits_stored=12)
    assert changed.stat().st_size == st.st_size
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (root / "4.dcm").write_bytes(full)  # the copy completed

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # killed after the parts, before the merge

    monkeypatch.setattr(scoring, "merge", crash)
    with pytest.raises(KeyboardInterrupt):
        scoring.score_tree(engine, root, out, opts)
    monkeypatch.undo()
    stats = scoring.score_tree(engine, root, out, opts)  # resume: the rescored rows are already in the parts
    assert (stats["scored"], stats["skipped_done"], stats["changed"]) == (0, 5, 0)

    after = pd.read_parquet(out).set_index("path")
    assert list(after.index) == [f"{i}.dcm" for i in range(5)]  # one row per file, the broken one now read
    assert len(pd.read_parquet(scoring.errors_path(out))) == 0
    new_probs = engine.zero_shot(changed)
    for cls in CLASSES:
        assert after.loc["1.dcm", cls] == pytest.approx(new_probs[cls], abs=1e-5)
    assert max(abs(after.loc["1.dcm", c] - before.loc["1.dcm", c]) for c in CLASSES) > 1e-4
    for f in ("0.dcm", "2.dcm", "3.dcm"):  # untouched files: the same rows
        assert after.loc[f].equals(before.loc[f])
    assert after.loc["1.dcm", "mtime_ns"] == st.st_mtime_ns + 10**9
    # the parts keep the superseded row (two rows for 1.dcm and 4.dcm), the tables do not
    in_parts = pd.concat([pd.read_parquet(p, columns=["path", "run"]) for p in scoring.parts_dir(out).glob("part-*")])
    assert sorted(in_parts["path"]) == sorted([f"{i}.dcm" for i in range(5)] + ["1.dcm", "4.dcm"])
    assert sorted(in_parts[in_parts["path"] == "1.dcm"]["run"]) == [1, 2]
    assert scoring.score_tree(engine, root, out, opts)["scored"] == 0  # nothing left to do


def test_parts_without_fingerprints_still_count_as_done(engine, tmp_path):  # noqa: F811
    """Parts written before size/mtime/run were recorded: their files stay done; the merge reads them."""
    from medclr.jobs import scoring

    root = tmp_path / "a"
    root.mkdir()
    for i in range(3):
        Image.fromarray(_grey(60 * i)).save(root / f"{i}.png")
    out = tmp_path / "r.parquet"
    opts = scoring.ScoreOptions(batch_size=2, workers=0, part_files=2, progress=False)
    scoring.score_tree(engine, root, out, opts)
    for p in scoring.parts_dir(out).glob("part-*.parquet"):
        pq.write_table(pq.read_table(p).drop_columns(["size", "mtime_ns", "run"]), p)
    Image.fromarray(_grey(250)).save(root / "3.png")
    stats = scoring.score_tree(engine, root, out, opts)
    assert (stats["scored"], stats["skipped_done"]) == (1, 3)
    res = pd.read_parquet(out)
    assert list(res["path"]) == [f"{i}.png" for i in range(4)] and res["size"].isna().sum() == 3


def test_reduced_decode_scores_near_the_app_and_full_decode_equals_it(engine, tmp_path):  # noqa: F811
    """By default JPEG 2000 and JPEG decode at a reduced size and 8-bit images travel as uint8: scores within
    1e-3 of the app engine's on RG1 (tolerance of the inputs: tests/test_reduced_decode.py); the 15-bit
    uncompressed CR is scored on the app's exact input. --full-decode scores exactly as the app. The mode is
    part of the run: resuming with the other one, or a run recorded before modes existed (a full decode)
    without --full-decode, is refused with one line."""
    import json

    from medclr.errors import MedclrError
    from medclr.io import read_image
    from medclr.jobs import scoring

    root = tmp_path / "a"
    root.mkdir()
    shutil.copy(rg1_path("RG1_J2KR.dcm"), root / "j2k.dcm")
    shutil.copy(rg1_path("RG1_UNCR.dcm"), root / "uncr.dcm")
    Image.fromarray(np.round(read_image(root / "uncr.dcm") * 255).astype(np.uint8)).save(root / "rg1.jpg", quality=95)
    app = {f: engine.zero_shot(root / f) for f in ("j2k.dcm", "uncr.dcm", "rg1.jpg")}
    for full_decode, tolerance in ((False, 1e-3), (True, 1e-5)):
        out = tmp_path / f"{full_decode}.parquet"
        opts = scoring.ScoreOptions(batch_size=3, workers=0, progress=False, full_decode=full_decode)
        assert scoring.score_tree(engine, root, out, opts)["scored"] == 3
        res = pd.read_parquet(out).set_index("path")
        for f, probs in app.items():
            exact = 1e-5 if f == "uncr.dcm" else tolerance
            assert max(abs(res.loc[f, c] - probs[c]) for c in CLASSES) <= exact, (f, full_decode)
        assert json.loads(pq.read_schema(out).metadata[b"medclr"])["decode"] == opts.decode
        other = scoring.ScoreOptions(batch_size=3, workers=0, progress=False, full_decode=not full_decode)
        with pytest.raises(MedclrError, match=r"scored with another decode \(--full-decode\)"):
            scoring.score_tree(engine, root, out, other)
    legacy = scoring.parts_dir(tmp_path / "True.parquet") / scoring.RUN_NAME
    legacy.write_text(json.dumps({k: v for k, v in json.loads(legacy.read_text()).items() if k != "decode"}))
    with pytest.raises(MedclrError, match="resume it with --full-decode"):
        scoring.score_tree(engine, root, tmp_path / "True.parquet", scoring.ScoreOptions(workers=0, progress=False))
    stats = scoring.score_tree(engine, root, tmp_path / "True.parquet",
                               scoring.ScoreOptions(workers=0, progress=False, full_decode=True))
    assert stats["skipped_done"] == 3


@pytest.mark.slow
def test_torchrun_two_processes(app_assets, archive, tmp_path):  # noqa: F811
    out = tmp_path / "tr.parquet"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "medclr", "score", "--checkpoint", str(app_assets["checkpoint"]), "--input", str(archive),
           "--out", str(out), "--workers", "0", "--no-progress"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    res, err = pd.read_parquet(out), pd.read_parquet(Path(str(out).replace(".parquet", ".errors.parquet")))
    assert len(res) + len(err) == N_PNG + 3 and res["path"].is_unique


def test_one_file_into_a_csv_table(engine, tmp_path, capsys):  # noqa: F811
    """--input may be one file, --out a .csv (the errors table follows it); a CSV gets no embeddings."""
    from medclr.cli import main as medclr_main

    src = tmp_path / "in" / "rg1.dcm"
    src.parent.mkdir()
    shutil.copy(rg1_path(), src)
    (tmp_path / "in" / "other.png").write_bytes(b"not scored: only the named file is")
    out = tmp_path / "scores.csv"
    argv = ["score", "--checkpoint", str(engine.checkpoint_dir), "--input", str(src), "--out", str(out),
            "--workers", "0", "--no-progress", "--threads", "1"]
    assert medclr_main(argv) == 0
    assert "images/s" in capsys.readouterr().out
    df = pd.read_csv(out)
    assert df["path"].tolist() == ["rg1.dcm"] and {"Cardiomegaly", "Cardiomegaly reason"} <= set(df.columns)
    assert (tmp_path / "scores.errors.csv").is_file() and pd.read_csv(tmp_path / "scores.errors.csv").empty
    assert medclr_main([*argv[:6], str(tmp_path / "e.csv"), "--embeddings"]) == 1
    assert "--embeddings needs a .parquet --out" in capsys.readouterr().err


def test_real_dicoms_into_csv_with_their_uids_and_view(engine, tmp_path):  # noqa: F811
    """A folder of real chest CR DICOMs (pydicom-data's RG1/RG3, uncompressed and JPEG 2000) scored into a CSV
    whose view / study / series / instance UID columns are the headers' own, so the table joins back to the PACS;
    --no-uids leaves them out; a PNG gets empty fields."""
    import pydicom

    from medclr.cli import main as medclr_main

    root = tmp_path / "archive"
    root.mkdir()
    names = ["RG1_UNCI.dcm", "RG1_J2KR.dcm", "RG3_UNCR.dcm"]
    for name in names:
        shutil.copy(rg1_path(name), root / name)
    Image.fromarray(_grey(0, (40, 50))).save(root / "photo.png")
    out = tmp_path / "scores.csv"
    argv = ["score", "--checkpoint", str(engine.checkpoint_dir), "--input", str(root), "--out", str(out),
            "--workers", "0", "--no-progress", "--threads", "1"]
    assert medclr_main(argv) == 0
    df = pd.read_csv(out, dtype=str, keep_default_na=False).set_index("path")
    assert sorted(df.index) == sorted(names + ["photo.png"])
    for name in names:
        ds = pydicom.dcmread(root / name, stop_before_pixels=True)
        row = df.loc[name]
        assert (row["study_uid"], row["series_uid"], row["sop_uid"]) == (
            ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SOPInstanceUID)
        assert row["view"] == str(ds.get("ViewPosition", "")).strip().upper()
    assert (df.loc["photo.png", ["view", "study_uid", "sop_uid"]] == "").all()
    # resuming the same --out without the columns is refused (the tables would not match); a new --out is fine
    assert medclr_main([*argv, "--no-uids"]) == 1
    bare = tmp_path / "bare.parquet"
    assert medclr_main([*argv[:6], str(bare), *argv[7:], "--no-uids"]) == 0
    assert not {"view", "study_uid", "series_uid", "sop_uid"} & set(pd.read_parquet(bare).columns)


def test_custom_prompts_are_scored_raw_with_a_reason(engine, tmp_path, capsys):  # noqa: F811
    """--prompts FILE scores its own classes; the checkpoint's calibration covers the CheX5 pairs only, so the
    columns hold the raw softmax over each pair (as the engine computes it) and the reason says so; a bad
    file is one line before the model loads."""
    import yaml

    from medclr.cli import main as medclr_main

    prompts = {"Pacemaker": {"positive": ["Pacemaker leads in place"], "negative": "No pacemaker"},
               "Cardiomegaly": {"positive": "The heart is enlarged", "negative": ["Heart size is normal"]}}
    path = tmp_path / "prompts.yaml"
    path.write_text(yaml.safe_dump(prompts))
    src = tmp_path / "in" / "rg1.dcm"
    src.parent.mkdir()
    shutil.copy(rg1_path(), src)
    out = tmp_path / "s.parquet"
    argv = ["score", "--checkpoint", str(engine.checkpoint_dir), "--input", str(src), "--out", str(out),
            "--workers", "0", "--no-progress", "--threads", "1", "--full-decode", "--prompts", str(path)]
    assert medclr_main(argv) == 0
    row = pd.read_parquet(out).iloc[0]
    from medclr.prompts import validate_prompts

    want = validate_prompts(prompts)
    classes, raw, _, _ = engine.zero_shot_scores(engine.encode(str(src)).features, want)
    assert list(classes) == ["Pacemaker", "Cardiomegaly"] and "Edema" not in row
    np.testing.assert_allclose([row["Pacemaker"], row["Cardiomegaly"]], raw[0], atol=1e-5)
    # the engine's reason for raw scores: not validated (this checkpoint), or calibrated for the default prompts only
    assert row["Pacemaker reason"] == engine.finding_notes(classes, want)["Pacemaker"] and row["Pacemaker reason"]
    capsys.readouterr()
    (tmp_path / "bad.yaml").write_text("Pacemaker: {positive: Leads}\n")
    assert medclr_main([*argv[:-1], str(tmp_path / "bad.yaml")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.yaml" in err[0] and "'positive' and 'negative'" in err[0]


def test_a_non_finite_embedding_is_an_error_row_never_a_score(engine, tmp_path, monkeypatch):  # noqa: F811
    """An image the model turns into NaN (damaged weights, an input it cannot read) goes to the errors table with
    one line; the other images of its batch are scored as before."""
    import torch

    from medclr.inference.engine import NON_FINITE
    from medclr.jobs import scoring
    from medclr.models.image import ImageFeatures

    root = tmp_path / "in"
    root.mkdir()
    for i in range(4):
        Image.fromarray(_grey(30 * i + 10)).save(root / f"{i}.png")
    real = engine.image_features

    def nan_for_dark_images(batch):
        f = real(batch)
        dark = batch.float().flatten(1).mean(1) < 0.1  # 0.png only (its pixels are 10/255)
        glob = torch.where(dark[:, None].to(f.global_emb.device), torch.nan, f.global_emb)
        return ImageFeatures(f.regions, glob)

    monkeypatch.setattr(engine, "image_features", nan_for_dark_images)
    out = tmp_path / "r.parquet"
    stats = scoring.score_tree(engine, root, out, scoring.ScoreOptions(batch_size=4, workers=0, progress=False))
    res, err = pd.read_parquet(out), pd.read_parquet(scoring.errors_path(out))
    assert list(err["path"]) == ["0.png"] and err["error"].iloc[0] == NON_FINITE
    assert sorted(res["path"]) == ["1.png", "2.png", "3.png"] and stats["errors"] == 1 and stats["scored"] == 3
    assert np.isfinite(res["Cardiomegaly"].to_numpy(dtype=float)).all() or res["Cardiomegaly reason"].notna().all()


def _score_as_rank(engine, rank: int, port: int, root: Path, out: Path) -> None:  # noqa: F811
    """One torchrun worker: its environment as torchrun sets it (the store hosted by the agent, here the test)."""
    import json

    import torch

    from medclr.distributed import cleanup
    from medclr.jobs import scoring

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    try:
        stats = scoring.score_tree(engine, root, out, scoring.ScoreOptions(batch_size=2, workers=0, part_files=2,
                                                                           progress=False))
    finally:
        cleanup()
    (out.parent / f"stats{rank}.json").write_text(json.dumps(stats))


def test_two_gloo_processes_write_one_table_with_every_file_once(engine, archive, tmp_path):  # noqa: F811
    """Two processes in a real gloo group, as `torchrun --nproc-per-node 2` (or two nodes of one each) starts
    them: each scores its shard into its own parts, rank 0 merges once both are in. Every file is in the parts
    exactly once, the tables partition the archive, and the scores equal one process's."""
    import json
    import multiprocessing

    from torch.distributed import TCPStore

    from medclr.jobs import scoring

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # torchrun's agent store, any port
    out = tmp_path / "two" / "r.parquet"
    out.parent.mkdir()
    fork = multiprocessing.get_context("fork")  # the loaded engine goes to both ranks without reloading it
    ranks = [fork.Process(target=_score_as_rank, args=(engine, r, store.port, archive, out)) for r in (0, 1)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(300)
    assert [p.exitcode for p in ranks] == [0, 0]
    stats = [json.loads((out.parent / f"stats{r}.json").read_text()) for r in (0, 1)]
    expected, _ = scoring.find_images(archive)
    assert "merged" in stats[0] and "merged" not in stats[1]
    assert [s["files"] for s in stats] == [len(expected[0::2]), len(expected[1::2])]

    parts = sorted(scoring.parts_dir(out).glob("part-*.parquet"))
    assert {p.name.split("-")[1] for p in parts} == {"r000", "r001"}
    in_parts = pd.concat([pd.read_parquet(p, columns=["path"]) for p in parts])["path"]
    assert in_parts.is_unique and sorted(in_parts) == expected  # every file exactly once
    res, err = pd.read_parquet(out), pd.read_parquet(scoring.errors_path(out))
    assert sorted([*res["path"], *err["path"]]) == expected and list(err["path"]) == ["dicom/broken.dcm"]

    one = tmp_path / "one" / "r.parquet"
    scoring.score_tree(engine, archive, one, scoring.ScoreOptions(batch_size=2, workers=0, progress=False))
    single = pd.read_parquet(one).set_index("path")
    both = res.set_index("path").loc[single.index]
    np.testing.assert_allclose(both[CLASSES].to_numpy(float), single[CLASSES].to_numpy(float), atol=1e-6)


# ------------------------------------------------------------------------------------------------- start-up
def test_checkpoint_built_without_random_init_equals_one_built_with_it(app_assets, monkeypatch):  # noqa: F811
    """load_checkpoint skips the random initialisation that model.safetensors overwrites (issue 34): every
    parameter and buffer, the non-persistent ones (input normalisation, BERT's position ids) included, is
    what the initialised build gives."""
    import contextlib

    import torch

    from medclr.models import dual

    fast = dual.DualEncoder.from_pretrained(app_assets["checkpoint"])
    monkeypatch.setattr(dual, "_no_random_init", contextlib.nullcontext)
    slow = dual.DualEncoder.from_pretrained(app_assets["checkpoint"])

    def tensors(model):
        return {**dict(model.named_parameters(remove_duplicate=False)),
                **dict(model.named_buffers(remove_duplicate=False))}

    a, b = tensors(fast), tensors(slow)
    assert a.keys() == b.keys() and any(k.endswith(".mean") for k in a)  # non-persistent buffers are compared too
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def test_first_non_finite_finds_what_an_element_wise_check_finds():
    """The sum screen (a finite sum proves finite elements) against the element-wise check, with sums that
    overflow although every element is finite, and infinities that meet in a NaN."""
    import torch

    from medclr.inference.checkpoint import first_non_finite

    big = torch.full((4,), 3e38)  # finite elements, an infinite float32 sum
    cases = {"ok": torch.randn(50), "overflow": big, "ints": torch.arange(5), "half": torch.full((8,), 6e4).half()}
    for name, bad in {"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf")}.items():
        t = torch.randn(50)
        t[17] = bad
        cases[name] = t
    pair = torch.randn(50)
    pair[3], pair[9] = float("inf"), float("-inf")
    cases["pair"] = pair
    for name, t in cases.items():
        brute = name if t.is_floating_point() and not bool(torch.isfinite(t).all()) else None
        assert first_non_finite({name: t}) == brute, name
    assert first_non_finite(cases) == "nan" and first_non_finite({k: cases[k] for k in ("ok", "overflow")}) is None


def _score_cli(engine, root, out, *extra):  # noqa: F811
    from medclr.cli import main as medclr_main

    return medclr_main(["score", "--checkpoint", str(engine.checkpoint_dir), "--input", str(root), "--out", str(out),
                        "--workers", "0", "--no-progress", "--threads", "1", *extra])


def test_an_out_that_holds_another_file_is_refused_unless_overwrite(engine, tmp_path, capsys):  # noqa: F811
    """Issue 46: `--out` replaced any file (a copy of an eta table, any CSV), exit 0. Now a file there that
    `medclr score` did not write (the table, or its errors table) is refused in one line before the model loads,
    byte for byte as it was; the scorer's own earlier table resumes; --overwrite replaces the other file."""
    from medclr.jobs.scoring import errors_path, parts_dir
    from medclr.lm.eta import TABLE_COLUMNS, write_eta_table

    root = tmp_path / "in"
    root.mkdir()
    for i in range(2):
        Image.fromarray(_grey(40 + 60 * i)).save(root / f"{i}.png")
    eta = write_eta_table(pd.DataFrame({"sentence_hash": ["ab"], "sentence": ["No effusion."], "count": [1],
                                        "n_tokens": [3], "n_scored": [3], "pll": [-1.0], "pll_per_token": [-0.3],
                                        "eta": [0.1]})[TABLE_COLUMNS], tmp_path / "eta.parquet", {})
    notes = tmp_path / "notes.csv"
    notes.write_text("a,b\n1,2\n")
    (tmp_path / "r.errors.csv").write_text("patient,finding\nx,y\n")  # the errors table a --out r.csv would replace
    before = {p: p.read_bytes() for p in (eta, notes, tmp_path / "r.errors.csv")}
    capsys.readouterr()
    for out, shown in ((eta, eta), (notes, notes), (tmp_path / "r.csv", tmp_path / "r.errors.csv")):
        assert _score_cli(engine, root, out) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"medclr score: error: --out {shown}: the file there is not a `medclr score` ") and \
            err.endswith("pass --overwrite to replace it, or choose another path") and "\n" not in err, err
        assert not parts_dir(out).exists()  # refused before anything was written
    assert {p: p.read_bytes() for p in before} == before
    # the scorer's own table: a rerun resumes it (nothing scored twice), the same command as before
    own = tmp_path / "own.parquet"
    assert _score_cli(engine, root, own) == 0 and "scored 2 files" in capsys.readouterr().out
    assert _score_cli(engine, root, own) == 0 and "2 already done" in capsys.readouterr().out
    own_csv = tmp_path / "own.csv"
    assert _score_cli(engine, root, own_csv) == 0 and _score_cli(engine, root, own_csv) == 0
    assert "2 already done" in capsys.readouterr().out
    # told to, it replaces the eta table copy
    assert _score_cli(engine, root, eta, "--overwrite") == 0
    assert sorted(pd.read_parquet(eta)["path"]) == ["0.png", "1.png"] and errors_path(eta).is_file()


def test_scoring_nothing_is_an_error_with_the_reasons_written(engine, tmp_path, capsys):  # noqa: F811
    """Issue 46: every input unreadable was exit 0. Now exit 1 with the first reason in one line; the errors
    table holds every reason (and the results table its header); an input with no image says so."""
    from medclr.jobs.scoring import errors_path

    root = tmp_path / "in"
    root.mkdir()
    (root / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (root / "b.jpg").write_bytes(b"\xff\xd8 not really")
    out = tmp_path / "r.parquet"
    capsys.readouterr()
    assert _score_cli(engine, root, out) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"medclr score: error: --input {root}: none of its 2 images could be read, nothing was "
                          "scored (first: a.png: ") and err.endswith(f"every reason is in {errors_path(out)}"), err
    assert "\n" not in err
    assert sorted(pd.read_parquet(errors_path(out))["path"]) == ["a.png", "b.jpg"] and pd.read_parquet(out).empty
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("no radiographs here")
    assert _score_cli(engine, empty, tmp_path / "e.parquet") == 1
    assert capsys.readouterr().err.strip() == (f"medclr score: error: --input {empty}: no DICOM, PNG or JPEG file "
                                               "found (1 other file passed over); nothing was scored")
