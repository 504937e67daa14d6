"""The `medclr` command as users run it: one clear line on bad input, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from pydicom.data import get_testdata_file

from tests.test_readers import write_mimic_tree


def medclr(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "medclr", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def assert_one_clear_line(result, *needles):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_help_lists_every_contract_command():
    result = medclr("--help")
    assert result.returncode == 0
    for name in ("phantom", "prepare", "lm", "train", "eval", "index", "score", "app", "demo"):
        assert name in result.stdout


def test_version():
    from medclr import __version__

    result = medclr("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"medclr {__version__}"


def test_inspect_real_dicom_and_bad_files(tmp_path):
    ok = medclr("inspect", get_testdata_file("RG1_J2KR.dcm"), "--png", tmp_path / "rg1.png")
    assert ok.returncode == 0 and '"photometric": "MONOCHROME1"' in ok.stdout and (tmp_path / "rg1.png").is_file()
    data = open(get_testdata_file("RG1_UNCR.dcm"), "rb").read()
    (tmp_path / "cut.dcm").write_bytes(data[: len(data) // 3])
    assert_one_clear_line(medclr("inspect", tmp_path / "cut.dcm"), "cut.dcm")
    (tmp_path / "notes.dcm").write_text("not an image")
    assert_one_clear_line(medclr("inspect", tmp_path / "notes.dcm"), "notes.dcm", "not a DICOM file")


def test_prepare_bad_inputs(tmp_path):
    (tmp_path / "c.csv").write_text("image_path,text\na.png,hello\n")
    assert_one_clear_line(medclr("prepare", "--csv", tmp_path / "c.csv", "--out", tmp_path / "m.parquet"),
                          "c.csv", "'report'")
    (tmp_path / "e.csv").write_text("image_path,report\na.png,\n")
    assert_one_clear_line(medclr("prepare", "--csv", tmp_path / "e.csv", "--out", tmp_path / "m.parquet"),
                          "empty report")
    assert_one_clear_line(medclr("prepare", "--mimic", tmp_path / "nowhere", "--out", tmp_path / "m.parquet"),
                          "not a MIMIC-CXR-JPG root")


def test_prepare_mimic_tree_with_mscxr(tmp_path):
    root = write_mimic_tree(tmp_path / "mimic")
    pd.DataFrame({"dicom_id": ["2a280266-c8bae121-54d75383-cac046f4-ca37aa16"], "category_name": ["Pleural Effusion"],
                  "label_text": ["small left effusion"], "path": ["files/p10/x.jpg"], "x": [2], "y": [20], "w": [10],
                  "h": [8], "image_width": [32], "image_height": [32], "split": ["test"]}).to_csv(tmp_path / "ms.csv",
                                                                                            index=False)
    result = medclr("prepare", "--mimic", root, "--mscxr", tmp_path / "ms.csv", "--out", tmp_path / "m.parquet")
    assert result.returncode == 0, result.stderr
    boxes = pd.read_parquet(tmp_path / "m.mscxr.parquet")
    assert boxes["index"].tolist() == [2]


@pytest.mark.parametrize("name", ["train", "demo"])
def test_unbuilt_or_built_commands_answer(name):
    result = medclr(name, "--help")
    assert result.returncode == 0 and "usage: medclr" in result.stdout


def test_demo_trains_the_preset_the_machine_can_afford(monkeypatch):
    """`medclr demo --preset auto`: gpu_small (the 2,500-step recipe) with CUDA, cpu_small without."""
    import argparse
    from pathlib import Path

    import torch

    from medclr.jobs.demo import plan, preset

    args = argparse.Namespace(preset="auto", n=10, seed=0, eval_per_class=1, eval_normal=None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert preset(args) == "cpu_small"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert preset(args) == "gpu_small"
    train = next(s for s in plan(Path("w"), args) if s.command == "train")
    assert "preset=gpu_small" in train.argv
    assert preset(argparse.Namespace(preset="cpu_small")) == "cpu_small"
    zs = argparse.Namespace(**{**vars(args), "preset": "cpu_zeroshot"})
    assert "preset=cpu_zeroshot" in next(s for s in plan(Path("w"), zs) if s.command == "train").argv


def test_train_preset_auto_follows_the_device_it_will_run_on(monkeypatch, caplog):
    """`medclr train`'s default preset is auto: gpu_small where training runs on CUDA, cpu_small otherwise
    (train.device=cpu on a GPU machine too), and the log says which."""
    import logging

    import torch

    from medclr.training.config import load_config

    base = ["data.manifest=m", "out=o"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="medclr.training.config"):
        assert load_config("infonce", base)["preset"] == "cpu_small"
    assert "preset auto: cpu_small" in caplog.text
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert load_config("infonce", base)["preset"] == "gpu_small"
    assert load_config("infonce", [*base, "train.device=cpu"])["preset"] == "cpu_small"
    assert load_config("infonce", [*base, "preset=cpu_zeroshot"])["preset"] == "cpu_zeroshot"


def test_progress_bars_follow_the_terminal(monkeypatch):
    """One rule for medclr's bars: auto = stderr is a terminal; false silences, true forces; silencing turns the
    libraries' bars off too."""
    import io
    import sys

    from medclr.progress import show_progress, silence_library_bars

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # piped to a log
    assert show_progress() is False and show_progress(None) is False and show_progress(True) is True

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    assert show_progress("auto") is True and show_progress(False) is False
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as hf_logging

    try:
        silence_library_bars()
        assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
    finally:
        hf_logging.enable_progress_bar()
        enable_progress_bars()


def test_a_full_disk_is_one_line_for_every_command(monkeypatch, capsys):
    """ENOSPC raised from any command's writer ends as one line naming the path (no traceback), exit 1."""
    import errno

    import medclr.data.label_cli as label_cli
    from medclr.cli import main

    def writes_on_a_full_disk(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out/manifest.parquet")

    monkeypatch.setattr(label_cli, "run", writes_on_a_full_disk)
    assert main(["label", "--manifest", "m.parquet", "--out", "o.parquet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no space left on the disk while writing /data/out/manifest.parquet" in err[0]


def test_demo_resumes_a_training_stopped_part_way(tmp_path):
    """Every checkpoint publishes its weights at OUT's top, so they do not mean the training is done: a run stopped at
    step 200 of 3,000 is resumed (--resume), and only a run at its total steps counts as cached."""
    import argparse
    import json

    from medclr.jobs.demo import plan

    args = argparse.Namespace(preset="reference", n=10, seed=0, eval_per_class=1, eval_normal=None, train=True)
    out = tmp_path / "checkpoint"
    (out / "checkpoints" / "step-0000200").mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"weights of step 200")
    state = out / "trainer_state.json"
    state.write_text(json.dumps({"step": 200, "total_steps": 3000}))
    train = next(s for s in plan(tmp_path, args) if s.command == "train")
    assert "--resume" in train.argv and not train.done()
    state.write_text(json.dumps({"step": 3000, "total_steps": 3000}))
    assert train.done()
