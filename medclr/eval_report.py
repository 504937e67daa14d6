"""What `medclr eval` writes, for its readers inside and outside evaluation: ``metrics.json`` read back, and the
Markdown cells its numbers are written in.

One copy of each: `medclr eval --compare` (``medclr.evaluation.report``), the reports' tables
(``medclr.evaluation.markdown``) and the model card of `medclr export` (``medclr.export.card``) all use
these, and the core may not import ``medclr.evaluation``. The file's fields are documented in
docs/evaluation.md section 7.4 (strict JSON: NaN is written null, infinities "inf" / "-inf").
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from medclr.errors import MedclrError

METRICS_NAME = "metrics.json"


def read_metrics(path: str | Path, purpose: str = "--compare") -> dict[str, Any]:
    """A `medclr eval` metrics.json (a single run or the pooled one of several checkpoints) as written; ``path``
    may name the file or its evaluation folder. Anything else is one line that starts with ``purpose``."""
    p = Path(path).expanduser()
    p = p / METRICS_NAME if p.is_dir() else p
    try:
        metrics = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(metrics["summary"], dict):
            raise TypeError("summary")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MedclrError(f"{purpose} {path}: not a `medclr eval` metrics.json ({type(exc).__name__})") from None
    return metrics


def number(value: Any) -> float:
    """A metrics.json number as a float: null -> NaN, "inf" / "-inf" -> ±inf."""
    if value is None:
        return math.nan
    if value in ("inf", "-inf"):
        return math.inf if value == "inf" else -math.inf
    return float(value)


def read_summary(path: str | Path) -> dict[str, Any]:
    """The Table 1 row of another run's metrics.json (for ``--compare``)."""
    return {k: number(v) for k, v in read_metrics(path)["summary"].items()}


# --------------------------------------------------------------------------- Markdown cells


def fmt(x: Any, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if isinstance(x, (int, np.integer)) or float(x).is_integer() and abs(x) >= 10:
        return f"{x:g}" if not isinstance(x, (int, np.integer)) else str(int(x))
    return f"{x:.{nd}f}"


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(head: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(*head), _row(*(["---"] * len(head))), *(_row(*r) for r in rows)]


def ci(bounds: Any) -> str:
    """" [lo, hi]" of a bootstrap CI, or "" when it is undefined."""
    if not bounds or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in bounds):
        return ""
    return f" [{bounds[0]:.3f}, {bounds[1]:.3f}]"
