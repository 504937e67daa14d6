"""`medclr eval`: checkpoint + data -> metrics.json, phrases.csv, report.md and figures.

One pass encodes every image the chosen tasks need (``Task.uses``: test split for zero-shot and the
probe, train split for the probe, MS-CXR images for grounding and retrieval); each task
(``evaluation/task_*.py``, listed by ``evaluation.tasks``) then works on the stored features with the
pure metric functions of ``medclr.evaluation.grounding/retrieval/zeroshot/probe``. This module names
no task. Choices made by the tasks (written down in ``docs/evaluation.md``, section "The runner"):

* zero-shot score = the checkpoint's own image-sentence score (its similarity head, what the loss
  was trained on; for a cosine head that is ``zeroshot.cosine_zero_shot_scores`` on global embeddings);
* grounding map = the head's region-sentence cosines, ``upsample_map`` with the exact resize/crop
  geometry of ``medclr.inference`` preprocessing (BioViL smoothing 1.5 cells), at original size;
* retrieval = RoIAlign (``torchvision.ops.roi_align``, aligned, 3x3 bins, 2x2 samples per bin) of
  the region features the head compares with text (after the non-local block for LSE+NL), one
  vector per box, the unnormalised mean over the phrase's boxes, L2-normalised; scores are its
  cosines with the phrase embeddings (query = box feature for image->text);
* controls (the protocol must not be gameable): labels shuffled across images for zero-shot, each
  phrase's map recomputed with a phrase of another image for grounding, the analytic chance level
  (K/n, (n+1)/2) for retrieval, training labels shuffled for the probe.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medclr.errors import MedclrError
from medclr.evaluation.data import Encoded, EvalData, Model, encode, phrases, prompt_set, split_rows
from medclr.evaluation.tasks import Inputs, Task, task_names, tasks
from medclr.prompts import copy_prompts

__all__ = ["TASKS", "Encoded", "Model", "encode", "evaluate"]
TASKS = task_names()  # every task, in report order


def choose_tasks(wanted: list[str] | None, inp: Inputs, source: str) -> tuple[list[str], list[Task], list[str]]:
    """(the tasks that run, in the order asked; the same as Task objects, in task order; notes on the
    ones skipped). A task named in ``wanted`` that the data do not allow is an error; by default
    every task the data allow runs."""
    known = {t.name: t for t in tasks()}
    names = list(known) if not wanted else list(wanted)
    for name in names:
        if name not in known:
            raise MedclrError(f"--tasks {name}: unknown task (tasks: {', '.join(known)})")
    why = {name: known[name].unavailable(inp) for name in names}
    if wanted:
        missing = [name for name in names if why[name] is not None]
        if missing:
            raise MedclrError(f"--tasks {missing[0]}: not available on {source} ({why[missing[0]]})")
    run = [name for name in names if why[name] is None]
    notes = [f"task {name} skipped: {why[name]}" for name in names if name not in run]
    return run, [t for t in tasks() if t.name in run], notes


def _encode(model: Model, inp: Inputs, run: list[Task], batch_size: int, workers: int) -> Encoded:
    """One pass over every image the tasks use (region features kept for the phrase images, and for the test
    images when a task scores them through the head)."""
    uses = set().union(*(t.uses for t in run))
    need = set(inp.test_rows.tolist()) if uses & {"test", "test_regions"} else set()
    if "train" in uses:
        need |= set(inp.train_rows.tolist())
    phrase_images = set(inp.phrases.table["index"].astype(int).tolist()) if "phrases" in uses else set()
    keep = phrase_images | (set(inp.test_rows.tolist()) if "test_regions" in uses else set())
    enc = encode(model, inp.data, np.asarray(sorted(need | phrase_images), dtype=np.int64), keep,
                 inp.prompts if "prompts" in uses else None, batch_size, workers, progress=inp.progress)
    if enc.rows.size == 0:
        raise MedclrError(f"{inp.data.source}: none of the {len(enc.failed)} images could be read "
                          f"(first: {enc.failed[0]['error'] if enc.failed else 'no image'})")
    return enc


def _phrase_notes(inp: Inputs, run: list[Task]) -> list[str]:
    ph = inp.phrases
    in_train = int((ph.table["manifest_split"] == "train").sum()) if any("phrases" in t.uses for t in run) else 0
    return [f"{in_train} of {len(ph)} MS-CXR phrases are on images of the manifest's train split"] if in_train else []


def _inputs(data: EvalData, split: str, prompts_file: str | None, max_images: int | None,
            max_train_images: int | None, max_phrases: int | None, mscxr_split: str, n_boot: int, seed: int) -> Inputs:
    prompts = prompt_set(prompts_file)
    test_rows = split_rows(data, split, max_images, seed)
    train_rows = split_rows(data, "train", max_train_images, seed) if split != "train" else np.zeros(0, np.int64)
    ph = phrases(data, mscxr_split, max_phrases, seed, rows=test_rows)
    return Inputs(data, split, prompts, test_rows, train_rows, ph, n_boot, seed)


def evaluate(checkpoint: str, data_path: str, out: str, *, tasks: list[str] | None = None, split: str = "test",
             prompts_file: str | None = None, max_images: int | None = None, max_train_images: int | None = 2000,
             max_phrases: int | None = None, mscxr_split: str = "auto", batch_size: int = 32, workers: int = 0,
             device: str = "cpu", n_boot: int = 1000, seed: int = 0, figures: bool = True,
             compare: dict[str, str] | None = None, progress: bool | str = "auto") -> dict:
    """Run the evaluation and write ``out``/metrics.json, phrases.csv (when a task measured MS-CXR phrases),
    report.md, figures/*.png (``progress``: the bars, ``medclr.progress``)."""
    from medclr.eval_report import read_summary
    from medclr.evaluation.data import load_eval_data
    from medclr.evaluation.report import jsonable, summary, summary_notes, write_report

    t0 = time.perf_counter()
    compared = {label: read_summary(path) for label, path in (compare or {}).items()}
    data = load_eval_data(data_path)
    inp = _inputs(data, split, prompts_file, max_images, max_train_images, max_phrases, mscxr_split, n_boot, seed)
    inp.progress = progress
    names, run, skipped = choose_tasks(tasks, inp, data.source)
    if not run:
        raise MedclrError(f"{data.source}: nothing to evaluate (no {split} images with labels, no MS-CXR phrases)")
    inp.model = Model(checkpoint, device=device)
    if prompts_file is None:  # the checkpoint's own set: the one its findings record calibrated, as the app uses
        inp.prompts = copy_prompts(inp.model.engine.default_prompts)
    inp.enc = _encode(inp.model, inp, run, batch_size, workers)
    t_enc = time.perf_counter() - t0
    metrics: dict[str, Any] = {"checkpoint": str(checkpoint), "data": data.source, "mscxr": data.mscxr_source,
                               "split": split, "mscxr_split": mscxr_split, "tasks": names, "seed": seed,
                               "prompts": prompts_file or inp.model.engine.prompts_name,
                               "model": inp.model.describe(), "n_images_encoded": int(inp.enc.rows.size),
                               "failed_images": inp.enc.failed,
                               "notes": list(data.notes) + skipped + _phrase_notes(inp, run)}
    per_phrase = inp.phrases.table[["phrase_id", "dicom_id", "index", "category", "text", "manifest_split"]].copy()
    measured = False  # whether a task gave per-phrase values: without any, phrases.csv would hold no result
    for t in run:
        metrics[t.name], columns = t.run(inp)
        metrics["notes"] += t.notes(metrics[t.name])
        if columns is not None:
            per_phrase = pd.concat([per_phrase, columns], axis=1)
            measured = True
    metrics["summary"] = summary(metrics)
    metrics["summary_notes"] = summary_notes(metrics)  # e.g. AUC, ACC "over 4 of 5 classes"
    metrics["compare"] = compared
    metrics["timing_s"] = {"encode": round(t_enc, 1), "total": None}

    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    if measured and len(per_phrase):
        per_phrase.to_csv(outdir / "phrases.csv", index=False)
    else:  # one from an earlier run into this --out would pass for this run's
        (outdir / "phrases.csv").unlink(missing_ok=True)
    write_report(outdir, metrics, inp, per_phrase, figures=figures)
    metrics["timing_s"]["total"] = round(time.perf_counter() - t0, 1)
    (outdir / "metrics.json").write_text(json.dumps(jsonable(metrics), indent=2, allow_nan=False) + "\n")
    return metrics
