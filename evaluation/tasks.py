"""The tasks of `medclr eval`, one module each: a new task is a new ``evaluation/task_<name>.py``.

A task module defines ``TASK``, an instance of a :class:`Task` subclass that holds everything about
the task: its name and place (``order``), what it needs encoded (``uses``), when the data allow it
(``unavailable``), ``run`` (its block of metrics.json and its columns of phrases.csv), its columns of
the Table 1 summary, its figures and report.md section, and its pooled block and section when
several checkpoints are evaluated. The runner (``evaluation.runner.evaluate``), the report
(``evaluation.report``) and the pooling (``evaluation.seeds_run``, ``seeds_report``) iterate
:func:`tasks` and name none of them. docs/evaluation.md, "Adding a task", walks through one.

Task modules import only light modules at the top (the CLI lists the tasks before any model loads).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from medclr.evaluation.data import Encoded, EvalData, Model, Phrases

__all__ = ["USES", "Column", "Inputs", "Task", "task_names", "tasks"]

#: What a task may ask the runner to encode (``Task.uses``).
USES = {
    "test": "global embeddings of the --split images",
    "test_regions": "global embeddings and region features of the --split images",
    "train": "global embeddings of the train-split images",
    "phrases": "region features of the MS-CXR phrase images, and the phrases' text embeddings",
    "prompts": "zero-shot prompt scores of the --split images",
}


@dataclass(frozen=True)
class Column:
    """One column of the Table 1 summary (metrics.json "summary"): key, ↑/↓, decimals shown."""

    key: str
    arrow: str = "↑"
    decimals: int = 3


@dataclass
class Inputs:
    """What the runner prepared; each task reads what it needs. ``model`` and ``enc`` are set once
    the images are encoded (``unavailable`` is asked before that)."""

    data: EvalData
    split: str
    prompts: dict
    test_rows: np.ndarray
    train_rows: np.ndarray
    phrases: Phrases
    n_boot: int
    seed: int
    model: Model | None = None
    enc: Encoded | None = None
    _phrase_text: Any = field(default=None, repr=False)
    progress: bool | str = "auto"  # the tasks' progress bars (medclr.progress): `medclr eval --no-progress` sets False

    @property
    def classes(self) -> list[str]:
        return list(self.prompts)

    def phrase_text(self) -> torch.Tensor:
        """The phrases' text embeddings (encoded once, for every task that uses phrases)."""
        if self._phrase_text is None:
            self._phrase_text = self.model.texts(self.phrases.table["text"].tolist())
        return self._phrase_text


class Task:
    """One evaluation task. Subclasses set the class attributes and override what they have."""

    name: str = ""
    order: int = 0  # place in the task list, the summary columns and the reports
    uses: frozenset[str] = frozenset()  # keys of USES
    columns: tuple[Column, ...] = ()  # its part of the Table 1 summary, in order

    def unavailable(self, inp: Inputs) -> str | None:
        """Why the data do not allow this task (the end of "--tasks X: not available on DATA (...)"), or None."""
        return None

    def run(self, inp: Inputs) -> tuple[dict, pd.DataFrame | None]:
        """Its block of metrics.json (keys starting with "_" are kept for the figures, not written) and
        its per-phrase columns for phrases.csv (one row per phrase, in ``inp.phrases`` order) or None."""
        raise NotImplementedError

    def notes(self, block: dict) -> list[str]:
        """What the report should say about this block (left-out classes, ...); none by default."""
        return []

    def summary(self, block: dict) -> dict[str, Any]:
        """Its Table 1 values, by column key."""
        return {}

    def summary_notes(self, block: dict) -> dict[str, str]:
        """What qualifies a Table 1 value, by column key (e.g. "over 4 of 5 classes"): shown beside the value in
        Table 1 and in `medclr eval`'s summary line; none by default."""
        return {}

    def control(self, block: dict) -> list[str]:
        """Its cells of the Table 1 "chance / control" row."""
        return ["–"] * len(self.columns)

    def figures(self, outdir: Path, block: dict, inp: Inputs, per_phrase: pd.DataFrame) -> dict[str, Any]:
        """Writes its figures under ``outdir/figures/``; returns what its section links."""
        return {}

    def section(self, metrics: dict, block: dict, figs: dict[str, Any]) -> list[str]:
        """Its report.md lines."""
        return []

    # --------------------------------------------------------------- several checkpoints (evaluation.seeds_run)

    def pooled_summary(self, runs: list[dict]) -> dict[str, dict]:
        """Its Table 1 entries pooled over runs (``evaluation.seeds.pooled_entry``)."""
        from medclr.evaluation.seeds import pooled_entry

        return {c.key: pooled_entry(runs, ("summary", c.key)) for c in self.columns}

    def pool(self, runs: list[dict], summary: dict[str, dict]) -> dict | None:
        """Its pooled block of the pooled metrics.json, or None when no run has the task."""
        return None

    def pooled_control(self, pooled: dict) -> list[str]:
        """Its cells of the pooled Table 1 "chance / control (mean)" row."""
        return self.control(pooled)

    def pooled_section(self, pooled: dict, names: list[str]) -> list[str]:
        """Its lines of the pooled report.md (``names``: the checkpoints' directories)."""
        return []


@cache
def _registry() -> tuple[Task, ...]:
    here = Path(__file__).resolve().parent
    found = []
    for info in pkgutil.iter_modules([str(here)]):
        if info.name.startswith("task_"):
            found.append(importlib.import_module(f"{__package__}.{info.name}").TASK)
    return tuple(sorted(found, key=lambda t: (t.order, t.name)))


def tasks() -> tuple[Task, ...]:
    """Every task (each ``evaluation/task_*.py``), in report order."""
    return _registry()


def task_names() -> tuple[str, ...]:
    return tuple(t.name for t in tasks())
