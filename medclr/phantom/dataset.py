"""Generate a CXR-Phantom data set: plan every study, then render and write them in parallel.

Two passes over the study numbers 0..n-1, both on a process pool:
1. plan: the latent class of every study (cheap), so each study's class
   probability in the generated set is known when its row is written;
2. render: image, report, DICOM (optional) written by the workers; the table
   rows come back to the parent in study order and are streamed to disk.

Every random choice of study k comes from (seed, k), so the bytes do not
depend on the number of workers.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import multiprocessing as mp
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image

from medclr import __version__
from medclr.errors import MedclrError
from medclr.phantom import reports as R, vocab as V, writer as W
from medclr.phantom.material import load_material
from medclr.phantom.plan import (
    CHEX5_TARGETS,
    NORMAL_TARGET,
    SOURCES,
    class_model_prob,
    eval_targets,
    per_other_category,
    plan_eval_study,
    plan_study,
)
from medclr.phantom.renderer import render
from medclr.progress import progress_bar

log = logging.getLogger(__name__)
MAX_SIZE = 1024
MIN_SIZE = 64
_CTX: dict = {}
_OUR_FILES = ("phantom.json", "phantom_classes.csv", W.GROUND_TRUTH_FILE, W.MSCXR_FILE, "mimic-cxr-2.0.0-metadata.csv.gz",
              "mimic-cxr-2.0.0-split.csv.gz", "mimic-cxr-2.0.0-chexpert.csv.gz")


def subject_index(seed: int, n: int) -> np.ndarray:
    """Subject number of each study: subjects have 1-4 studies; a prefix does not depend on n."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 11]))
    counts = rng.choice([1, 2, 3, 4], size=n, p=[0.55, 0.25, 0.12, 0.08])
    return np.repeat(np.arange(n), counts)[:n]


def identifiers(seed: int, k: int, subj: int) -> tuple[str, str, str]:
    """(subject_id, study_id, dicom_id) in MIMIC's formats: 8 digits from 1, 8 digits from 5, 5x8 hex."""
    off = int(hashlib.sha1(f"phantom-ids:{seed}".encode()).hexdigest()[:8], 16)
    subject = 10_000_000 + (subj * 7919 + off) % 9_000_000
    study = 50_000_000 + (k * 7907 + off // 7) % 10_000_000
    h = hashlib.sha1(f"phantom:{seed}:{k}".encode()).hexdigest()
    return str(subject), str(study), "-".join(h[i:i + 8] for i in range(0, 40, 8))


def split_of(subject_id: str, seed: int, fractions: tuple[float, float]) -> str:
    u = int(hashlib.sha1(f"split:{seed}:{subject_id}".encode()).hexdigest()[:12], 16) / float(1 << 48)
    return "train" if u < fractions[0] else ("validate" if u < fractions[0] + fractions[1] else "test")


def _init(ctx: dict) -> None:
    _CTX.update(ctx)
    _CTX["material"] = load_material()


def _spec(key) -> dict:
    """A pool study is keyed by its number k; an evaluation study by (j, target), a balanced validation
    study by (j, target, "validate")."""
    if isinstance(key, tuple):
        return plan_eval_study(_CTX["material"], _CTX["seed"], *key)
    return plan_study(_CTX["material"], _CTX["source"], _CTX["seed"], key)


def _plan_class(key) -> str:
    return _spec(key)["latent_class"]


def _meta(spec: dict, ids, size: int, nth: int, seed: int) -> dict:
    subject, study, dicom_id = ids
    h = int(hashlib.sha1(f"date:{seed}:{subject}".encode()).hexdigest()[:8], 16)
    base = dt.date(2110, 1, 1) + dt.timedelta(days=h % (80 * 365))
    date = base + dt.timedelta(days=nth * (30 + h % 200))
    t = int(hashlib.sha1(f"time:{seed}:{study}".encode()).hexdigest()[:8], 16)
    time = f"{(t % 24):02d}{(t // 24) % 60:02d}{(t // 1440) % 60:02d}.{t % 1000:03d}"
    pa_view = spec["view"] == "PA"
    desc = "CHEST (PA AND LAT)" if pa_view else "CHEST (PORTABLE AP)"
    return {"dicom_id": dicom_id, "subject_id": subject, "study_id": study, "PerformedProcedureStepDescription": desc,
            "ViewPosition": spec["view"], "Rows": size, "Columns": size, "StudyDate": date.strftime("%Y%m%d"),
            "StudyTime": time, "ProcedureCodeSequence_CodeMeaning": desc,
            "ViewCodeSequence_CodeMeaning": "postero-anterior" if pa_view else "antero-posterior",
            "PatientOrientationCodeSequence_CodeMeaning": "Erect" if pa_view else "Recumbent"}


def _study(task) -> dict:
    k, key, subj, nth, prob, model_prob, count = task
    c = _CTX
    m, seed, size, out = c["material"], c["seed"], c["size"], Path(c["out"])
    spec = _spec(key)
    res = render(m, spec, size, float_image=c["dicom"])
    ids = identifiers(seed, k, subj)
    subject, study, dicom_id = ids
    folder = f"files/p{subject[:2]}/p{subject}/s{study}"
    image_path, report_path = f"{folder}/{dicom_id}.jpg", f"{folder}.txt"
    (out / folder).mkdir(parents=True, exist_ok=True)
    Image.fromarray(res["image"], mode="L").save(out / image_path, quality=c["quality"])
    report = R.format_report(spec["findings_text"], spec["impression_text"], spec["view"], spec["indication"],
                             spec["comparison"])
    (out / report_path).write_text(report, encoding="utf-8")
    split = spec["eval_split"] if spec["eval_target"] else split_of(subject, seed, c["fractions"])
    meta = _meta(spec, ids, size, nth, seed)
    row = {"dicom_id": dicom_id, "subject_id": subject, "study_id": study, "split": split, "meta": meta}
    if c["dicom"]:
        W.write_dicom(out / f"{folder}/{dicom_id}.dcm", res["image_float"], row, seed, spec["k"])
    findings, mscxr = [], []
    for f, boxes in zip(spec["findings"], res["boxes"]):
        chex, cat = V.CHEXPERT_OF.get(f["name"]) or "", V.MSCXR_OF.get(f["name"], "")
        findings.append({**{key: f[key] for key in V.FINDING_KEYS}, "rendered": bool(f.get("rendered")),
                         "sentence": f.get("sentence_text", ""), "chexpert": chex, "mscxr_category": cat,
                         "boxes": [list(b) for b in boxes]})
        if split == "test" and cat and f.get("sentence_text"):
            for x, y, w, h in boxes:
                mscxr.append({"dicom_id": dicom_id, "category_name": cat, "label_text": f["sentence_text"],
                              "path": image_path, "x": x, "y": y, "w": w, "h": h, "image_width": size,
                              "image_height": size, "split": "test"})
    row["labels"] = V.chexpert_row([f for f in spec["findings"] if f.get("rendered")], set(spec["negated"]))
    row["mscxr"] = mscxr
    acq = {key: round(v, 5) for key, v in res["acquisition"].items()}
    row["gt"] = {"dicom_id": dicom_id, "study_id": study, "subject_id": subject, "split": split,
                 "source": spec["source"], "eval_target": spec["eval_target"], "openi_uid": spec["uid"], "view": spec["view"],
                 "image_path": image_path,
                 "report_path": report_path, "latent_class": spec["latent_class"], "latent_class_prob": prob,
                 "latent_class_model_prob": model_prob, "latent_class_count": count, "n_findings": len(findings),
                 "findings": findings, "ctr": round(res["ctr"], 4), "lung_mask": res["lung_mask"],
                 "acquisition": json.dumps(acq, sort_keys=True), "report": report}
    return row


CHEX5_LABELS = tuple(V.CHEX5_OF.values())


class _Tally:
    """Counts for phantom.json: studies per split, CheX5 positives (all, and 1/0 in the test split), boxes."""

    def __init__(self):
        self.splits: Counter = Counter()
        self.chex5: Counter = Counter()
        self.test: dict[str, Counter] = {c: Counter() for c in CHEX5_LABELS}
        self.boxes: Counter = Counter()

    def add(self, row: dict) -> None:
        self.splits[row["split"]] += 1
        for name in CHEX5_LABELS:
            value = row["labels"][name]
            self.chex5[name] += value == 1.0
            if row["split"] == "test":
                self.test[name]["positive" if value == 1.0 else "negative" if value == 0.0 else "unlabelled"] += 1
        self.boxes.update(r["category_name"] for r in row["mscxr"])

    def test_chex5(self) -> dict:
        return {c: {k: int(v.get(k, 0)) for k in ("positive", "negative", "unlabelled")} for c, v in self.test.items()}


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise MedclrError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        ours = (out / "phantom.json").is_file()
        if not overwrite:
            raise MedclrError(f"{out}: folder is not empty; choose a new one"
                              + (" or pass --overwrite to replace the phantom data set in it" if ours else ""))
        if not ours:
            raise MedclrError(f"{out}: --overwrite only replaces a phantom data set (no phantom.json here)")
        shutil.rmtree(out / "files", ignore_errors=True)
        for name in _OUR_FILES:
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def _pool(workers: int, ctx: dict):
    if workers <= 1:
        _init(ctx)
        return None
    method = "fork" if sys.platform.startswith("linux") else None
    return mp.get_context(method).Pool(workers, initializer=_init, initargs=(ctx,))


def generate(out, n: int, seed: int = 0, source: str = "both", size: int = 256, dicom: bool = False,
             workers: int | None = None, fractions: tuple[float, float] = (0.9, 0.1), quality: int = 95,
             overwrite: bool = False, progress: bool | str = "auto", eval_per_class: int = V.EVAL_PER_CLASS,
             val_per_class: int = V.VAL_PER_CLASS, eval_normal: int | None = None) -> dict:
    """Write a phantom data set to ``out``; returns the summary also saved as phantom.json.

    ``n`` pool studies of ``source`` are split by subject into train / validate / test by ``fractions``
    (train, validate; the rest test: none by default). The evaluation sets follow as the test split, on
    subjects of their own (:func:`medclr.phantom.plan.eval_targets`): ``eval_per_class`` single-positive
    studies per CheX5 class, ``eval_per_class // 5`` per other MS-CXR category (0: none), then ``eval_normal``
    studies with no finding (default ``eval_per_class // 5``; written last, so 0 gives the same other studies). The validate
    split gets ``val_per_class`` single-positive studies per CheX5 class on top of its pool share, also on
    subjects of their own: enough positives of every finding for training's per-finding calibration
    (the pool's validate share holds a handful of pneumonias).
    """
    if source not in SOURCES:
        raise MedclrError(f"--source {source!r}: expected one of {', '.join(SOURCES)}")
    if not (1 <= int(n) <= 10_000_000):
        raise MedclrError(f"--n {n}: expected a number of studies between 1 and 10,000,000")
    if not (MIN_SIZE <= int(size) <= MAX_SIZE):
        raise MedclrError(f"--size {size}: expected an image side between {MIN_SIZE} and {MAX_SIZE} px")
    if not (0 < fractions[0] <= 1 and 0 <= fractions[1] < 1 and fractions[0] + fractions[1] <= 1 + 1e-9):
        raise MedclrError(f"--split {fractions}: expected train and validate fractions summing to at most 1")
    if not (0 <= int(eval_per_class) <= 100_000):
        raise MedclrError(f"--eval-per-class {eval_per_class}: expected 0..100000")
    eval_normal = per_other_category(int(eval_per_class)) if eval_normal is None else int(eval_normal)
    if not (0 <= eval_normal <= 100_000):
        raise MedclrError(f"--eval-normal {eval_normal}: expected 0..100000")
    if not (0 <= int(val_per_class) <= 100_000):
        raise MedclrError(f"--val-per-class {val_per_class}: expected 0..100000")
    if int(eval_per_class) == 0 and fractions[0] + fractions[1] >= 1 - 1e-9:
        raise MedclrError("no test split: pass --eval-per-class N (evaluation sets) or a --split with a test share")
    out = Path(out)
    _prepare_out(out, overwrite)
    material = load_material()  # built (or read) once here, inherited by forked workers
    workers = max(1, int(workers if workers is not None else (os.cpu_count() or 1)))
    ctx = {"out": str(out), "seed": int(seed), "source": source, "size": int(size), "dicom": bool(dicom),
           "fractions": tuple(fractions), "quality": int(quality)}
    W.write_json(out / "phantom.json", {"status": "incomplete", "n": int(n), "seed": int(seed), "source": source})
    pool = _pool(workers, ctx)

    def run(fn, items, chunksize):
        return pool.imap(fn, items, chunksize) if pool is not None else map(fn, items)

    try:
        chunk = max(1, min(256, n // (8 * workers) or 1))
        classes = list(progress_bar(run(_plan_class, range(n), chunk), total=n, desc="plan", unit="study",
                                    enabled=progress, leave=False))
        targets = eval_targets(int(eval_per_class))
        eval_keys = list(enumerate(targets)) + [
            (j, t, "validate") for j, t in enumerate(t for t in CHEX5_TARGETS for _ in range(int(val_per_class)))] + [
            (len(targets) + j, NORMAL_TARGET) for j in range(eval_normal)]
        eval_classes = list(run(_plan_class, eval_keys, max(1, min(64, len(eval_keys) // (4 * workers) or 1))))
        counts = Counter(classes)  # the pool's distribution: what training batches see
        model = {c: class_model_prob(material, source, c) for c in set(classes) | set(eval_classes)}
        subj = subject_index(seed, n)
        first = np.r_[0, np.flatnonzero(np.diff(subj)) + 1]
        nth = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
        n_subjects = int(subj[-1]) + 1 if n else 0
        keys = list(range(n)) + eval_keys
        all_classes = classes + eval_classes
        subjects = np.r_[subj, n_subjects + np.arange(len(eval_keys))]  # one new subject per evaluation study
        nths = np.r_[nth, np.zeros(len(eval_keys), dtype=np.int64)]
        tasks = ((k, keys[k], int(subjects[k]), int(nths[k]), counts[all_classes[k]] / n, model[all_classes[k]],
                  counts[all_classes[k]]) for k in range(len(keys)))
        writer = W.DatasetWriter(out)
        tally = _Tally()
        try:
            results = run(_study, tasks, max(1, min(16, chunk)))
            for row in progress_bar(results, total=len(keys), desc="phantom", unit="study", enabled=progress):
                writer.add(row)
                tally.add(row)
        finally:
            writer.close()
    except BaseException:
        if pool is not None:
            pool.terminate()
        raise
    else:
        if pool is not None:
            pool.close()
    finally:
        if pool is not None:
            pool.join()
    with open(out / "phantom_classes.csv", "w", encoding="utf-8", newline="") as fh:
        fh.write("latent_class,count,prob,model_prob\n")
        for c, cnt in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            fh.write(f'"{c}",{cnt},{cnt / n:.8g},{model[c]:.8g}\n')
    summary = {"status": "complete", "version": __version__, "n": int(n), "seed": int(seed), "source": source,
               "size": int(size), "dicom": bool(dicom), "split_fractions": list(fractions),
               "splits": dict(sorted(tally.splits.items())), "n_total": len(keys),
               "eval_per_class": int(eval_per_class), "val_per_class": int(val_per_class),
               "eval_studies": len(targets) + eval_normal, "eval_normal": eval_normal,
               "val_studies": len(eval_keys) - len(targets) - eval_normal,
               "n_classes": len(counts), "chex5_positive": dict(tally.chex5), "test_chex5": tally.test_chex5(),
               "mscxr_boxes": writer.n_boxes, "mscxr_boxes_by_category": dict(sorted(tally.boxes.items())),
               "latent_class": "sorted canonical rendered findings, ':side' for lateral findings whose side the "
                               "report states; 'normal' when none",
               "latent_class_prob": "frequency of the class among the n generated studies",
               "latent_class_model_prob": "probability of the class under the generating distribution"}
    W.write_json(out / "phantom.json", summary)
    return summary
