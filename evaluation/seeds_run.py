"""`medclr eval` with several checkpoints (training seeds): each one evaluated alone, then pooled.

``evaluate_seeds([A, B, C], data, R)`` runs :func:`medclr.evaluation.runner.evaluate` for checkpoint k into
``R/<k>_<checkpoint dir name>/`` (k = 1, 2, ...; its own metrics.json, phrases.csv, report.md,
figures) and writes ``R/metrics.json`` and ``R/report.md`` with the pooled view
(:func:`pool_runs`, ``medclr.evaluation.seeds.pooled``: mean ± sd, n, Student-t 95 % CI of the mean over
seeds, and each checkpoint's value beside it with its bootstrap CI where it has one).

The pooled metrics.json keeps ``summary`` (the single run's keys, holding the means over
checkpoints) so tools that read ``summary`` keep working; ``summary_sd`` holds the sample sds. The
full statistics are under ``pooled`` (never under the task keys a single run uses, where a reader
would expect one number).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from medclr.evaluation.report import SUMMARY_KEYS
from medclr.evaluation.seeds import pooled

__all__ = ["SUMMARY_KEYS", "evaluate_seeds", "pool_runs", "run_dir_names"]
PROBE_FRACTIONS = ("1%", "10%", "100%")


def run_dir_names(checkpoints: list[str]) -> list[str]:
    """``<k>_<checkpoint dir name>``, k from 1 (odd characters of the name become "_")."""
    names = []
    for k, c in enumerate(checkpoints, 1):
        base = Path(os.path.abspath(os.fspath(c))).name or "checkpoint"
        names.append(f"{k}_{re.sub(r'[^A-Za-z0-9._-]+', '_', base)}")
    return names


def _num(x: Any) -> float:
    """A metric value from memory or from metrics.json (null -> NaN, "inf"/"-inf" -> ±inf)."""
    if x is None:
        return math.nan
    if isinstance(x, str):
        return {"inf": math.inf, "-inf": -math.inf}.get(x, math.nan)
    return float(x)


def _get(m: dict, *path: str) -> Any:
    for key in path:
        if not isinstance(m, dict) or key not in m:
            return None
        m = m[key]
    return m


def _ci(x: Any) -> list[float] | None:
    if not isinstance(x, (list, tuple)) or len(x) != 2:
        return None
    lo, hi = _num(x[0]), _num(x[1])
    return None if math.isnan(lo) or math.isnan(hi) else [lo, hi]


def _entry(runs: list[dict], path: tuple[str, ...], ci_path: tuple[str, ...] | None = None) -> dict[str, Any]:
    """``pooled`` of one metric over the runs, plus each run's value (and bootstrap CI, if any)."""
    values = [_num(_get(m, *path)) for m in runs]
    e: dict[str, Any] = pooled(values)
    e["per_checkpoint"] = [{"value": v, "ci": _ci(_get(m, *ci_path)) if ci_path else None}
                           for v, m in zip(values, runs)]
    return e


def pool_runs(runs: list[dict]) -> dict[str, Any]:
    """The pooled blocks of several runs' metrics (in memory, or as read from their metrics.json).

    Returns ``{"summary": {k: entry}, "zeroshot": ..., "grounding": ..., "retrieval": ..., "probe": ...}``
    where an entry is ``pooled(values)`` plus ``per_checkpoint``: ``[{"value", "ci"}]`` in run order.
    A block is present when some run has that task."""
    out: dict[str, Any] = {"summary": {k: _entry(runs, ("summary", k)) for k in SUMMARY_KEYS}}
    out["summary"]["AUC"] = _entry(runs, ("zeroshot", "macro", "AUC"), ("zeroshot", "macro", "AUC_CI"))
    out["summary"]["ACC"] = _entry(runs, ("zeroshot", "macro", "ACC"), ("zeroshot", "macro", "ACC_CI"))
    if any(m.get("zeroshot") for m in runs):
        classes: list[str] = []
        for m in runs:
            classes += [c for c in (_get(m, "zeroshot", "classes") or []) if c not in classes]
        z: dict[str, Any] = {"classes": classes, "n_images": [_get(m, "zeroshot", "n_images") for m in runs]}
        z["per_class"] = {c: {"AUC": _entry(runs, ("zeroshot", "per_class", c, "AUC"),
                                            ("zeroshot", "per_class", c, "AUC_CI"))} for c in classes}
        z["macro"] = {"AUC": out["summary"]["AUC"], "ACC": out["summary"]["ACC"]}
        z["control_shuffled_labels"] = {"AUC": _entry(runs, ("zeroshot", "control_shuffled_labels", "AUC"))}
        z["prompt_cosine"] = {c: _entry(runs, ("zeroshot", "prompt_cosine", c)) for c in classes}
        z["sign_check"] = {}
        for c in classes:
            e = _entry(runs, ("zeroshot", "sign_check", c))
            e["n_flipped"] = int(sum(p["value"] < 0 for p in e["per_checkpoint"]))
            z["sign_check"][c] = e
        out["zeroshot"] = z
    if any(m.get("grounding") for m in runs):
        out["grounding"] = {k: _entry(runs, ("grounding", k, "macro"))
                            for k in ("CNR", "mIoU", "CNR_control", "mIoU_control")}
        out["grounding"]["n_phrases"] = [_get(m, "grounding", "n_phrases") for m in runs]
    if any(m.get("retrieval") for m in runs):
        r = {k: _entry(runs, ("retrieval", k)) for k in ("Recall", "MedR")}
        r["chance"] = {k: _entry(runs, ("retrieval", "chance", k)) for k in ("Recall", "MedR")}
        r["n_phrases"] = [_get(m, "retrieval", "n_phrases") for m in runs]
        out["retrieval"] = r
    if any(_get(m, "probe", "chex5") for m in runs):
        out["probe"] = {"chex5_macro_AUC": {f: _entry(runs, ("probe", "chex5", f, "macro_AUC")) for f in PROBE_FRACTIONS},
                        "control_shuffled_labels": _entry(runs, ("probe", "control_shuffled_labels", "macro_AUC"))}
    return out


def evaluate_seeds(checkpoints: list[str], data_path: str, out: str, *, compare: dict[str, str] | None = None,
                   **kwargs: Any) -> dict[str, Any]:
    """Evaluate every checkpoint into ``out/<k>_<name>/`` and write the pooled ``out/metrics.json`` and
    ``out/report.md``. ``kwargs`` are :func:`medclr.evaluation.runner.evaluate`'s (the same for every run)."""
    from medclr.evaluation.report import jsonable, read_summary
    from medclr.evaluation.runner import evaluate
    from medclr.evaluation.seeds_report import pooled_markdown
    from medclr.errors import MedclrError

    if len(checkpoints) < 2:
        raise MedclrError(f"evaluate_seeds: needs 2 or more checkpoints, got {len(checkpoints)}")
    t0 = time.perf_counter()
    compared = {label: read_summary(path) for label, path in (compare or {}).items()}  # bad --compare: fail first
    outdir = Path(out)
    names = run_dir_names(checkpoints)
    runs = []
    for name, ckpt in zip(names, checkpoints):
        runs.append(evaluate(str(ckpt), data_path, str(outdir / name), compare=compare, **kwargs))
    pool = pool_runs(runs)
    notes = []
    for m in runs:
        notes += [n for n in m.get("notes", []) if n not in notes]
    real = [os.path.realpath(c) for c in checkpoints]
    dupes = sorted({c for c in real if real.count(c) > 1})
    if dupes:
        notes.append(f"the same checkpoint is given more than once ({', '.join(dupes)}): its runs are identical, "
                     "so the sd and the CI over seeds understate the seed-to-seed spread")
    first = runs[0]
    metrics: dict[str, Any] = {
        "protocol": "seeds", "n_checkpoints": len(runs),
        "checkpoints": [{"checkpoint": str(c), "dir": n, "summary": m["summary"]}
                        for c, n, m in zip(checkpoints, names, runs)],
        "data": first["data"], "mscxr": first.get("mscxr"), "split": first["split"],
        "mscxr_split": first["mscxr_split"], "tasks": first["tasks"], "seed": first["seed"],
        "summary": {k: pool["summary"][k]["mean"] for k in SUMMARY_KEYS},
        "summary_sd": {k: pool["summary"][k]["sd"] for k in SUMMARY_KEYS},
        "pooled": pool, "compare": compared, "notes": notes,
        "timing_s": {"total": round(time.perf_counter() - t0, 1),
                     "per_checkpoint": [m["timing_s"]["total"] for m in runs]},
    }
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "report.md").write_text(pooled_markdown(metrics))
    (outdir / "metrics.json").write_text(json.dumps(jsonable(metrics), indent=2, allow_nan=False) + "\n")
    return metrics
