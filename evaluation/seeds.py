"""Pooling over training seeds: mean ± sd and a Student-t CI of the mean (``docs/evaluation.md`` §8).

Pure functions on per-seed numbers (one value per checkpoint). The runner uses them for
``medclr eval --checkpoint A --checkpoint B ...``; ``bench/paper_replication.py`` can use them to
compare two methods trained on the same seeds.

* NaN (and ``None``) values are dropped; ``n`` counts what is left.
* ``sd`` is the sample standard deviation (``ddof=1``).
* The CI is ``mean ± t_{(1+level)/2, n-1} · sd / sqrt(n)`` (Student t with n − 1 degrees of
  freedom), the CI of the mean over seeds. It says how well the seeds pin the method's expected
  score, not how much one run varies (that is ``sd``).
* ``n == 0``: every field NaN. ``n == 1``: the mean is the value, ``sd`` and the CI are NaN.
* ±inf is kept (a degenerate CNR is ``inf`` by design): the mean is then ±inf and sd/CI NaN.

:func:`pooled_entry` pools one metric of several runs' metrics (in memory or read back from
metrics.json) and keeps each run's value beside it; each evaluation task pools its own block with it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["metric_at", "paired_difference", "pooled", "pooled_entry"]


def _floats(values: Iterable) -> np.ndarray:
    """float64 array of ``values`` with None/NaN dropped."""
    v = np.asarray([np.nan if x is None else x for x in values], dtype=np.float64).ravel()
    return v[~np.isnan(v)]


def _summarise(v: np.ndarray, level: float) -> dict[str, float | int]:
    n = int(v.size)
    nan = math.nan
    if n == 0:
        return {"mean": nan, "sd": nan, "n": 0, "ci_low": nan, "ci_high": nan}
    with np.errstate(invalid="ignore"):
        mean = float(np.mean(v))
        if n < 2 or not np.isfinite(v).all():
            return {"mean": mean, "sd": nan, "n": n, "ci_low": nan, "ci_high": nan}
        sd = float(np.std(v, ddof=1))
    from scipy.stats import t

    half = float(t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n)
    return {"mean": mean, "sd": sd, "n": n, "ci_low": mean - half, "ci_high": mean + half}


def pooled(values: Iterable, level: float = 0.95) -> dict[str, float | int]:
    """``{mean, sd, n, ci_low, ci_high}`` of one metric over seeds (NaN dropped, sd with ddof=1,
    Student-t CI of the mean at ``level``)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return _summarise(_floats(values), level)


def paired_difference(a: Iterable, b: Iterable, level: float = 0.95) -> dict[str, float | int]:
    """``pooled`` of the per-seed differences ``a − b`` of two methods trained on the same seeds
    (``a[i]`` and ``b[i]`` share seed i). A seed where either value is NaN is dropped. The paired
    CI is narrower than comparing two ``pooled`` CIs when the seeds move both methods alike."""
    x = np.asarray([np.nan if v is None else v for v in a], dtype=np.float64).ravel()
    y = np.asarray([np.nan if v is None else v for v in b], dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"paired_difference: a and b need one value per seed each, got {x.size} and {y.size}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    keep = ~(np.isnan(x) | np.isnan(y))
    with np.errstate(invalid="ignore"):
        d = x[keep] - y[keep]
    return _summarise(d[~np.isnan(d)], level)  # inf − inf is NaN: dropped as undefined


# --------------------------------------------------------------------------- several runs' metrics


def _num(x: Any) -> float:
    """A metric value from memory or from metrics.json (null -> NaN, "inf"/"-inf" -> ±inf)."""
    if x is None:
        return math.nan
    if isinstance(x, str):
        return {"inf": math.inf, "-inf": -math.inf}.get(x, math.nan)
    return float(x)


def metric_at(m: dict, *path: str) -> Any:
    """``m[path[0]][path[1]]...``, or None where a key is missing."""
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


def pooled_entry(runs: list[dict], path: tuple[str, ...], ci_path: tuple[str, ...] | None = None) -> dict[str, Any]:
    """:func:`pooled` of one metric over the runs, plus each run's value (and bootstrap CI, if any)
    as ``per_checkpoint``: ``[{"value", "ci"}]`` in run order."""
    values = [_num(metric_at(m, *path)) for m in runs]
    e: dict[str, Any] = pooled(values)
    e["per_checkpoint"] = [{"value": v, "ci": _ci(metric_at(m, *ci_path)) if ci_path else None}
                           for v, m in zip(values, runs)]
    return e
