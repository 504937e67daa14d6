"""Issue 46, item 12: progress bars follow one rule (``medclr.progress``).

* No module but ``medclr/progress.py`` imports tqdm: every bar medclr draws is ``progress_bar``'s.
* Every long-running command takes ``--no-progress``.
* ``medclr prepare --mimic``, ``medclr eval`` and ``medclr index build`` run with stderr captured (not a
  terminal) write no carriage-return frame into it; on a terminal they draw bars unless ``--no-progress``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest

from medclr.cli import main as medclr_main
from tests.test_eval_runner import make_checkpoint, write_tree

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("medclr", "app", "jobs", "training", "evaluation")

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# (command line up to its options): every command that runs over a data set or trains
LONG_RUNNING = (["phantom"], ["prepare"], ["lm", "fit"], ["lm", "score"], ["train"], ["eval"], ["index", "build"],
                ["index", "add"], ["score"], ["demo"])


def _imports_tqdm(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tqdm" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tqdm":
            return True
    return False


def test_only_medclr_progress_imports_tqdm():
    found = [str(p.relative_to(REPO)) for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
             if _imports_tqdm(p)]
    assert found == ["medclr/progress.py"], found


@pytest.mark.parametrize("command", LONG_RUNNING, ids=" ".join)
def test_every_long_running_command_takes_no_progress(command, capsys):
    with pytest.raises(SystemExit) as done:
        medclr_main([*command, "--help"])
    assert done.value.code == 0
    assert "--no-progress" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    d = tmp_path_factory.mktemp("progress")
    root, texts = write_tree(d / "mimic", n_test=8, n_train=4, seed=2, n_categories=2)
    return d, root, make_checkpoint(d / "ckpt", texts, head="cosine")


class _Terminal:
    """sys.stderr as a terminal: isatty() True, the writes kept."""

    def __init__(self, capture):
        self.capture = capture

    def isatty(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self.capture, name)


@pytest.fixture
def library_bars_back(monkeypatch):
    """--no-progress turns transformers' and huggingface_hub's bars off for the process: back on afterwards."""
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # silence_library_bars may set it: as it was, after
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")
    yield
    from huggingface_hub.utils import enable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    enable_progress_bars()


def test_prepare_eval_and_index_build_write_no_bar_frames_into_a_log(tree, capsys, monkeypatch, library_bars_back):
    d, root, ckpt = tree
    capsys.readouterr()  # what building the checkpoint wrote
    manifest = d / "m.parquet"

    def prepare(out, *extra):
        return ["prepare", "--mimic", root, "--views", "all", "--mscxr", root / "MS_CXR_Local_Alignment_v1.1.0.csv",
                "--out", out, *extra]

    def index_build(out, *extra):
        return ["index", "build", "--checkpoint", ckpt, "--manifest", manifest, "--out", out, "--workers", "0", *extra]

    runs = {"prepare": prepare(manifest),
            "eval": ["eval", "--checkpoint", ckpt, "--manifest", manifest, "--out", d / "eval", "--tasks",
                     "zeroshot,grounding,retrieval", "--n-boot", "0", "--no-figures"],
            "index build": index_build(d / "index")}
    for name, argv in runs.items():
        assert medclr_main([str(a) for a in argv]) == 0, name
        err = capsys.readouterr().err
        assert "\r" not in err, (name, err[:500])
    # on a terminal the same commands draw bars (the rule above is what kept them out of the log), and
    # --no-progress keeps them off there too
    monkeypatch.setattr(sys, "stderr", _Terminal(sys.stderr))
    assert medclr_main([str(a) for a in index_build(d / "index2")]) == 0
    assert "\r" in capsys.readouterr().err
    assert medclr_main([str(a) for a in index_build(d / "index3", "--no-progress")]) == 0
    assert "\r" not in capsys.readouterr().err
    assert medclr_main([str(a) for a in prepare(d / "m2.parquet", "--no-progress")]) == 0
    assert "\r" not in capsys.readouterr().err


def test_progress_bar_is_off_for_a_log_and_passes_items_through(monkeypatch):
    import io

    from medclr.progress import progress_bar

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    assert list(progress_bar(range(3), desc="x")) == [0, 1, 2]
    with progress_bar(total=3, desc="y") as bar:
        bar.update(3)
    assert log.getvalue() == ""
    assert list(progress_bar(np.arange(2), enabled=False)) == [0, 1]
