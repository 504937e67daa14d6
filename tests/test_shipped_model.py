"""The reference model that ships inside medclr (issue 44): it opens by name in a fresh HOME with the hub offline,
every file matches SHA256SUMS, and its zero-shot probabilities on the fixed phantom renders its pack recorded come
back to 1e-4 (the pack measured them on this CPU in float32 from the float16 weights)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from medclr.pretrained import REFERENCE, ROOT_ENV, names, resolve, root


def test_the_reference_model_ships():
    assert REFERENCE in names()


def test_it_loads_by_name_in_a_fresh_home_offline_and_gives_its_recorded_probabilities(tmp_path):
    """A subprocess with an empty HOME and no hub: medclr.load("phantom-resnet18") checks every file against its
    recorded SHA-256 and scores the recorded renders."""
    code = f"""
import json, sys
import numpy as np, torch
import medclr
from medclr.export.pack import phantom_images
from medclr.pretrained import resolve
cast = json.loads((resolve({REFERENCE!r}) / "model.json").read_text())["cast"]
model = medclr.load({REFERENCE!r})
batch = torch.stack([model.prepare(x)[0] for x in phantom_images(cast["n_images"], model.preprocess.resize_to)])
classes, prob, _, _ = model.zero_shot_scores(model.image_features(batch))
assert list(classes) == cast["classes"], classes
print(json.dumps(float(np.abs(prob - np.asarray(cast["probabilities"])).max())))
"""
    env = {k: v for k, v in os.environ.items() if k != ROOT_ENV}
    env.update(HOME=str(tmp_path), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) < 1e-4
    assert not (tmp_path / ".cache" / "huggingface").exists()


def test_its_folder_is_small_enough_to_ship():
    folder = resolve(REFERENCE)
    assert folder.parent == root() and sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) <= 40 * 2**20
