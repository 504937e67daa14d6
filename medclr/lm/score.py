"""`medclr lm score`: every distinct sentence of a manifest scored by a masked LM and written as the eta table.

The pipeline above the table (``medclr.lm.eta``: the formula and the file) and the calibration
(``medclr.lm.eta_fit``): PLLs cached by model fingerprint, eta calibrated, the table rewritten
every couple of minutes of scoring (``save_every_s``) so an interrupted run resumes where it stopped.

``--out`` is replaced only when it holds this command's own earlier output, a readable eta table
(:func:`is_eta_table`: its PLLs are the cache, ``rescore`` ignores them), or with ``overwrite``; any other
file there is refused in one line, before the model loads (:func:`check_out`, ``medclr.files.refuse_foreign``).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from medclr.errors import MedclrError
from medclr.files import refuse_foreign
from medclr.lm.eta import (
    DEFAULT_ETA_MAX,
    PLL_COMPAT_KEYS,
    TABLE_COLUMNS,
    log_p,
    manifest_sentences,
    read_eta_table,
    write_eta_table,
)
from medclr.lm.eta_fit import check_eta_choice, eta_of_table, resolve_eta_params
from medclr.lm.pll import MAX_PIECES

log = logging.getLogger(__name__)


def is_eta_table(path: Path) -> bool:
    """Whether ``path`` holds an eta table ``medclr lm score`` wrote (readable, with every column of
    ``TABLE_COLUMNS``): its own earlier output, which it resumes and replaces."""
    try:
        read_eta_table(path)
    except MedclrError:
        return False
    return True


def check_out(out: str | os.PathLike, overwrite: bool = False) -> None:
    """Refuse, in one line, an ``--out`` that is a folder, or a file that is not an eta table, unless ``overwrite``
    (then the file is replaced; an eta table there is the cache either way)."""
    out = Path(out)
    if out.is_dir():
        raise MedclrError(f"--out {out}: is a folder; expected the eta table's file path (e.g. eta.parquet)")
    refuse_foreign(out, is_eta_table, "an eta table of `medclr lm score`", overwrite=overwrite)


def with_short_forms(current: pd.DataFrame) -> pd.DataFrame:
    """The table's sentences plus the short forms training may show in their place (``data.short_form``:
    "Small left apical pneumothorax." -> "Pneumothorax."), count 0 where the manifest does not hold them: a
    step's eta is that of the sentence it shows. A few dozen distinct strings, so scoring them costs seconds."""
    from medclr.data.hard_negatives import short_forms
    from medclr.data.text import sentence_hash

    known = set(current["sentence"])
    forms = sorted({f for s in current["sentence"] for f in short_forms(s)} - known)
    if not forms:
        return current
    add = pd.DataFrame({"sentence_hash": [sentence_hash(f) for f in forms], "sentence": forms,
                        "count": np.zeros(len(forms), dtype=np.int64)})
    return pd.concat([current, add], ignore_index=True)


def describe_eta(params: dict, eta_max: float) -> str:
    """One line for the log: which eta the table holds, and how well the LM's log p follows how often the
    sentences' meanings occur (the fit ``resolve_eta_params`` makes every time, also when its eta is not used:
    a weak Spearman says the LM ranks meanings poorly whichever eta is chosen)."""
    source, fit = params["source"], params["fit"]
    if source == "meaning":
        what = (f"eta from the meaning map (--eta-fit meaning, DCL-eta_rule): mean eta {fit['mean_eta']:.3g} over "
                f"the {fit['split']} pairs, their meanings' mean frequency {fit['mean_target']:.3g}")
    else:
        origin = {"paper": "the paper's a, k (--eta-fit paper)", "given": "the a, k given (--a/--k)",
                  "sentence": f"a, k fitted to how often the {fit.get('split')} pairs' meanings occur "
                              "(--eta-fit sentence)"}[source]
        what = f"eta = min({params['a']:.3g} * p^{params['k']:.3g}, {eta_max:g}): {origin}"
    if "error" in fit:
        return what
    return (f"{what}; the LM's log p against how often the {fit['split']} pairs' meanings occur: Spearman "
            f"{fit['spearman_logp_target']:.2f} ({fit['n_pairs']} pairs, {fit['n_keys']} meanings)")


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
    eta_fit: str = "paper",
    fit_split: str | None = "train",
    sampling: dict | None = None,
    norm: str = "sum",
    eta_max: float = DEFAULT_ETA_MAX,
    word_l2r: bool = False,
    long: str = "window",
    batch_size: int = 64,
    max_batch_tokens: int = 32768,
    rescore: bool = False,
    overwrite: bool = False,
    save_every_s: float = 120.0,
    block: int = 512,
    max_pieces: int = MAX_PIECES,
    device=None,
    progress: bool | str = "auto",
) -> dict:
    """Score every distinct sentence of ``manifest`` not yet in ``out`` and (re)write the table there.

    Sentences are scored in blocks of ``block``; after every forward pass, the table is rewritten with the
    sentences finished so far once ``save_every_s`` seconds have passed since the last write, so an interrupted
    run loses about that much work (plus the sentences the pass under way had begun) and resumes where it
    stopped. ``max_pieces`` bounds the work one sentence can cost
    (``medclr.lm.pll.MAX_PIECES``). Returns a summary dict.

    ``out`` is an eta table from an earlier run (its PLLs are reused unless ``rescore``), or absent; any other
    file there is refused (:func:`check_out`) unless ``overwrite``, which replaces it.

    a, k: given together, eta = a * p^k with them; else ``eta_fit`` says (``medclr.lm.eta_fit``):
    ``"paper"`` (default) takes the paper's a = 0.2 and k = 0.35; ``"meaning"`` is medclr's own rule-key
    calibration (DCL-eta_rule), which maps the LM's probability of the sentence's rule-read meaning to how
    often that meaning occurs among the ``fit_split`` rows' pairs (drawn as ``sampling`` says:
    ``medclr.data.pairs.pair_probabilities`` keywords, default uniform); ``"sentence"`` fits a, k on the
    sentence's own PLL to that same rule-key frequency.
    """
    from medclr.lm.load import model_fingerprint
    from medclr.lm.pll import model_max_length, score_sentences

    check_eta_choice(eta_fit, a, k, eta_max)
    log_p([0.0], [1], norm)  # validates norm
    out = Path(out)
    check_out(out, overwrite)
    t0 = time.monotonic()
    st = manifest_sentences(manifest, split)
    if st.empty:
        raise MedclrError("the manifest has no sentences to score")
    first = st.drop_duplicates("sentence_hash")
    counts = st["sentence_hash"].value_counts()
    current = pd.DataFrame({"sentence_hash": first["sentence_hash"].to_numpy(),
                            "sentence": first["sentence"].to_numpy()})
    current["count"] = counts.reindex(current["sentence_hash"]).to_numpy().astype(np.int64)
    distinct = len(current)
    current = with_short_forms(current)
    max_length = int(model_max_length(model, tokenizer))
    compat = {"fingerprint": model_fingerprint(model, tokenizer), "pll_variant": "word_l2r" if word_l2r else "original",
              "long": long, "max_length": max_length}
    cached = pd.DataFrame(columns=["sentence_hash", "n_tokens", "n_scored", "pll"])
    extra = pd.DataFrame(columns=TABLE_COLUMNS)
    old = None
    if not rescore and out.is_file():
        try:
            old, old_meta = read_eta_table(out)
        except MedclrError:  # not an eta table: check_out let it pass only with overwrite, which replaces it
            old = None
    if old is not None:
        changed = [key for key in PLL_COMPAT_KEYS if old_meta.get(key) != compat[key]]
        if changed:
            log.warning("%s was scored with a different %s; rescoring all sentences", out, " and ".join(changed))
        else:
            cached = old[["sentence_hash", "n_tokens", "n_scored", "pll"]]
            extra = old[~old["sentence_hash"].isin(current["sentence_hash"])].assign(count=0)
    known = current.merge(cached, on="sentence_hash", how="left")
    todo = np.flatnonzero(known["pll"].isna().to_numpy())
    log.info("%d sentences (%d distinct) in the manifest and %d short forms of them; %d already scored, %d to score "
             "with %s", len(st), distinct, len(current) - distinct, len(current) - len(todo), len(todo),
             model_name or type(model).__name__)
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

    from medclr.progress import progress_bar

    last_save = time.monotonic()
    pending = len(todo)
    with progress_bar(total=len(todo), unit="sent", desc="PLL", enabled=progress) as bar:
        for b0 in range(0, len(todo), max(1, block)):
            rows = todo[b0 : b0 + block]
            reported = 0

            def scored(idx, pll, n_tokens, n_scored, rows=rows):
                # called after every forward pass, so the clock is checked inside a block too: a block of long
                # sentences (a large --max-pieces) runs for minutes, and a kill must not lose more than
                # save_every_s of finished sentences
                nonlocal last_save, pending, reported
                r = rows[idx]
                known.loc[r, "pll"] = pll
                known.loc[r, "n_tokens"] = n_tokens
                known.loc[r, "n_scored"] = n_scored
                bar.update(len(r))
                pending -= len(r)
                reported += len(r)
                if pending and time.monotonic() - last_save >= save_every_s:
                    write(known)
                    last_save = time.monotonic()

            res = score_sentences(known["sentence"].to_numpy()[rows].tolist(), model, tokenizer, batch_size,
                                  word_l2r=word_l2r, long=long, max_batch_tokens=max_batch_tokens, device=device,
                                  progress=False, max_pieces=max_pieces, on_scored=scored)
            # the returned values are the block's record; on_scored only made the interim saves possible
            known.loc[rows, "pll"] = res.pll
            known.loc[rows, "n_tokens"] = res.n_tokens
            known.loc[rows, "n_scored"] = res.n_scored
            bar.update(len(rows) - reported)
            pending -= len(rows) - reported
    table, n_clip, params = write(known)
    log.info("%s", describe_eta(params, eta_max))
    if n_clip:
        log.warning("%d sentences had eta > eta_max = %g and were clipped", n_clip, eta_max)
    eta = table.loc[table["count"] > 0, "eta"]
    summary = {"out": str(out), "sentences": len(st), "distinct": distinct, "short_forms": len(current) - distinct,
               "scored": int(len(todo)),
               "cached": int(len(current) - len(todo)), "clipped": n_clip, "seconds": round(time.monotonic() - t0, 1),
               "a": params.get("a"), "k": params.get("k"), "eta_params": params["source"],
               "eta_quantiles": {q: float(eta.quantile(q)) for q in (0.0, 0.1, 0.5, 0.9, 1.0)}}
    log.info("wrote %s: %d sentences; eta median %.3g (10%%: %.3g, 90%%: %.3g); %.1f s", out, len(table),
             summary["eta_quantiles"][0.5], summary["eta_quantiles"][0.1], summary["eta_quantiles"][0.9],
             summary["seconds"])
    return summary
