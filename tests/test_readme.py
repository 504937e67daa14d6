"""The README's Python example runs as written: on a shipped model of the README's name (the app tests' checkpoint
packed under $MEDCLR_PRETRAINED_DIR), and a manifest and index laid out where `make demo` puts them
(~/.cache/medclr/demo, HOME pointed at a temporary folder), built by the app tests' fixtures."""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

from tests.conftest_app import app_assets, index_dir  # noqa: F401 - fixtures

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_python_example_runs_as_written(app_assets, index_dir, tmp_path, monkeypatch):  # noqa: F811
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) == 1, "the README has one Python example"
    from medclr.export.pack import pack
    from medclr.pretrained import REFERENCE, ROOT_ENV

    pack(app_assets["checkpoint"], REFERENCE, where=tmp_path / "shipped")  # float32: the index's weights, exactly
    demo = tmp_path / ".cache" / "medclr" / "demo"
    demo.mkdir(parents=True)
    (demo / "index").mkdir()  # one index per served model: the shipped model's is index/NAME
    for name, target in (("manifest.parquet", app_assets["manifest"]), (f"index/{REFERENCE}", index_dir)):
        (demo / name).symlink_to(target)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "shipped"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        scope: dict = {}
        exec(compile(blocks[0], str(README), "exec"), scope)  # noqa: S102 - the README's own code
    lines = out.getvalue().splitlines()
    classes = ["Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax"]
    assert [line.rsplit(" ", 1)[0] for line in lines[:5]] == classes
    heatmap, image, picture = scope["heatmap"], scope["image"], scope["picture"]
    from medclr.io import read_image

    assert heatmap.shape == read_image(image).shape and not math.isnan(float(heatmap[heatmap == heatmap].mean()))
    assert picture.shape == (*heatmap.shape, 3) and picture.dtype.name == "uint8"
    hits = lines[5:]
    assert len(hits) == 3 and all(Path(h.split(" ", 1)[1]).suffix for h in hits)
    assert [float(h.split(" ")[0]) for h in hits] == sorted((float(h.split(" ")[0]) for h in hits), reverse=True)
