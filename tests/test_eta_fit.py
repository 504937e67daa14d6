"""The label-free fit of eta = a * p^k to how often a sentence's meaning occurs (medclr.lm.eta_fit)."""

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from medclr.errors import MedclrError

N_TRAIN, N_VAL = 60, 15
# meaning groups, each written two ways (paraphrases share a meaning key); commonest first
GROUPS = [("No pneumothorax.", "There is no pneumothorax."),
          ("The lungs are clear.", "Lungs are clear."),
          ("No pleural effusion.", "There is no pleural effusion."),
          ("Small left pleural effusion.", "There is a small left pleural effusion."),
          ("Right lower lobe pneumonia.", "There is right lower lobe pneumonia."),
          ("Mild cardiomegaly.", "Cardiomegaly is mild."),
          ("Large right pneumothorax.", "There is a large right pneumothorax."),
          ("Pulmonary edema.", "There is pulmonary edema."),
          ("Sternotomy wires.", "Sternotomy wires are seen."),
          ("Left basilar atelectasis.", "There is left basilar atelectasis.")]


def _corpus(seed=0):
    """A manifest (train + validate rows, phantom-style ground truth) and its eta table (PLL given).

    Group g is drawn with probability ~ 1 / (g + 1); its two wordings share the meaning key, and their
    PLLs fall with log rank plus noise (the LM ranks common meanings higher, imperfectly)."""
    from medclr.data.text import sentence_hash

    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(GROUPS) + 1)
    rows = []
    for _ in range(N_TRAIN + N_VAL):
        m = int(rng.integers(1, 4))
        rows.append([GROUPS[g][int(rng.integers(2))] for g in rng.choice(len(GROUPS), size=m, replace=False,
                                                                        p=p / p.sum())])
    rows[-1] = rows[-1] + ["Only in a validation report."]  # must not count: not a training row
    splits = ["train"] * N_TRAIN + ["validate"] * N_VAL
    manifest = pd.DataFrame({"index": np.arange(len(rows)), "split": splits, "sentences": rows,
                             "latent_class": [f"c{i % 7}" for i in range(len(rows))],
                             "latent_class_prob": rng.uniform(0.001, 0.3, len(rows))})
    sents = [s for group in GROUPS for s in group] + ["Only in a validation report."]
    pll = np.array([-2.0 - 3.0 * np.log1p(j // 2) + rng.normal(0, 1.0) for j in range(len(sents))])
    n_scored = np.array([len(s.split()) + 1 for s in sents])
    table = pd.DataFrame({"sentence_hash": [sentence_hash(s) for s in sents], "sentence": sents,
                          "count": 1, "n_tokens": n_scored, "n_scored": n_scored, "pll": pll,
                          "pll_per_token": pll / n_scored, "eta": 0.0})
    return manifest, table


def _reference_pairs(manifest, table, norm="sum"):
    """Independent: (log p, meaning frequency, pair weight) per training (report, sentence), by loops."""
    from medclr.data.hard_negatives import meaning_key

    train = [list(r) for r in manifest.loc[manifest["split"] == "train", "sentences"]]
    mass = defaultdict(float)
    for row in train:
        for s in row:
            mass[meaning_key(s)] += 1.0 / (len(train) * len(row))
    by_sentence = table.set_index("sentence")
    x, y, w = [], [], []
    for row in train:
        for s in row:
            lp = by_sentence.loc[s, "pll"] / (by_sentence.loc[s, "n_scored"] if norm == "mean" else 1.0)
            x.append(lp)
            y.append(mass[meaning_key(s)])
            w.append(1.0 / (len(train) * len(row)))
    return np.array(x), np.array(y), np.array(w)


def _profile_fit(x, y, w):
    """Brute force: for each k on a fine grid the best a is closed form, sum(w y e^{kx}) / sum(w e^{2kx})."""
    best = None
    for k in np.linspace(0.0, 5.0, 50001):
        e = np.exp(k * (x - x.mean()))
        a = np.sum(w * y * e) / np.sum(w * e * e)
        sse = np.sum(w * (a * e - y) ** 2)
        if best is None or sse < best[0]:
            best = (sse, a * np.exp(-k * x.mean()), k)
    return best[1], best[2]


def test_meaning_keys_pool_paraphrases_and_keep_polarity_and_side():
    from medclr.data.hard_negatives import meaning_key

    for one, other in GROUPS:
        assert meaning_key(one) == meaning_key(other), (one, other)
    keys = [meaning_key(g[0]) for g in GROUPS]
    assert len(set(keys)) == len(GROUPS)
    assert meaning_key("No pneumothorax.") == "-pneumothorax"
    assert meaning_key("Large right pneumothorax.") == "+pneumothorax:right"
    assert meaning_key("Heart size is normal.") == meaning_key("No cardiomegaly.") == "-cardiomegaly"
    assert meaning_key("The lungs are clear.") == meaning_key("No acute cardiopulmonary process.") == "normal"
    assert meaning_key("Possible left pleural effusion.").startswith("?")


def _pava(x, y, w):
    """Brute-force weighted isotonic regression (pool adjacent violators over x sorted, ties pooled first)."""
    order = np.lexsort((y, x))
    xs, ys, ws = x[order], y[order], w[order]
    blocks = []  # [sum w*y, sum w, count]
    for xv in np.unique(xs):  # equal x share one value
        m = xs == xv
        blocks.append([float(np.sum(ws[m] * ys[m])), float(np.sum(ws[m])), int(m.sum())])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            a, b = blocks.pop(), blocks.pop()
            blocks.append([a[0] + b[0], a[1] + b[1], a[2] + b[2]])
    fitted = np.concatenate([np.full(c, sw / w_) for sw, w_, c in blocks])
    out = np.empty_like(fitted)
    out[order] = fitted
    return out


@pytest.mark.parametrize("norm", ["sum", "mean"])
def test_meaning_fit_is_isotonic_least_squares_on_the_pooled_likelihood(norm):
    """Pooled log p = log sum of p over the wordings of a meaning (by loops); the map = brute-force PAVA."""
    from medclr.data.hard_negatives import meaning_key
    from medclr.lm.eta_fit import eta_of_table, fit_eta_meaning

    manifest, table = _corpus()
    fit = fit_eta_meaning(table, manifest, norm=norm)
    x_sent, y, w = _reference_pairs(manifest, table, norm)
    by_key = {}
    for s, pll, n in zip(table["sentence"], table["pll"], table["n_scored"]):
        by_key.setdefault(meaning_key(s), []).append(pll / (n if norm == "mean" else 1.0))
    pooled = {k: np.log(np.sum(np.exp(v))) for k, v in by_key.items()}
    train = [s for row in manifest.loc[manifest["split"] == "train", "sentences"] for s in row]
    x = np.array([pooled[meaning_key(s)] for s in train])
    want = _pava(x, y, w)
    got = np.interp(x, fit["knots_log_p"], fit["knots_eta"])
    np.testing.assert_allclose(got, want, rtol=1e-9)
    # the weighted mean is preserved: mean eta over the drawn pairs = mean meaning frequency
    assert fit["mean_eta"] == pytest.approx(fit["mean_target"], rel=1e-9)
    assert fit["mean_target"] == pytest.approx(np.sum(w * y) / np.sum(w), rel=1e-12)
    assert (fit["n_pairs"], fit["n_reports"], fit["split"], fit["method"]) == (len(y), N_TRAIN, "train", "meaning")
    # the table's eta: every wording of one meaning gets the same eta
    eta, clipped = eta_of_table(table, {"source": "meaning", "fit": fit}, norm=norm, eta_max=0.5)
    assert clipped == 0
    for one, other in GROUPS:
        i, j = table.index[table["sentence"] == one][0], table.index[table["sentence"] == other][0]
        assert eta[i] == eta[j]


@pytest.mark.parametrize("norm", ["sum", "mean"])
def test_sentence_fit_matches_linear_space_least_squares(norm):
    from medclr.lm.eta_fit import fit_eta_sentence

    manifest, table = _corpus()
    fit = fit_eta_sentence(table, manifest, norm=norm)
    x, y, w = _reference_pairs(manifest, table, norm)
    a, k = _profile_fit(x, y, w)
    assert fit["k"] == pytest.approx(k, abs=1e-3) and fit["a"] == pytest.approx(a, rel=2e-3)
    assert 0 < fit["k"] and not fit["k_zero"]
    assert (fit["n_pairs"], fit["n_reports"], fit["split"]) == (len(y), N_TRAIN, "train")
    assert fit["mean_target"] == pytest.approx(np.sum(w * y) / np.sum(w), rel=1e-12)
    assert fit["method"] == "sentence" and fit["norm"] == norm
    # linear space: the mean eta over the drawn pairs is close to the mean frequency (a log fit is not)
    assert 0.8 < fit["mean_eta"] / fit["mean_target"] < 1.25


def test_fit_is_label_free(tmp_path):
    from medclr.lm.calibrate import calibrate
    from medclr.lm.eta_fit import fit_eta_meaning, resolve_eta_params

    manifest, table = _corpus()
    fit = fit_eta_meaning(table, manifest)
    bare = manifest.drop(columns=["latent_class", "latent_class_prob"])
    shuffled = manifest.assign(latent_class=manifest["latent_class"].sample(frac=1, random_state=1).to_numpy(),
                               latent_class_prob=np.random.default_rng(2).permutation(manifest["latent_class_prob"]))
    assert fit_eta_meaning(table, bare) == fit == fit_eta_meaning(table, shuffled)
    assert resolve_eta_params(table, bare) == resolve_eta_params(table, shuffled)
    # calibrate (which has the ground truth) reports the same label-free fit beside the paper's a, k
    res = calibrate(manifest, table, tmp_path / "cal", eta_meta={"norm": "sum"})
    assert res["rule_fit"] == fit
    v = res["variants"]
    assert v["rule"]["mean_eta"] == pytest.approx(fit["mean_eta"])  # same map, same pairs, same weights
    sentence = res["sentence_fit"]
    assert (v["sentence_fit"]["a"], v["sentence_fit"]["k"]) == (sentence["a"], sentence["k"])
    assert (v["paper"]["a"], v["paper"]["k"]) == (0.2, 0.35)
    assert set(v["paper"]["eta_quantiles"]) == {"0.01", "0.1", "0.5", "0.9", "0.99"}


def test_zero_slope_and_fallback(caplog):
    from medclr.lm.eta_fit import fit_eta_meaning, fit_eta_sentence, resolve_eta_params

    manifest, table = _corpus()
    inverted = table.assign(pll=-table["pll"] - 100.0)  # an LM that ranks rare meanings first
    caplog.clear()
    resolve_eta_params(table, manifest, method="meaning")
    assert "ranks the sentences' meanings weakly" not in caplog.text
    resolve_eta_params(inverted, manifest)  # the default (the paper's a, k) uses no fit: nothing to warn about
    assert "ranks the sentences' meanings weakly" not in caplog.text
    resolve_eta_params(inverted, manifest, method="meaning")  # a fit that is used, from an LM that ranks the
    assert "ranks the sentences' meanings weakly" in caplog.text and "--eta-a/--eta-k" in caplog.text  # wrong way
    fit = fit_eta_sentence(inverted, manifest)
    _, y, w = _reference_pairs(manifest, inverted)
    assert fit["k"] == pytest.approx(0.0, abs=1e-9) and fit["k_zero"]
    assert fit["a"] * np.exp(fit["k"] * -100.0) == pytest.approx(np.sum(w * y) / np.sum(w), rel=1e-6)
    flat = table.assign(pll=-5.0, sentence="Same meaning.")  # no spread in log p: no fit, the paper's a, k
    caplog.clear()
    rec = resolve_eta_params(flat, manifest, method="meaning")
    assert (rec["a"], rec["k"], rec["source"]) == (0.2, 0.35, "paper") and "error" in rec["fit"]
    assert "no meaning fit of eta" in caplog.text
    with pytest.raises(MedclrError, match="both a and k"):
        resolve_eta_params(table, manifest, a=0.1)
    with pytest.raises(MedclrError, match="eta fit"):
        resolve_eta_params(table, manifest, method="cxr-bert")
    # no train rows: the fit falls back to all rows
    assert fit_eta_meaning(table, manifest.assign(split="test"))["split"] == "all"
    assert resolve_eta_params(table, manifest, method="sentence")["source"] == "sentence"
    # the default is the paper's a, k; the meaning fit is still made and kept on record
    rec = resolve_eta_params(table, manifest)
    assert (rec["a"], rec["k"], rec["source"]) == (0.2, 0.35, "paper") and rec["fit"] == fit_eta_meaning(table, manifest)


# the short forms of _corpus's sentences (medclr.data.hard_negatives.short_forms) that it does not hold itself:
# score_manifest adds them to the table with count 0
SHORT_FORMS = ["Atelectasis.", "Cardiomegaly.", "Pleural effusion.", "Pneumonia.", "Pneumothorax."]


def _fake_pll(sentence: str) -> float:
    """The fake LM's PLL of a sentence _corpus does not hold (its short forms): -len, so -10 to -17."""
    return -float(len(sentence))


@pytest.fixture
def fake_scorer(monkeypatch):
    """score_manifest without a model: PLL from the table of _corpus, else :func:`_fake_pll` (a fake LM with a
    fixed fingerprint)."""
    import medclr.lm.load
    import medclr.lm.pll

    _, table = _corpus()
    pll = table.set_index("sentence")

    def score(sentences, *args, **kwargs):
        known = [s in pll.index for s in sentences]
        n = np.array([pll.loc[s, "n_scored"] if k else len(s.split()) + 1 for s, k in zip(sentences, known)])
        p = np.array([pll.loc[s, "pll"] if k else _fake_pll(s) for s, k in zip(sentences, known)])
        return SimpleNamespace(pll=p, n_tokens=n, n_scored=n)

    monkeypatch.setattr(medclr.lm.pll, "score_sentences", score)
    monkeypatch.setattr(medclr.lm.pll, "model_max_length", lambda model, tok: 128)
    monkeypatch.setattr(medclr.lm.load, "model_fingerprint", lambda model, tok: "fake")


def _with_short_forms(table):
    """_corpus's table plus SHORT_FORMS as score_manifest adds them: count 0, the fake LM's PLL."""
    from medclr.data.text import sentence_hash

    n = np.array([len(f.split()) + 1 for f in SHORT_FORMS])
    pll = np.array([_fake_pll(f) for f in SHORT_FORMS])
    add = pd.DataFrame({"sentence_hash": [sentence_hash(f) for f in SHORT_FORMS], "sentence": SHORT_FORMS,
                        "count": 0, "n_tokens": n, "n_scored": n, "pll": pll, "pll_per_token": pll / n, "eta": 0.0})
    return pd.concat([table, add], ignore_index=True)


def test_score_default_is_the_papers_eta_on_every_row_short_forms_included(fake_scorer, tmp_path):
    """By default the table's eta is the paper's, min(0.2 * exp(0.35 * pll), eta_max), on every row, the short
    forms (count 0) included; given a, k (cached PLLs: eta only) make it min(a * exp(k * pll), eta_max)."""
    from medclr.data.hard_negatives import short_forms
    from medclr.lm.eta import read_eta_table
    from medclr.lm.score import score_manifest

    manifest, table = _corpus()
    held = set(table["sentence"])
    assert sorted({f for s in held for f in short_forms(s)} - held) == SHORT_FORMS
    out = tmp_path / "eta.parquet"
    summary = score_manifest(manifest, None, None, out, progress=False)
    got, meta = read_eta_table(out)
    assert summary["eta_params"] == "paper" and (summary["a"], summary["k"]) == (0.2, 0.35)
    assert (meta["a"], meta["k"], meta["eta_params"]["source"], meta["eta_max"]) == (0.2, 0.35, "paper", 0.5)
    # every sentence of the manifest with its count, and the short forms with count 0
    counts = got.set_index("sentence")["count"]
    assert sorted(got["sentence"]) == sorted(held | set(SHORT_FORMS)) and got["sentence_hash"].is_unique
    assert (counts[SHORT_FORMS] == 0).all() and (counts.drop(SHORT_FORMS) > 0).all()
    assert counts.drop(SHORT_FORMS).sum() == sum(len(r) for r in manifest["sentences"])
    np.testing.assert_array_equal(counts[SHORT_FORMS].index, SHORT_FORMS)
    np.testing.assert_allclose(got.set_index("sentence").loc[SHORT_FORMS, "pll"], [_fake_pll(f) for f in SHORT_FORMS])
    np.testing.assert_allclose(got["eta"], np.minimum(0.2 * np.exp(0.35 * got["pll"]), 0.5), rtol=1e-12, atol=0)
    assert got["eta"].max() < 0.5 and meta["n_clipped"] == 0
    # given a, k: some rows clip at eta_max (pll > 20 log(0.5 / 0.9) = -11.8), short forms among both kinds
    summary = score_manifest(manifest, None, None, out, a=0.9, k=0.05, progress=False)
    got, meta = read_eta_table(out)
    assert summary["scored"] == 0 and (meta["a"], meta["k"], meta["eta_params"]["source"]) == (0.9, 0.05, "given")
    raw = 0.9 * np.exp(0.05 * got["pll"].to_numpy())
    np.testing.assert_allclose(got["eta"], np.minimum(raw, 0.5), rtol=1e-12, atol=0)
    short = got["count"].to_numpy() == 0
    assert (raw[short] > 0.5).any() and (raw[short] < 0.5).any() and (raw[~short] > 0.5).any()
    assert meta["n_clipped"] == summary["clipped"] == int((raw > 0.5).sum())


def _eta_line(caplog) -> str:
    """The one log line of score_manifest that says which eta the table holds."""
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eta")]
    assert len(lines) == 1, lines
    caplog.clear()
    return lines[0]


def test_score_records_fit_and_override_wins(fake_scorer, tmp_path, caplog):
    from medclr.lm.eta import read_eta_table, write_eta_table
    from medclr.lm.eta_fit import fit_eta_meaning
    from medclr.lm.score import score_manifest

    caplog.set_level("INFO", logger="medclr.lm.score")
    manifest, table = _corpus()
    out = tmp_path / "eta.parquet"
    summary = score_manifest(manifest, None, None, out, eta_fit="meaning", progress=False)
    got, meta = read_eta_table(out)
    fit = fit_eta_meaning(_with_short_forms(table), manifest)  # the table's sentences: the short forms too
    # the log says which eta was written, and the fit's Spearman whether its eta is used or not
    spearman = (f"the LM's log p against how often the train pairs' meanings occur: Spearman "
                f"{fit['spearman_logp_target']:.2f} ({fit['n_pairs']} pairs, {fit['n_keys']} meanings)")
    assert _eta_line(caplog) == (f"eta from the meaning map (--eta-fit meaning, DCL-eta_rule): mean eta "
                                 f"{fit['mean_eta']:.3g} over the train pairs, their meanings' mean frequency "
                                 f"{fit['mean_target']:.3g}; {spearman}")
    assert meta["eta_params"] == {"source": "meaning", "fit": fit}  # JSON round trip, exact floats
    assert meta["a"] is None and summary["eta_params"] == "meaning"
    from medclr.lm.eta_fit import eta_of_table

    np.testing.assert_allclose(got["eta"], eta_of_table(got, meta["eta_params"], norm="sum", eta_max=0.5)[0])
    # the metadata survives write_eta_table / read_eta_table unchanged
    write_eta_table(got, tmp_path / "copy.parquet", meta)
    assert read_eta_table(tmp_path / "copy.parquet")[1] == meta
    # given a, k win over the fit (cached PLLs: eta only); the fit stays on record
    score_manifest(manifest, None, None, out, a=0.1, k=0.5, progress=False)
    assert _eta_line(caplog) == f"eta = min(0.1 * p^0.5, 0.5): the a, k given (--a/--k); {spearman}"
    got, meta = read_eta_table(out)
    assert (meta["a"], meta["k"], meta["eta_params"]["source"]) == (0.1, 0.5, "given")
    assert meta["eta_params"]["fit"] == fit
    np.testing.assert_allclose(got["eta"], np.minimum(0.1 * np.exp(0.5 * got["pll"]), 0.5))
    summary = score_manifest(manifest, None, None, out, progress=False)  # the default: the paper's a, k
    assert _eta_line(caplog) == f"eta = min(0.2 * p^0.35, 0.5): the paper's a, k (--eta-fit paper); {spearman}"
    got, meta = read_eta_table(out)
    assert (meta["a"], meta["k"], meta["eta_params"]["source"], summary["eta_params"]) == (0.2, 0.35, "paper", "paper")
    assert meta["eta_params"]["fit"] == fit
    score_manifest(manifest, None, None, out, eta_fit="sentence", progress=False)
    meta = read_eta_table(out)[1]["eta_params"]
    assert _eta_line(caplog).startswith(f"eta = min({meta['a']:.3g} * p^{meta['k']:.3g}, 0.5): a, k fitted to how "
                                        "often the train pairs' meanings occur (--eta-fit sentence); the LM's log p")
    with pytest.raises(MedclrError, match="both a and k"):
        score_manifest(manifest, None, None, out, k=0.5, progress=False)


def test_score_refuses_a_foreign_out_unless_overwrite_and_resumes_its_own(fake_scorer, tmp_path):
    """--out is replaced only when it holds an eta table (the cache, resumed) or with overwrite: any other file there
    (text, or a parquet without the table's columns) is refused in one line and left byte for byte as it was, with
    rescore too (rescore ignores the cached PLLs of our own table, it does not replace someone else's file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from medclr.lm.eta import read_eta_table
    from medclr.lm.score import score_manifest

    manifest, table = _corpus()
    n = len(_with_short_forms(table))
    out = tmp_path / "eta.parquet"
    pq.write_table(pa.table({"sentence": ["mine"], "value": [1.0]}), out)
    other_parquet = out.read_bytes()
    for held in (b"notes I keep here\n", other_parquet):
        out.write_bytes(held)
        for rescore in (False, True):
            with pytest.raises(MedclrError) as err:
                score_manifest(manifest, None, None, out, rescore=rescore, progress=False)
            msg = str(err.value)
            assert "\n" not in msg and msg.startswith(f"--out {out}: the file there is not an eta table")
            assert "pass --overwrite to replace it" in msg
            assert out.read_bytes() == held
    # overwrite replaces it: nothing is read from it, every sentence scored
    summary = score_manifest(manifest, None, None, out, overwrite=True, progress=False)
    assert (summary["scored"], summary["cached"]) == (n, 0) and len(read_eta_table(out)[0]) == n
    # our own table: resumed (nothing to score), with overwrite too; rescore scores all again and replaces it
    for overwrite in (False, True):
        summary = score_manifest(manifest, None, None, out, overwrite=overwrite, progress=False)
        assert (summary["scored"], summary["cached"]) == (0, n)
    summary = score_manifest(manifest, None, None, out, rescore=True, progress=False)
    assert (summary["scored"], summary["cached"]) == (n, 0) and len(read_eta_table(out)[0]) == n
    # a folder is never an eta table's path, overwrite or not
    (tmp_path / "folder").mkdir()
    for overwrite in (False, True):
        with pytest.raises(MedclrError, match="is a folder"):
            score_manifest(manifest, None, None, tmp_path / "folder", overwrite=overwrite, progress=False)


def test_training_reads_fitted_and_old_tables(fake_scorer, tmp_path):
    from medclr.data.text import sentence_hash
    from medclr.lm.eta import read_eta_table, write_eta_table
    from medclr.lm.score import score_manifest
    from medclr.training.data import _eta_from_table

    manifest, _ = _corpus()
    out = tmp_path / "eta.parquet"
    score_manifest(manifest, None, None, out, eta_fit="meaning", progress=False)  # a fitted table (DCL-eta_rule)
    table, meta = read_eta_table(out)
    old = tmp_path / "old.parquet"  # a table written before the fit: a, k, no eta_params
    write_eta_table(table.assign(eta=np.minimum(0.2 * np.exp(0.35 * table["pll"]), 0.5)), old,
                    {k: v for k, v in meta.items() if k != "eta_params"} | {"a": 0.2, "k": 0.35})
    rows = manifest[manifest["split"] == "train"]
    # every text a step may show: the rows' sentences and their short forms (all in the table)
    texts = sorted({s for r in rows["sentences"] for s in r} | set(SHORT_FORMS))
    by_hash = table.set_index("sentence_hash")
    cfg = {"data": {"eta": str(out), "eta_a": None, "eta_k": None, "eta_max": 0.99}}
    fitted = _eta_from_table(rows, cfg, texts)
    assert list(fitted) == texts
    np.testing.assert_array_equal([fitted[t] for t in texts], by_hash.loc[[sentence_hash(t) for t in texts], "eta"])
    assert read_eta_table(old)[1].get("eta_params") is None
    for path in (out, old):  # data.eta_a / eta_k override whatever the table holds
        cfg = {"data": {"eta": str(path), "eta_a": 0.05, "eta_k": 0.1, "eta_max": 0.99}}
        got = _eta_from_table(rows, cfg, texts)
        want = np.minimum(0.05 * np.exp(0.1 * by_hash.loc[[sentence_hash(t) for t in texts], "pll"].to_numpy()), 0.99)
        np.testing.assert_allclose([got[t] for t in texts], want, rtol=1e-12)
