"""Issue 46, items 12 and 14: what the commands print, run as users run them (a subprocess where what reaches
stderr is the point; the CLI's main in-process otherwise).

* `medclr export --format torchscript` prints none of transformers' lines (`loss_type=None`, a FutureWarning);
* a truncated DICOM is one line naming the file ("truncated"), without pydicom's "End of file reached before
  delimiter" lines;
* an image too small to read is refused naming its file (score's error rows, `index search --image`, the API);
* a prompt file of another suffix says which formats a prompt file takes;
* a score folder of another run says what differs in words ("holds a run scored for other classes");
* `--part-files N` writes parts of N rows whatever the batch size;
* `medclr app --port 0` prints the port it bound; a raw API call naming a file that was not uploaded is
  refused in one log line that does not echo the caller's string;
* `--help`: every subcommand has a description and every option a help; `train --help` points at
  `--show-config`, which prints the defaults, not at a repository path;
* `medclr eval`'s summary line and Table 1 say when the macro is over fewer classes than the prompt set has,
  and the macro ACC leaves out the class the macro AUC leaves out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from medclr.cli import main as medclr_main
from tests.conftest_app import app_assets, engine  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def medclr(*args, timeout=600, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "medclr", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)


def _tiny_png(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((np.random.default_rng(0).random((16, 16)) * 255).astype(np.uint8)).save(path)
    return path


# --------------------------------------------------------------------------- item 12: library lines, messages


def test_export_prints_none_of_the_libraries_lines(app_assets, tmp_path):  # noqa: F811
    done = medclr("export", "--checkpoint", app_assets["checkpoint"], "--format", "torchscript", "--out",
                  tmp_path / "ts", "--batch", "2")
    assert done.returncode == 0, done.stderr
    for line in ("loss_type", "FutureWarning", "Warning", "warnings.warn"):
        assert line not in done.stderr, done.stderr


def _truncated_jpeg_dicom(path: Path) -> Path:
    """An encapsulated (JPEG) DICOM cut inside its pixel data: pydicom stops at the end of the file."""
    from pydicom.data import get_testdata_file

    data = Path(get_testdata_file("SC_rgb_jpeg_dcmtk.dcm")).read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) - 600])
    return path


def test_a_truncated_dicom_is_one_line_without_the_readers_lines(tmp_path, app_assets, capsys):  # noqa: F811
    cut = _truncated_jpeg_dicom(tmp_path / "in" / "cut.dcm")
    done = medclr("inspect", cut)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"medclr inspect: error: {cut}: truncated DICOM file (it ends inside "
                                                "its pixel data or a sequence: an incomplete copy or download)"]
    # the scorer records it as an error row with the same reason, once
    out = tmp_path / "r.parquet"
    assert medclr_main(["score", "--checkpoint", str(app_assets["checkpoint"]), "--input", str(tmp_path / "in"),
                        "--out", str(out), "--workers", "0", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "End of file" not in err and "(first: cut.dcm: truncated DICOM file" in err, err
    errors = pd.read_parquet(tmp_path / "r.errors.parquet")
    assert errors["error"].tolist() == ["cut.dcm: truncated DICOM file (it ends inside its pixel data or a sequence: "
                                        "an incomplete copy or download)"]


def test_an_image_too_small_is_refused_naming_its_file(tmp_path, app_assets, engine, capsys):  # noqa: F811
    tiny = _tiny_png(tmp_path / "in" / "tiny.png")
    out = tmp_path / "r.parquet"
    assert medclr_main(["score", "--checkpoint", str(app_assets["checkpoint"]), "--input", str(tmp_path / "in"),
                        "--out", str(out), "--workers", "0", "--no-progress"]) == 1
    assert "(first: tiny.png: 16x16 pixels is not a radiograph" in capsys.readouterr().err
    assert pd.read_parquet(tmp_path / "r.errors.parquet")["error"].iloc[0].startswith("tiny.png: 16x16 pixels")
    from medclr.errors import MedclrError

    for call in (engine.embed_images, lambda paths: engine.encode(paths[0])):
        with pytest.raises(MedclrError, match=re.escape(f"{tiny}: 16x16 pixels is not a radiograph")):
            call([str(tiny)])
    with pytest.raises(MedclrError, match=r"^image: 16x16 pixels"):  # an array (the app's): no file to name
        engine.encode(np.zeros((16, 16), np.float32) + np.eye(16, dtype=np.float32))


def test_a_prompt_file_of_another_suffix_says_which_formats_are_read(tmp_path, app_assets, capsys):  # noqa: F811
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Cardiomegaly: enlarged heart\n")
    assert medclr_main(["score", "--checkpoint", str(app_assets["checkpoint"]), "--input", str(app_assets["images"]),
                        "--out", str(tmp_path / "r.parquet"), "--prompts", str(prompts)]) == 1
    line = capsys.readouterr().err.strip()
    assert f"{prompts}: expected a prompt file in YAML (.yaml, .yml) or JSON (.json)" in line, line
    assert "positive" in line and "not valid JSON" not in line


def test_score_says_what_differs_in_words_and_writes_parts_of_part_files_rows(tmp_path, app_assets, capsys):  # noqa: F811
    out = tmp_path / "r.parquet"
    base = ["score", "--checkpoint", str(app_assets["checkpoint"]), "--input", str(app_assets["images"]), "--out",
            str(out), "--workers", "0", "--no-progress"]
    assert medclr_main([*base, "--batch-size", "16", "--part-files", "5"]) == 0
    parts = sorted((tmp_path / "r.parquet.parts").glob("part-*.parquet"))
    n = len(pd.read_parquet(out))
    assert n > 10 and [len(pd.read_parquet(p)) for p in parts] == [5] * (n // 5) + [n % 5] * (n % 5 > 0)
    capsys.readouterr()
    prompts = tmp_path / "p.yaml"
    prompts.write_text("Nodule: {positive: [A nodule], negative: [No nodule]}\n")
    assert medclr_main([*base, "--prompts", str(prompts)]) == 1
    line = capsys.readouterr().err.strip()
    assert "holds a run scored for other classes (recorded ['Cardiomegaly'," in line and "now ['Nodule']" in line, line
    assert "a different" not in line


def _serve(checkpoint: Path, log: Path):
    """`medclr app --port 0`, its stderr to ``log``: (process, the URL it printed)."""
    proc = subprocess.Popen([sys.executable, "-m", "medclr", "app", "--checkpoint", str(checkpoint), "--port", "0",
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        found = re.search(r"serving .* on (http://127\.0\.0\.1:(\S+)) ", line)
        if found:
            assert found.group(2).isdigit(), line  # the port bound, not a placeholder
            return proc, found.group(1)
    proc.kill()
    raise AssertionError(f"the app printed no address: {log.read_text()[-2000:]}")


def test_app_port_0_prints_the_port_and_refuses_a_path_that_was_not_uploaded(tmp_path, app_assets):  # noqa: F811
    import httpx

    from medclr.app.ui import NOT_UPLOADED

    log = tmp_path / "app.log"
    proc, url = _serve(app_assets["checkpoint"], log)
    try:
        assert httpx.get(url, timeout=30).status_code == 200
        planted = "/etc/EVIL<script>alert(1)</script>"
        r = httpx.post(f"{url}/gradio_api/call/preview", json={"data": [{"path": planted, "meta": {
            "_type": "gradio.FileData"}}]}, timeout=60)
        event = r.json()["event_id"]
        with httpx.stream("GET", f"{url}/gradio_api/call/preview/{event}", timeout=60) as resp:
            lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
        assert json.loads(lines[-1][6:])["error"] == NOT_UPLOADED
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    text = log.read_text()
    assert "Traceback" not in text and "EVIL" not in text and "script" not in text, text
    assert [ln for ln in text.splitlines() if "refused" in ln] == [
        "app: preview refused: a file input that was not uploaded to this app"]


# --------------------------------------------------------------------------- item 14: --help


def _parsers():
    """(command path, parser) of every command and subcommand, as `medclr` builds them."""
    from importlib.metadata import entry_points

    from medclr.cli import build_parser

    def walk(parser, name):
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    yield from walk(p, f"{name} {sub}")

    for ep in entry_points(group="medclr.commands"):
        top = build_parser([ep.name])
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        yield from walk(sub.choices[ep.name], ep.name)


def test_every_command_has_a_description_and_every_option_a_help():
    missing = []
    for name, parser in _parsers():
        if not parser.description:
            missing.append(f"{name}: no description")
        missing += [f"{name} {a.option_strings or a.dest}: no help" for a in parser._actions
                    if a.help is None and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    assert missing == []


def test_index_help_describes_each_action_and_its_options():
    for action, needles in {"build": ["Embed a manifest's images"], "add": ["does not hold yet", "--index DIR"],
                            "search": ["closest to a text", "-k K", "how many hits", "--index DIR"]}.items():
        done = medclr("index", action, "--help", timeout=120)
        assert done.returncode == 0
        for needle in needles:
            assert needle in done.stdout, (action, needle)
    assert "the index directory to search" in medclr("index", "search", "--help", timeout=120).stdout


def test_train_help_points_at_show_config_which_prints_the_defaults(capsys):
    with pytest.raises(SystemExit):
        medclr_main(["train", "--help"])
    text = capsys.readouterr().out
    assert "--show-config" in text and "training/configs" not in text and "base.yaml" not in text
    assert medclr_main(["train", "--show-config"]) == 0
    shown = capsys.readouterr().out
    assert shown == (REPO / "training" / "configs" / "base.yaml").read_text()  # the shipped file, comments included
    assert medclr_main(["train", "--show-config", "dcl_lm"]) == 0 and "extends: base" in capsys.readouterr().out
    assert medclr_main(["train", "--show-config", "nope"]) == 1
    assert "not a shipped config" in capsys.readouterr().err
    assert medclr_main(["train"]) == 1
    assert "--config CFG is required" in capsys.readouterr().err


# --------------------------------------------------------------------------- item 14: the eval macro


def test_eval_says_when_the_macro_is_over_fewer_classes_and_acc_leaves_them_out(tmp_path, capsys):
    """Edema positive on every test image: no AUC, and no place in the macro ACC either (its per-class ACC is
    the share predicted positive); the summary line and Table 1 say "over 4 of 5 classes"."""
    from medclr.data.manifest import write_manifest
    from medclr.data.readers.mimic import read_mimic_cxr_jpg
    from tests.test_eval_runner import make_checkpoint, write_tree

    root, texts = write_tree(tmp_path / "mimic", n_test=16, n_train=0, seed=3)
    ckpt = make_checkpoint(tmp_path / "ckpt", texts, head="cosine")
    rows = read_mimic_cxr_jpg(root, views=None, progress=False)
    rows["Edema"] = 1.0
    manifest = write_manifest(rows, tmp_path / "m.parquet", root)
    out = tmp_path / "eval"
    capsys.readouterr()
    assert medclr_main(["eval", "--checkpoint", str(ckpt), "--manifest", str(manifest), "--out", str(out),
                        "--tasks", "zeroshot", "--n-boot", "20", "--no-figures"]) == 0
    line = capsys.readouterr().out
    assert re.search(r"AUC \d\.\d{3} \(over 4 of 5 classes\), ACC \d\.\d{3} \(over 4 of 5 classes\)", line), line
    m = json.loads((out / "metrics.json").read_text())
    z = m["zeroshot"]
    assert z["macro"]["ACC_left_out"] == ["Edema"] == z["macro"]["AUC_left_out"]
    kept = z["macro"]["ACC_classes"]
    assert z["macro"]["ACC"] == pytest.approx(np.mean([z["per_class"][c]["ACC"] for c in kept]))
    assert z["per_class"]["Edema"]["ACC"] is not None  # still reported per class
    assert m["summary_notes"] == {"AUC": "over 4 of 5 classes", "ACC": "over 4 of 5 classes"}
    report = (out / "report.md").read_text()
    row = next(ln for ln in report.splitlines() if ln.startswith("| **this run**"))
    assert row.count("(over 4 of 5 classes)") == 2, row
    assert "the macro AUC and ACC are over 4 of 5 classes" in report
