"""The sentence table: one row per distinct sentence with its PLL and eta_LM, cached; the join to a manifest.

eta_LM (sample-specific debiasing paper, section 2.4) estimates the class
probability rho(c_x) of a text x from its language-model likelihood:

    eta(x) = min(a * p_LM(x)^k, eta_max) = min(a * exp(k * log p_LM(x)), eta_max)

with log p_LM(x) the pseudo-log-likelihood (paper: a = 0.2, k = 0.35, PLL
summed over the word pieces, scored by CXR-BERT). Those a, k fit CXR-BERT's PLL
scale only: ``score_manifest`` fits a, k to how often each sentence's meaning occurs
in the corpus by default (label-free, ``medclr.lm.eta_fit``); given a, k override the fit.

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
import time
from pathlib import Path

import numpy as np
import pandas as pd

from medclr.errors import MedclrError
from medclr.files import atomic_path

log = logging.getLogger(__name__)

DEFAULT_A = 0.2
DEFAULT_K = 0.35
DEFAULT_ETA_MAX = 0.5
NORMS = ("sum", "mean")
META_KEY = b"medclr_eta"
TABLE_COLUMNS = ["sentence_hash", "sentence", "count", "n_tokens", "n_scored", "pll", "pll_per_token", "eta"]
_COMPAT = ("fingerprint", "pll_variant", "long", "max_length")  # a change here invalidates cached PLLs


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


def score_manifest(
    manifest: pd.DataFrame,
    model,
    tokenizer,
    out: str | os.PathLike,
    *,
    model_name: str = "",
    split: str | None = None,
    a: float | None = None,
    k: float | None = None,
    eta_fit: str = "meaning",
    fit_split: str | None = "train",
    sampling: dict | None = None,
    norm: str = "sum",
    eta_max: float = DEFAULT_ETA_MAX,
    word_l2r: bool = False,
    long: str = "window",
    batch_size: int = 64,
    max_batch_tokens: int = 32768,
    rescore: bool = False,
    checkpoint_every: int = 20000,
    device=None,
    progress: bool = True,
) -> dict:
    """Score every distinct sentence of ``manifest`` not yet in ``out`` and (re)write the table there.

    The table is rewritten after each block of ``checkpoint_every`` new
    sentences, so an interrupted run resumes where it stopped. Returns a summary dict.

    a, k: given together, eta = a * p^k with them; else ``eta_fit`` calibrates eta
    (``medclr.lm.eta_fit``): ``"meaning"`` (default) maps the LM's probability of the sentence's
    meaning to how often that meaning occurs among the ``fit_split`` rows' pairs (drawn as
    ``sampling`` says: ``medclr.data.pairs.pair_probabilities`` keywords, default uniform),
    ``"sentence"`` fits a, k on the sentence's own PLL, ``"paper"`` takes 0.2 and 0.35.
    """
    from medclr.lm.eta_fit import check_eta_choice, eta_of_table, resolve_eta_params
    from medclr.lm.load import model_fingerprint
    from medclr.lm.pll import model_max_length, score_sentences

    check_eta_choice(eta_fit, a, k, eta_max)
    log_p([0.0], [1], norm)  # validates norm
    t0 = time.monotonic()
    st = manifest_sentences(manifest, split)
    if st.empty:
        raise MedclrError("the manifest has no sentences to score")
    first = st.drop_duplicates("sentence_hash")
    counts = st["sentence_hash"].value_counts()
    current = pd.DataFrame({"sentence_hash": first["sentence_hash"].to_numpy(),
                            "sentence": first["sentence"].to_numpy()})
    current["count"] = counts.reindex(current["sentence_hash"]).to_numpy().astype(np.int64)
    max_length = int(model_max_length(model, tokenizer))
    compat = {"fingerprint": model_fingerprint(model, tokenizer), "pll_variant": "word_l2r" if word_l2r else "original",
              "long": long, "max_length": max_length}
    out = Path(out)
    cached = pd.DataFrame(columns=["sentence_hash", "n_tokens", "n_scored", "pll"])
    extra = pd.DataFrame(columns=TABLE_COLUMNS)
    if out.exists() and not rescore:
        old, old_meta = read_eta_table(out)
        changed = [key for key in _COMPAT if old_meta.get(key) != compat[key]]
        if changed:
            log.warning("%s was scored with a different %s; rescoring all sentences", out, " and ".join(changed))
        else:
            cached = old[["sentence_hash", "n_tokens", "n_scored", "pll"]]
            extra = old[~old["sentence_hash"].isin(current["sentence_hash"])].assign(count=0)
    known = current.merge(cached, on="sentence_hash", how="left")
    todo = np.flatnonzero(known["pll"].isna().to_numpy())
    log.info("%d sentences (%d distinct) in the manifest; %d already scored, %d to score with %s",
             len(st), len(current), len(current) - len(todo), len(todo), model_name or type(model).__name__)
    meta = {**compat, "model": model_name, "norm": norm, "eta_max": eta_max}

    def write(table):
        done = table[table["pll"].notna()]
        full = pd.concat([done, extra], ignore_index=True) if len(extra) else done
        full = full.astype({"count": "int64", "n_tokens": "int64", "n_scored": "int64", "pll": "float64"})
        params = resolve_eta_params(full, manifest, method=eta_fit, a=a, k=k, split=fit_split, norm=norm,
                                    sampling=sampling, eta_max=eta_max)
        full = full.copy()
        full["pll_per_token"] = full["pll"] / np.maximum(full["n_scored"].to_numpy(), 1)
        full["eta"], n_clip = eta_of_table(full, params, norm=norm, eta_max=eta_max)
        write_eta_table(full, out, {**meta, "a": params.get("a"), "k": params.get("k"), "n_clipped": n_clip,
                                    "eta_params": params})
        return full, n_clip, params

    for b0 in range(0, len(todo), max(1, checkpoint_every)):
        block = todo[b0 : b0 + checkpoint_every]
        res = score_sentences(known["sentence"].to_numpy()[block].tolist(), model, tokenizer, batch_size,
                              word_l2r=word_l2r, long=long, max_batch_tokens=max_batch_tokens, device=device,
                              progress=progress)
        known.loc[block, "pll"] = res.pll
        known.loc[block, "n_tokens"] = res.n_tokens
        known.loc[block, "n_scored"] = res.n_scored
        if b0 + checkpoint_every < len(todo):
            write(known)
    table, n_clip, params = write(known)
    fit = params["fit"]
    if "error" not in fit:
        log.info("eta (%s fit) against the meaning frequency of the %s rows' pairs: Spearman(log p, frequency) %.2f "
                 "over %d pairs, %d meanings; mean eta %.3g vs mean frequency %.3g; %s", fit["method"], fit["split"],
                 fit["spearman_logp_target"], fit["n_pairs"], fit["n_keys"], fit["mean_eta"], fit["mean_target"],
                 "used" if params["source"] == fit["method"] else f"not used: eta from a, k ({params['source']})")
    if n_clip:
        log.warning("%d sentences had eta > eta_max = %g and were clipped", n_clip, eta_max)
    eta = table.loc[table["count"] > 0, "eta"]
    summary = {"out": str(out), "sentences": len(st), "distinct": len(current), "scored": int(len(todo)),
               "cached": int(len(current) - len(todo)), "clipped": n_clip, "seconds": round(time.monotonic() - t0, 1),
               "a": params.get("a"), "k": params.get("k"), "eta_params": params["source"],
               "eta_quantiles": {q: float(eta.quantile(q)) for q in (0.0, 0.1, 0.5, 0.9, 1.0)}}
    log.info("wrote %s: %d sentences; eta median %.3g (10%%: %.3g, 90%%: %.3g); %.1f s", out, len(table),
             summary["eta_quantiles"][0.5], summary["eta_quantiles"][0.1], summary["eta_quantiles"][0.9],
             summary["seconds"])
    return summary


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
    if missing not in ("raise", "nan"):
        raise MedclrError(f"missing={missing!r}; expected 'raise' or 'nan'")
    st = manifest_sentences(manifest, split)
    values = _lookup(eta_table, column).reindex(st["sentence_hash"]).to_numpy(dtype=np.float64)
    lost = np.isnan(values)
    if missing == "raise" and lost.any():
        i = int(np.flatnonzero(lost)[0])
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
