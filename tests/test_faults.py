"""Fault injection (issue 35, "nothing silently wrong"): what a hostile-but-fair operator does to medclr's files
and inputs, and what medclr does about it now. Real files throughout; a full file system is a file-size limit
(RLIMIT_FSIZE, SIGXFSZ ignored, so a write past it fails with EFBIG) on a real ``medclr`` process, so each
writer's own error (pyarrow, safetensors, numpy's memory map) reaches the command line as it would on a disk.

Where a fault is tested elsewhere it is named here (the last column), not tested twice:

| fault | outcome now | test |
| --- | --- | --- |
| bit-rot or truncation in a disk image-cache entry | rebuilt from its source, one log line | [1] |
| source image replaced in place | a new cache entry (key: size, mtime) | [2] |
| random bytes in model.safetensors | the loader refuses it in one line (SHA-256; NaN weights) | [3] |
| the same, in `medclr score`, `eval`, `app`, `index search` | one line, exit 1, nothing written | here |
| zeroed image_cells.npy | refused at open and by `index info --verify` | [4] |
| the same, in `medclr index search` and `medclr app` | one line, exit 1 | here |
| full disk: checkpoint, score table, index, eta table | one line; earlier files intact; no temporaries; rerun ends | here |
| ENOSPC from any command | one line naming the path | [5] |
| a disk clearly too small for train, score, index build | one line before work: path, estimate, free | here |
| index scratch on a short disk; a killed build's scratch | one line before any image; removed next build | [6] |
| a 200 kB sentence in `lm score` | at most --max-pieces pieces scored, counted in the log | [7] |
| `lm score` killed | saved every --save-every seconds, resumed | [8] |
| NaN / inf embedding | an error row in score, a failed image in eval | [9] |
| a class without usable labels | left out of the macro AUC and named: [10]; in report.md | here |
| a blank image (one value in every pixel) | error row in score; refused by app, inspect; training logs it | here |
| a blank training image | counted in data_quality.json (blank_image) | here |
| a format-3 checkpoint_meta.json without weights_sha256 (issue 46) | refused in one line | [11] |
| an index manifest of format /2 without its files record (issue 46) | refused in one line | [12] |
| `medclr score --out` onto a file it did not write (issue 46) | refused unless --overwrite | [13] |
| `medclr score` with nothing readable (issue 46) | exit 1, the first reason; the tables written | [14] |
| two saves of the same tensors (issue 46) | byte-identical safetensors files | [15] |
| config values out of range or of another type (issue 46) | one line when the config is read | [16] |
| progress bars piped to a log, no --no-progress (issue 46) | no bar off a terminal; --no-progress everywhere | [17] |
| library lines, unnamed or echoed inputs, --help gaps, the eval macro (issue 46) | held back, named, described | [18] |
| untrusted DICOM header strings (issue 46) | reduced to their VR's alphabet, counted | [19] |

[1] test_image_cache.py::test_altered_and_truncated_entries_are_rebuilt_not_served
[2] test_image_cache.py::test_a_source_replaced_in_place_gets_a_new_entry
[3] test_checkpoint_meta.py::test_damaged_weights_are_refused_in_one_line
[4] test_index.py::test_damaged_index_files_are_refused_at_open
[5] test_cli.py::test_a_full_disk_is_one_line_for_every_command
[6] test_index_head.py::test_a_full_disk_is_one_line_and_stale_scratch_is_cleaned
[7] test_lm.py::test_one_huge_sentence_costs_bounded_work
[8] test_lm.py::test_score_saves_as_it_goes_and_resumes_after_a_kill
[9] test_score.py::test_a_non_finite_embedding_is_an_error_row_never_a_score,
    test_eval_runner.py::test_a_non_finite_embedding_is_a_failed_image_not_a_metric
[10] test_eval_metrics.py (zero_shot_metrics: AUC_left_out; ZeroShot.notes)
[11] test_checkpoint_meta.py::test_a_record_that_always_holds_the_weights_sha256_is_refused_without_it
[12] test_index.py::test_damaged_index_files_are_refused_at_open
[13] test_score.py::test_an_out_that_holds_another_file_is_refused_unless_overwrite
[14] test_score.py::test_scoring_nothing_is_an_error_with_the_reasons_written
[15] test_models.py::test_saves_of_the_same_state_are_byte_identical
[16] test_training.py::test_bad_config_is_one_clear_line
[17] test_progress.py
[18] test_messages.py
[19] test_header_strings.py
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from medclr.cli import main as medclr_main
from tests.conftest_app import app_assets, engine, index_dir  # noqa: F401 - fixtures
from tests.dicom_factory import make_dicom
from tests.test_checkpoint_meta import _damage, _with_recorded_sha
from tests.test_training import FINDING, NORMAL, _cli, _env, _train_cmd, write_tiny_bert, write_tiny_mimic


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _noise_png(path: Path, seed: int, shape=(64, 80)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)).save(path)
    return path


def _zero_cells(index: Path) -> Path:
    """Zero the image cells after the .npy header: still a valid file of the same size."""
    meta = json.loads((index / "index_manifest.json").read_text())
    cells = index / meta["data"] / meta["head"]["cells"]
    with open(cells, "r+b") as fh:
        fh.seek(256)
        fh.write(bytes(cells.stat().st_size - 256))
    return cells


# --------------------------------------------------------------------------- damaged weights, zeroed index


def test_damaged_weights_are_one_line_in_score_eval_app_and_index_search(app_assets, index_dir, tmp_path,  # noqa: F811
                                                                         capsys):
    """Random bytes inside model.safetensors (header intact): every command that loads the checkpoint stops
    before it writes anything, with one line naming the file (before: score wrote NaN probabilities, eval died
    with a ValueError)."""
    bad = _with_recorded_sha(app_assets["checkpoint"], tmp_path / "ckpt")
    _damage(bad / "model.safetensors")
    image = _noise_png(tmp_path / "in" / "a.png", 0)
    commands = {
        "score": ["score", "--checkpoint", bad, "--input", image.parent, "--out", tmp_path / "s.parquet",
                  "--workers", "0", "--no-progress"],
        "eval": ["eval", "--checkpoint", bad, "--manifest", app_assets["manifest"], "--out", tmp_path / "eval"],
        "app": ["app", "--checkpoint", bad, "--index", index_dir],
        "index search": ["index", "search", "--checkpoint", bad, "--index", index_dir, "--text", "effusion"],
    }
    for name, argv in commands.items():
        assert medclr_main([str(a) for a in argv]) == 1, name
        line = _one_line(capsys)
        assert "model.safetensors: its SHA-256 is not the one training recorded" in line, (name, line)
    assert not (tmp_path / "s.parquet").exists() and not (tmp_path / "eval").exists()


def test_zeroed_index_cells_are_refused_by_search_and_the_app(app_assets, index_dir, tmp_path, capsys):  # noqa: F811
    """A zeroed image_cells.npy (before: `index search` exited 0 with every hit at 0.0) is refused by the two
    commands that open an index for use, at their start."""
    zeroed = tmp_path / "index"
    shutil.copytree(index_dir, zeroed)
    cells = _zero_cells(zeroed)
    ckpt = str(app_assets["checkpoint"])
    for argv in (["index", "search", "--checkpoint", ckpt, "--index", str(zeroed), "--text", "effusion"],
                 ["app", "--checkpoint", ckpt, "--index", str(zeroed)]):
        assert medclr_main(argv) == 1, argv
        line = _one_line(capsys)
        assert f"{cells.name} is changed since it was written" in line and "medclr index build" in line, line


# --------------------------------------------------------------------------- a full file system

# One interpreter runs every limited command (an interpreter start with torch costs seconds): each under its own
# soft RLIMIT_FSIZE, which the process may raise again afterwards; a marker line on stderr separates the cases.
_RUNNER = """
import json, resource, sys, traceback
from medclr.cli import main
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
for name, limit, argv in json.loads(sys.argv[1]):
    print(f"@@@ {name}", file=sys.stderr, flush=True)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        rc = main(argv)
    except BaseException:
        traceback.print_exc()
        rc = -1
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    print(json.dumps([name, rc]), flush=True)
"""
TRAIN_ARGS = ("train.batch_size=8", "ckpt.every=100", "val.every=null")


def _limited(cases: list[tuple[str, int, list]], cwd: Path) -> dict[str, tuple[int, str]]:
    """{case: (exit status, its stderr)} of ``medclr`` commands run under a file-size limit each."""
    def ignore_sigxfsz():  # else the kernel kills the writer instead of failing its write with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    spec = json.dumps([[name, int(limit), [str(a) for a in argv]] for name, limit, argv in cases])
    proc = subprocess.run([sys.executable, "-c", _RUNNER, spec], preexec_fn=ignore_sigxfsz, env=_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    rcs = dict(json.loads(line) for line in proc.stdout.splitlines() if line.startswith("["))
    errs = {block.split("\n", 1)[0].strip(): block.split("\n", 1)[-1] for block in proc.stderr.split("@@@ ")[1:]}
    assert set(rcs) == {c[0] for c in cases}, proc.stderr[-3000:]
    return {name: (rcs[name], errs[name]) for name in rcs}


def _snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in skip}


def _temporaries(root: Path) -> list[str]:
    """What a writer keeps only while it works: every such name is hidden (atomic_path's .NAME.PID-....tmp.EXT,
    training's .tmp-step-N, the index's .cells-scratchPID.npy and .data-N.tmpPID)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*"))


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory, app_assets, engine, index_dir):  # noqa: F811
    """Each writer's earlier output, made here in the test's process; then one `medclr` process that runs the
    command writing it again under a file-size limit below the new file's size. Returns {case: dict(rc, err,
    out, before)} with ``before`` the earlier output's SHA-256 per file."""
    from medclr.data.manifest import write_manifest
    from medclr.data.readers.mimic import read_mimic_cxr_jpg
    from medclr.index import load_index
    from medclr.inference import read_metadata
    from medclr.jobs import scoring
    from medclr.lm.eta import read_eta_table

    base = tmp_path_factory.mktemp("full_disk")
    cases, found = [], {}

    # a training run's checkpoint (2 steps); resumed to 4 steps, its next save does not fit
    data = base / "tiny"
    root = write_tiny_mimic(data / "mimic")
    manifest = write_manifest(read_mimic_cxr_jpg(root), data / "manifest.parquet", root)
    lm = write_tiny_bert(data / "lm", FINDING + NORMAL)
    run = base / "run"
    assert _cli(_train_cmd("infonce", manifest, lm, run, *TRAIN_ARGS, "train.max_steps=2")[3:]) == 0
    train_again = [*_train_cmd("infonce", manifest, lm, run, *TRAIN_ARGS, "train.max_steps=4")[3:], "--resume"]
    cases.append(("checkpoint", (run / "model.safetensors").stat().st_size // 2, train_again))
    found["checkpoint"] = {"out": run, "rerun": train_again, "done": lambda: read_metadata(run).step == 4}

    # a score table of 4 images; 8 more arrive, and the merged table outgrows the old one's size
    archive, table = base / "archive", base / "scores" / "r.parquet"
    for i in range(4):
        _noise_png(archive / f"{i}.png", i)
    scoring.score_tree(engine, archive, table, scoring.ScoreOptions(workers=0, part_files=1, embeddings=True,
                                                                    progress=False))
    for i in range(4, 12):
        _noise_png(archive / f"{i}.png", i)
    score_again = ["score", "--checkpoint", app_assets["checkpoint"], "--input", archive, "--out", table,
                   "--workers", "0", "--part-files", "1", "--embeddings", "--no-progress"]
    cases.append(("score table", table.stat().st_size, score_again))
    found["score table"] = {"out": table.parent, "rerun": score_again,
                            "done": lambda: len(pd.read_parquet(table)) == 12}

    # an index, built again over itself: its image cells do not fit
    index = base / "index"
    shutil.copytree(index_dir, index)
    meta = json.loads((index / "index_manifest.json").read_text())
    build_again = ["index", "build", "--checkpoint", app_assets["checkpoint"], "--manifest", app_assets["manifest"],
                   "--out", index, "--workers", "0"]
    cases.append(("index", (index / meta["data"] / meta["head"]["cells"]).stat().st_size // 2, build_again))
    found["index"] = {"out": index, "rerun": build_again,
                      "done": lambda: load_index(index, engine, verify=True).meta["counts"]["images"] == 12}

    # an eta table, written again
    eta = base / "eta" / "eta.parquet"
    eta_again = ["lm", "score", "--manifest", app_assets["manifest"], "--model", app_assets["text"], "--out", eta,
                 "--eta-fit", "paper", "--no-progress"]
    assert medclr_main([str(a) for a in eta_again]) == 0
    meta_sentences = len(read_eta_table(eta)[0])
    cases.append(("eta table", eta.stat().st_size // 2, eta_again))
    found["eta table"] = {"out": eta.parent, "rerun": eta_again,
                          "done": lambda: len(read_eta_table(eta)[0]) == meta_sentences}

    for entry in found.values():
        # metrics.jsonl is appended to by design (a resumed run drops the lines past its checkpoint)
        entry["before"] = _snapshot(entry["out"], skip=("metrics.jsonl",))
    for name, (rc, err) in _limited(cases, base).items():
        found[name].update(rc=rc, err=err)
    return found


@pytest.mark.parametrize("case", ["checkpoint", "score table", "index", "eta table"])
def test_a_full_disk_is_one_line_leaves_the_earlier_files_and_no_temporaries(full_disk, case):
    """The write that does not fit ends the command with one line (no traceback) saying why; every earlier file
    is byte for byte what it was; nothing half-written is left behind; the same command, once there is room,
    finishes the work."""
    got = full_disk[case]
    lines = [ln for ln in got["err"].splitlines() if ln.startswith("medclr ")]
    assert got["rc"] == 1 and "Traceback" not in got["err"], got["err"][-2000:]
    assert len(lines) == 1 and "a file grew past the file size limit (ulimit -f) while writing" in lines[0], lines
    assert "earlier files are intact" in lines[0]
    after = _snapshot(got["out"], skip=("metrics.jsonl",))
    # new files are allowed: the score parts of the images scored before the merge, which the rerun keeps
    assert {name: after.get(name) for name in got["before"]} == got["before"]
    assert _temporaries(got["out"]) == []
    assert _cli([str(a) for a in got["rerun"]]) == 0
    assert _temporaries(got["out"]) == [] and got["done"]()


# --------------------------------------------------------------------------- evaluation, blank images


def test_a_class_without_labels_is_named_in_the_report(tmp_path):
    """Edema all NaN in the manifest (before: the macro AUC was silently a four-class mean): metrics.json names
    the class left out and the classes the macro is over, and report.md carries the note."""
    from medclr.data.manifest import write_manifest
    from medclr.data.readers.mimic import read_mimic_cxr_jpg
    from tests.test_eval_runner import make_checkpoint, write_tree

    root, texts = write_tree(tmp_path / "mimic", n_test=16, n_train=0, seed=1)
    ckpt = make_checkpoint(tmp_path / "ckpt", texts, head="cosine")
    rows = read_mimic_cxr_jpg(root, views=None)
    rows["Edema"] = np.nan
    manifest = write_manifest(rows, tmp_path / "m.parquet", root)
    out = tmp_path / "report"
    assert medclr_main(["eval", "--checkpoint", str(ckpt), "--manifest", str(manifest), "--out", str(out),
                        "--tasks", "zeroshot", "--n-boot", "0", "--no-figures"]) == 0
    macro = json.loads((out / "metrics.json").read_text())["zeroshot"]["macro"]
    assert macro["AUC_left_out"] == ["Edema"] and "Edema" not in macro["AUC_classes"]
    assert len(macro["AUC_classes"]) == 4
    notes = [ln for ln in (out / "report.md").read_text().splitlines() if ln.startswith("> note:")]
    assert any("no AUC for Edema (0 usable labels" in n and "over 4 of 5 classes" in n for n in notes), notes


@pytest.fixture
def blanks(tmp_path) -> Path:
    """A folder of blank images of every kind the readers decode, and one real-looking image."""
    folder = tmp_path / "blanks"
    folder.mkdir()
    Image.fromarray(np.zeros((64, 64), np.uint8)).save(folder / "black.png")
    Image.fromarray(np.full((64, 80), 255, np.uint8)).save(folder / "white.jpg", quality=95)
    Image.fromarray(np.full((64, 64), 30_000, np.uint16)).save(folder / "grey16.png")
    Image.fromarray(np.full((64, 64), 0.25, np.float32), mode="F").save(folder / "float.tif")
    make_dicom(folder / "flat.dcm", np.full((64, 64), 2048, np.uint16), bits_stored=12)
    _noise_png(folder / "real.png", 7)
    return folder


def test_blank_images_are_error_rows_never_scores(engine, blanks, tmp_path):  # noqa: F811
    """`medclr score` over blank images (before: scored with confident-looking probabilities): each is an error
    row saying so; the real image beside them is scored."""
    from medclr.jobs import scoring

    out = tmp_path / "r.parquet"
    stats = scoring.score_tree(engine, blanks, out, scoring.ScoreOptions(workers=0, progress=False))
    res, err = pd.read_parquet(out), pd.read_parquet(scoring.errors_path(out)).set_index("path")
    assert list(res["path"]) == ["real.png"] and stats["scored"] == 1
    blank_names = {"black.png", "white.jpg", "grey16.png", "flat.dcm"}  # .tif is not an image the scorer looks for
    assert set(err.index) == blank_names and stats["errors"] == len(blank_names)
    for name in blank_names:
        assert "(a blank image: nothing to read)" in err.loc[name, "error"], err.loc[name, "error"]
    assert err.loc["black.png", "error"].startswith("black.png: every pixel has the value 0 ")  # names its file


def test_blank_images_are_refused_by_the_app_and_inspect(engine, blanks, capsys):  # noqa: F811
    from medclr.app.service import AppService
    from medclr.errors import MedclrError
    from medclr.io.limits import blank_problem

    service = AppService(engine, None)
    for name in ("black.png", "flat.dcm", "grey16.png"):
        with pytest.raises(MedclrError, match=r"a blank image: nothing to read"):
            service.zero_shot(str(blanks / name))
    assert service.zero_shot(str(blanks / "real.png"))[0]  # the service is fine, and reads a real image
    assert medclr_main(["inspect", str(blanks / "white.jpg")]) == 1
    assert "every pixel has the value 1 (a blank image" in _one_line(capsys)
    from medclr.io import read_image

    assert blank_problem(read_image(blanks / "float.tif")).startswith("every pixel has the value 0 ")
    one_off = np.zeros((3000, 2000), np.float32)
    one_off[-1, -1] = 1e-3  # outside the strided look: the full comparison must see it
    assert blank_problem(one_off) is None and blank_problem(np.zeros((3000, 2000), np.float32)) is not None


def test_a_blank_training_image_is_logged_once(blanks, caplog):
    """Training cannot refuse an image without stopping the run: it trains on it and says so, once per image."""
    from medclr.training.data import load_resized

    with caplog.at_level(logging.WARNING, logger="medclr.training.data"):
        for _ in range(3):  # data.cache none reads it at every epoch
            load_resized(str(blanks / "black.png"), 36)
        load_resized(str(blanks / "real.png"), 36)
    warned = [r.getMessage() for r in caplog.records if "blank image" in r.getMessage()]
    assert len(warned) == 1 and str(blanks / "black.png") in warned[0] and "trains as it is" in warned[0]


# --------------------------------------------------------------------------- preflight: the space a writer needs

# A disk with SMALL_FREE bytes left: a real tmpfs, mounted in the runner's own mount namespace where the test may
# (root, unshare), filled with fallocate; else shutil.disk_usage reports it (the one fake: filling a real disk is
# not a test). Each command runs in this one interpreter and prints what it left on the small disk.
SMALL_FREE = 64 << 10
_PREFLIGHT_RUNNER = """
import json, shutil, sys
from pathlib import Path
small, free, fake = Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "fake"
if fake:
    real = shutil.disk_usage
    shutil.disk_usage = lambda p: real(p)._replace(free=free) if Path(p).is_relative_to(small) else real(p)
from medclr.cli import main
for name, argv in json.loads(sys.argv[1]):
    print(f"@@@ {name}", file=sys.stderr, flush=True)
    rc = main(argv)
    print(json.dumps([name, rc, sorted(str(p.relative_to(small)) for p in small.rglob("*") if p.is_file())]),
          flush=True)
"""
_MOUNT = 'mount -t tmpfs -o size=1m tmpfs "$0" && fallocate -l $((1024 * 1024 - {free})) "$0/.filler" && exec "$@"'


def _may_mount(folder: Path) -> bool:
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", _MOUNT.format(free=SMALL_FREE) + " true", str(folder),
                            "true"], capture_output=True)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def short_disk(tmp_path_factory, app_assets):  # noqa: F811
    """`medclr train`, `score` and `index build` with their output on a disk with SMALL_FREE bytes left: {case:
    dict(rc, err, left, out, argv, mounted)}; ``left``: the files the command left in its folder of the disk."""
    from medclr.data.manifest import write_manifest
    from medclr.data.readers.mimic import read_mimic_cxr_jpg

    base = tmp_path_factory.mktemp("short_disk")
    small = base / "small"
    small.mkdir()
    data = base / "tiny"
    manifest = write_manifest(read_mimic_cxr_jpg(write_tiny_mimic(data / "mimic")), data / "manifest.parquet",
                              data / "mimic")
    lm = write_tiny_bert(data / "lm", FINDING + NORMAL)
    archive = base / "archive"
    for i in range(60):
        _noise_png(archive / f"{i}.png", i)
    ckpt = app_assets["checkpoint"]
    train = _train_cmd("infonce", manifest, lm, small / "run", *TRAIN_ARGS, "train.max_steps=1")[3:]
    cases = {
        "train": (small / "run" / "checkpoints", train),
        "score": (small / "scores" / "r.parquet", ["score", "--checkpoint", ckpt, "--input", archive, "--out",
                                                   small / "scores" / "r.parquet", "--workers", "0", "--embeddings",
                                                   "--no-progress"]),
        "index build": (small / "index", ["index", "build", "--checkpoint", ckpt, "--manifest",
                                          app_assets["manifest"], "--out", small / "index", "--workers", "0"]),
    }
    mount = _may_mount(small)
    wrap = ["unshare", "-m", "sh", "-c", _MOUNT.format(free=SMALL_FREE), str(small)] if mount else []
    spec = json.dumps([[name, [str(a) for a in argv]] for name, (_, argv) in cases.items()])
    proc = subprocess.run([*wrap, sys.executable, "-c", _PREFLIGHT_RUNNER, spec, str(small), str(SMALL_FREE),
                           "real" if mount else "fake"], env=_env(), cwd=base, capture_output=True, text=True,
                          timeout=600)
    done = {name: (rc, left) for name, rc, left in (json.loads(ln) for ln in proc.stdout.splitlines()
                                                     if ln.startswith("["))}
    errs = {block.split("\n", 1)[0].strip(): block.split("\n", 1)[-1] for block in proc.stderr.split("@@@ ")[1:]}
    assert set(done) == set(cases), proc.stderr[-3000:]
    return {name: {"rc": done[name][0], "err": errs[name], "out": out, "argv": argv, "mounted": mount,
                   "left": [f for f in done[name][1] if Path(f).parts[0] == out.relative_to(small).parts[0]]}
            for name, (out, argv) in cases.items()}


def _estimate(line: str) -> float:
    """The bytes a refusal says the writer needs."""
    value, unit = re.search(r"about ([\d,.]+) (bytes|KiB|MiB|GiB) needed for ", line).groups()
    return float(value.replace(",", "")) * {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]


@pytest.mark.parametrize("case", ["train", "score", "index build"])
def test_a_short_disk_is_refused_before_work_starts(short_disk, case):
    """A writer whose estimate does not fit the free space stops at its start with one line naming the path, the
    estimate and the free space, having written none of its output (score: its run.json, a few hundred bytes)."""
    got = short_disk[case]
    lines = [ln for ln in got["err"].splitlines() if ln.startswith("medclr ")]
    assert got["rc"] == 1 and "Traceback" not in got["err"], got["err"][-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"medclr {case.split()[0]}: error: {got['out']}: "), lines
    free = re.search(r"its filesystem has ([\d,.]+) KiB free", lines[0])
    assert free and 0 < float(free.group(1)) <= SMALL_FREE / 1024, lines[0]  # the small disk's own figure
    assert _estimate(lines[0]) > SMALL_FREE
    assert got["left"] == (["scores/r.parquet.parts/run.json"] if case == "score" else []), got["left"]


def test_estimates_match_what_the_writers_write(short_disk, index_dir, tmp_path, caplog):  # noqa: F811
    """The refused estimates against the real thing: the training run, given room, writes step folders of the
    estimated size (keep_last + 1 of them); the index's estimate covers its cells twice (the scratch and the
    version) and its vectors. The same run counts its blank training image in data_quality.json."""
    got = short_disk["train"]
    argv = [str(a).replace(str(got["out"].parent), str(tmp_path / "run")) for a in got["argv"]]
    from medclr.data.manifest import read_manifest

    rows = read_manifest(next(a.split("=", 1)[1] for a in argv if a.startswith("data.manifest=")))
    blank = Path(rows.attrs["root"]) / rows.query("split == 'train'").iloc[0]["image_path"]
    Image.fromarray(np.zeros((40, 40), np.uint8)).save(blank, quality=95)  # one training image all black
    with caplog.at_level(logging.WARNING, logger="medclr.training.data"):
        assert _cli(argv) == 0
    steps = list((tmp_path / "run" / "checkpoints").glob("step-*"))
    step_bytes = sum(p.stat().st_size for p in steps[0].rglob("*") if p.is_file())
    keep = 2  # preset cpu_small's ckpt.keep_last
    assert len(steps) == 1 and 0.8 < _estimate(_last_line(got["err"])) / ((keep + 1) * step_bytes) < 1.1
    quality = json.loads((tmp_path / "run" / "data_quality.json").read_text())
    assert quality["blank_image"] == 1 and any(str(blank) in r.getMessage() for r in caplog.records)

    meta = json.loads((index_dir / "index_manifest.json").read_text())
    data = index_dir / meta["data"]
    cells = (data / meta["head"]["cells"]).stat().st_size
    written = sum(p.stat().st_size for p in data.iterdir())
    assert 2 * cells < _estimate(_last_line(short_disk["index build"]["err"])) < 2 * written + cells


def _last_line(err: str) -> str:
    return [ln for ln in err.splitlines() if ln.startswith("medclr ")][-1]
