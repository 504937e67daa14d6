"""`medclr eval` with several checkpoints (training seeds): each one evaluated alone, then pooled.

``evaluate_seeds([A, B, C], data, R)`` runs :func:`medclr.evaluation.runner.evaluate` for checkpoint k into
``R/<k>_<checkpoint dir name>/`` (k = 1, 2, ...; its own metrics.json, phrases.csv, report.md,
figures) and writes ``R/metrics.json`` and ``R/report.md`` with the pooled view
(:func:`pool_runs`, each task's ``pool`` with ``medclr.evaluation.seeds.pooled_entry``: mean ± sd, n,
Student-t 95 % CI of the mean over seeds, and each checkpoint's value beside it with its bootstrap CI
where it has one).

The pooled metrics.json keeps ``summary`` (the single run's keys, holding the means over
checkpoints) so tools that read ``summary`` keep working; ``summary_sd`` holds the sample sds. The
full statistics are under ``pooled`` (never under the task keys a single run uses, where a reader
would expect one number).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from medclr.evaluation.report import SUMMARY_KEYS, summary_columns
from medclr.evaluation.tasks import tasks

__all__ = ["SUMMARY_KEYS", "evaluate_seeds", "pool_runs", "run_dir_names"]


def run_dir_names(checkpoints: list[str]) -> list[str]:
    """``<k>_<checkpoint dir name>``, k from 1 (odd characters of the name become "_")."""
    names = []
    for k, c in enumerate(checkpoints, 1):
        base = Path(os.path.abspath(os.fspath(c))).name or "checkpoint"
        names.append(f"{k}_{re.sub(r'[^A-Za-z0-9._-]+', '_', base)}")
    return names


def pool_runs(runs: list[dict]) -> dict[str, Any]:
    """The pooled blocks of several runs' metrics (in memory, or as read from their metrics.json).

    Returns ``{"summary": {k: entry}, <task>: block, ...}``: the Table 1 entries, then each task's
    pooled block (``Task.pool``) when some run has that task. An entry is ``pooled(values)`` plus
    ``per_checkpoint``: ``[{"value", "ci"}]`` in run order (``evaluation.seeds.pooled_entry``)."""
    out: dict[str, Any] = {"summary": {}}
    for t in tasks():
        out["summary"].update(t.pooled_summary(runs))
    for t in tasks():
        block = t.pool(runs, out["summary"])
        if block is not None:
            out[t.name] = block
    return out


def evaluate_seeds(checkpoints: list[str], data_path: str, out: str, *, compare: dict[str, str] | None = None,
                   **kwargs: Any) -> dict[str, Any]:
    """Evaluate every checkpoint into ``out/<k>_<name>/`` and write the pooled ``out/metrics.json`` and
    ``out/report.md``. ``kwargs`` are :func:`medclr.evaluation.runner.evaluate`'s (the same for every run)."""
    from medclr.errors import MedclrError
    from medclr.eval_report import read_summary
    from medclr.evaluation.report import jsonable
    from medclr.evaluation.runner import evaluate
    from medclr.evaluation.seeds_report import pooled_markdown

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
        "summary": {c.key: pool["summary"][c.key]["mean"] for c in summary_columns()},
        "summary_sd": {c.key: pool["summary"][c.key]["sd"] for c in summary_columns()},
        "pooled": pool, "compare": compared, "notes": notes,
        "timing_s": {"total": round(time.perf_counter() - t0, 1),
                     "per_checkpoint": [m["timing_s"]["total"] for m in runs]},
    }
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "report.md").write_text(pooled_markdown(metrics))
    (outdir / "metrics.json").write_text(json.dumps(jsonable(metrics), indent=2, allow_nan=False) + "\n")
    return metrics
