"""A long preset run killed late must not start over (issue 33): every preset with a fixed step count saves a
checkpoint at least every tenth of its steps and keeps the last two, so a run killed at ~60 % resumes from the
60 % checkpoint. That the resume from such a checkpoint ends bitwise identical to an unbroken run, and that
``--resume train.max_steps=N`` trains exactly the extra steps on the longer schedule's learning rates, is
tests/test_training.py's (test_resume_after_sigkill_matches_straight_run,
test_resume_with_more_steps_extends_a_finished_run)."""

from __future__ import annotations

from medclr.training.config import CONFIG_DIR, load_config


def test_fixed_step_presets_checkpoint_every_tenth_and_keep_two():
    cadence = {}
    for path in sorted(CONFIG_DIR.glob("preset_*.yaml")):
        preset = path.stem[len("preset_"):]
        cfg = load_config("infonce", ["data.manifest=m", "out=o", f"preset={preset}"])
        if cfg["train"]["max_steps"]:  # paper and none run by epochs: their steps follow the data
            cadence[preset] = (cfg["train"]["max_steps"], cfg["ckpt"]["every"], cfg["ckpt"]["keep_last"])
    assert sorted(cadence) == ["cpu_small", "cpu_zeroshot", "gpu_small", "reference"]
    for preset, (steps, every, keep) in cadence.items():
        assert 0 < every <= steps / 10 and keep >= 2, (preset, steps, every, keep)
