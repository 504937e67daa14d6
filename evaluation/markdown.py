"""Formatting for the report.md files of `medclr eval`: numbers, Markdown tables, CIs, and the
pooled cells of several checkpoints (mean ± sd, the CI over seeds, each checkpoint's value).

Shared by the single report (``evaluation.report``), the pooled one (``evaluation.seeds_report``)
and every task's own sections (``evaluation/task_*.py``). Pure Python: importing it costs nothing.
"""

from __future__ import annotations

import math
from typing import Any

from medclr.eval_report import ci, fmt, table  # the cells the core's model card writes too

__all__ = ["ci", "fmt", "header", "interval", "mean_sd", "pooled_row", "table"]


# --------------------------------------------------------------------------- several checkpoints


def mean_sd(e: dict | None, nd: int = 3) -> str:
    """"0.712 ± 0.031" (the sd is left out when undefined, e.g. n = 1)."""
    if not e or e.get("n", 0) == 0:
        return "–"
    sd = e.get("sd")
    return fmt(e["mean"], nd) + ("" if sd is None or (isinstance(sd, float) and math.isnan(sd)) else f" ± {fmt(sd, nd)}")


def interval(lo: Any, hi: Any, nd: int = 3) -> str:
    bad = [v is None or (isinstance(v, float) and not math.isfinite(v)) for v in (lo, hi)]
    return "–" if any(bad) else f"[{lo:.{nd}f}, {hi:.{nd}f}]"


def _per_ckpt(p: dict, nd: int) -> str:
    bounds = p.get("ci")
    return fmt(p["value"], nd) + (f" {interval(bounds[0], bounds[1], nd)}" if bounds else "")


def pooled_row(label: str, e: dict, nd: int = 3) -> list[Any]:
    """label | mean ± sd | n | 95 % CI over seeds | each checkpoint's value [bootstrap CI]."""
    return [label, mean_sd(e, nd), e["n"], interval(e["ci_low"], e["ci_high"], nd),
            *(_per_ckpt(p, nd) for p in e["per_checkpoint"])]


def header(first: str, names: list[str]) -> list[str]:
    """The head of a pooled table whose rows are :func:`pooled_row`."""
    return [first, "mean ± sd", "n", "95 % CI of the mean (t)", *names]
