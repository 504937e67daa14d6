"""The sentence table: one row per distinct sentence with its PLL and eta_LM, cached; the join to a manifest.

eta_LM (sample-specific debiasing paper, section 2.4) estimates the class
probability rho(c_x) of a text x from its language-model likelihood:

    eta(x) = min(a * p_LM(x)^k, eta_max) = min(a * exp(k * log p_LM(x)), eta_max)

with log p_LM(x) the pseudo-log-likelihood (paper: a = 0.2, k = 0.35, PLL
summed over the word pieces, scored by CXR-BERT). Those a, k fit CXR-BERT's PLL
scale: on a small domain LM they give a small eta. ``medclr lm score`` (``medclr.lm.score``) writes the paper's
eta by default; ``--eta-fit meaning`` writes medclr's own DCL-eta_rule (``medclr.lm.eta_fit``); given a, k win.

* ``norm="sum"`` (default, the paper): log p = PLL. Longer sentences get a
  smaller eta; in reports a long sentence usually describes a specific, rarer
  finding, so this is usually the intended direction.
* ``norm="mean"``: log p = PLL / number of scored pieces (length-normalised):
  eta then reflects how predictable the words are, not how many there are.
* ``eta_max`` (default 0.5) clips eta below 1: the debiased loss divides by
  1 - eta, and the paper's generalisation bound grows as 1/(1 - eta_max)^2. As
  PLL <= 0, eta <= a, so with a = 0.2 the clip never binds; it protects fitted
  or hand-set a > eta_max. The number of clipped sentences is logged and kept
  in the table's metadata.

The table (``eta.parquet``) has the columns of :data:`TABLE_COLUMNS`; its
parquet metadata (key ``medclr_eta``) records the model, its fingerprint, the
PLL variant, norm, eta_max, a and k where eta = a * p^k (None under the meaning calibration),
and ``eta_params``: what eta is and its fit (``medclr.lm.eta_fit``) with its statistics. It is keyed by
``medclr.data.text.sentence_hash`` (the same hash the manifest side uses).
Scoring again with the same model only scores sentences not yet in the table;
changing a, k, norm or eta_max only recomputes eta.

Joining: the eta used in training is per (manifest row, sentence).
:func:`join_eta` returns, for each manifest row, a float64 array aligned with
that row's ``sentences`` list; :func:`eta_long` returns the same as a long
table (``index``, ``position``, ``sentence_hash``, ``eta``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from medclr.errors import MedclrError
from medclr.files import atomic_path

if TYPE_CHECKING:  # pandas is imported where a table is read or built: `medclr --help` and the formula need none
    import pandas as pd

log = logging.getLogger(__name__)

DEFAULT_A = 0.2
DEFAULT_K = 0.35
DEFAULT_ETA_MAX = 0.5
NORMS = ("sum", "mean")
META_KEY = b"medclr_eta"
TABLE_COLUMNS = ["sentence_hash", "sentence", "count", "n_tokens", "n_scored", "pll", "pll_per_token", "eta"]
PLL_COMPAT_KEYS = ("fingerprint", "pll_variant", "long", "max_length")  # a change here invalidates cached PLLs


def log_p(pll, n_scored=None, norm: str = "sum") -> np.ndarray:
    """log p_LM(x) from PLL: the PLL itself (``sum``) or PLL per scored piece (``mean``)."""
    pll = np.asarray(pll, dtype=np.float64)
    if norm == "sum":
        return pll
    if norm == "mean":
        if n_scored is None:
            raise MedclrError("norm='mean' needs the number of scored tokens")
        return pll / np.maximum(np.asarray(n_scored, dtype=np.float64), 1.0)
    raise MedclrError(f"norm={norm!r}; expected one of {NORMS}")


def check_eta_override(a: float | None, k: float | None, eta_max: float = DEFAULT_ETA_MAX) -> None:
    """The one rule for a user's a, k (``--eta-a/--eta-k``, ``data.eta_a/eta_k``): both or neither, then valid;
    eta_max valid either way."""
    if (a is None) != (k is None):
        raise MedclrError("give both a and k (eta = a * p^k), or neither to use the eta fit")
    check_eta_params(DEFAULT_A if a is None else a, DEFAULT_K if k is None else k, eta_max)


def check_eta_params(a: float, k: float, eta_max: float) -> None:
    if not (a > 0 and np.isfinite(a)):
        raise MedclrError(f"a={a}; expected a positive number (paper: 0.2)")
    if not (k >= 0 and np.isfinite(k)):
        raise MedclrError(f"k={k}; expected a number >= 0 (paper: 0.35)")
    if not 0 < eta_max < 1:
        raise MedclrError(f"eta_max={eta_max}; expected 0 < eta_max < 1 (the loss divides by 1 - eta)")


def eta_from_pll(pll, n_scored=None, *, a: float = DEFAULT_A, k: float = DEFAULT_K, norm: str = "sum",
                 eta_max: float = DEFAULT_ETA_MAX) -> np.ndarray:
    """eta = min(a * exp(k * log p), eta_max), elementwise (float64)."""
    check_eta_params(a, k, eta_max)
    return np.minimum(a * np.exp(k * log_p(pll, n_scored, norm)), eta_max)


def manifest_sentences(manifest: pd.DataFrame, split: str | None = None) -> pd.DataFrame:
    """Long table of the manifest's sentences: ``index``, ``position``, ``sentence``, ``sentence_hash``."""
    import pandas as pd

    from medclr.data.text import sentence_hash

    if "sentences" not in manifest:
        raise MedclrError("manifest has no 'sentences' column (make it with `medclr prepare` or `medclr phantom`)")
    rows = manifest if split in (None, "all") else manifest[manifest["split"] == split]
    if split not in (None, "all") and rows.empty:
        raise MedclrError(f"manifest has no rows with split == '{split}' (splits: {sorted(set(manifest['split']))})")
    idx = manifest["index"] if "index" in manifest else pd.Series(np.arange(len(manifest)), index=manifest.index)
    records = []
    for i, sents in zip(idx.loc[rows.index], rows["sentences"]):
        for pos, s in enumerate(sents if sents is not None else []):
            if not isinstance(s, str) or not s.strip():
                raise MedclrError(f"manifest row {int(i)} sentence {pos} is empty; the sentence splitter should "
                                  "never produce one (re-run `medclr prepare`)")
            records.append((int(i), pos, s, sentence_hash(s)))
    return pd.DataFrame(records, columns=["index", "position", "sentence", "sentence_hash"])


def read_eta_table(path: str | os.PathLike) -> tuple[pd.DataFrame, dict]:
    """(table, metadata) of an eta.parquet written by ``medclr lm score``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise MedclrError(f"{path}: eta table not found (make one with `medclr lm score`)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise MedclrError(f"{path}: not a parquet eta table ({exc})") from None
    missing = [c for c in TABLE_COLUMNS if c not in table.column_names]
    if missing:
        raise MedclrError(f"{path}: eta table lacks columns {missing}")
    meta = json.loads((table.schema.metadata or {}).get(META_KEY, b"{}"))
    return table.to_pandas(), meta


def write_eta_table(table: pd.DataFrame, path: str | os.PathLike, meta: dict) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t = pa.Table.from_pandas(table[TABLE_COLUMNS], preserve_index=False)
    t = t.replace_schema_metadata({**(t.schema.metadata or {}), META_KEY: json.dumps(meta).encode()})
    with atomic_path(path) as tmp:
        pq.write_table(t, tmp)
    return path


def apply_eta(table: pd.DataFrame, *, a: float, k: float, norm: str, eta_max: float) -> tuple[pd.DataFrame, int]:
    """(table with ``pll_per_token`` and ``eta`` recomputed, number of sentences clipped at eta_max)."""
    out = table.copy()
    out["pll_per_token"] = out["pll"] / np.maximum(out["n_scored"].to_numpy(), 1)
    raw = a * np.exp(k * log_p(out["pll"], out["n_scored"], norm))
    out["eta"] = eta_from_pll(out["pll"], out["n_scored"], a=a, k=k, norm=norm, eta_max=eta_max)
    return out, int((raw > eta_max).sum())


def _lookup(eta_table: pd.DataFrame, column: str) -> pd.Series:
    if column not in eta_table:
        raise MedclrError(f"eta table has no column '{column}' (columns: {list(eta_table.columns)})")
    return eta_table.drop_duplicates("sentence_hash").set_index("sentence_hash")[column]


def eta_long(manifest: pd.DataFrame, eta_table: pd.DataFrame, column: str = "eta", missing: str = "raise",
             split: str | None = None) -> pd.DataFrame:
    """Long table ``index``, ``position``, ``sentence_hash``, ``eta`` (one row per manifest sentence).

    ``missing="raise"``: a sentence absent from the table is an error (score
    the manifest first); ``"nan"``: it gets NaN. ``column`` picks another table
    column (e.g. ``pll``) under the name ``eta``.
    """
    import pandas as pd

    if missing not in ("raise", "nan"):
        raise MedclrError(f"missing={missing!r}; expected 'raise' or 'nan'")
    st = manifest_sentences(manifest, split)
    values = _lookup(eta_table, column).reindex(st["sentence_hash"]).to_numpy(dtype=np.float64)
    lost = np.isnan(values)
    if missing == "raise" and lost.any():
        i = int(np.flatnonzero(lost)[0])
        absent = ~st["sentence_hash"].isin(eta_table["sentence_hash"]).to_numpy()
        if not absent[lost].any():  # every one is in the table, with no value: a damaged table, not a stale one
            raise MedclrError(f"the eta table holds no {column} value (NaN) for {int(lost.sum())} manifest sentences "
                              f"(first: row {st['index'].iat[i]}, {st['sentence'].iat[i]!r}): it is damaged; "
                              "rescore it (`medclr lm score --rescore`)")
        raise MedclrError(f"{int(lost.sum())} manifest sentences are not in the eta table (first: row "
                          f"{st['index'].iat[i]}, {st['sentence'].iat[i]!r}); run `medclr lm score` on this manifest")
    return pd.DataFrame({"index": st["index"].to_numpy(), "position": st["position"].to_numpy(),
                         "sentence_hash": st["sentence_hash"].to_numpy(), "eta": values})


def join_eta(manifest: pd.DataFrame, eta_table: pd.DataFrame, column: str = "eta",
             missing: str = "raise") -> list[np.ndarray]:
    """Per manifest row (in manifest order), a float64 array of eta aligned with its ``sentences`` list."""
    long = eta_long(manifest, eta_table, column, missing)
    values = long["eta"].to_numpy()
    lengths = np.array([len(s) if s is not None else 0 for s in manifest["sentences"]])
    return np.split(values, np.cumsum(lengths)[:-1]) if len(lengths) else []
