"""The label-free fit of eta = a * p^k to the corpus's sentence frequencies (medclr.lm.eta_fit)."""

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from medclr.errors import MedclrError

N_TRAIN, N_VAL = 60, 15


def _corpus(seed=0):
    """A manifest (train + validate rows, phantom-style ground truth) and its eta table (PLL given).

    Sentence j occurs in about 60 / (j + 1) training reports; its PLL falls with log rank plus noise,
    so log frequency is roughly linear in PLL with a slope the fit must recover exactly (closed form)."""
    from medclr.data.text import sentence_hash

    rng = np.random.default_rng(seed)
    vocab = [f"Finding number {j} is seen." for j in range(40)]
    p = 1.0 / np.arange(1, 41)
    rows = []
    for _ in range(N_TRAIN + N_VAL):
        m = int(rng.integers(1, 5))
        rows.append([vocab[j] for j in rng.choice(40, size=m, replace=False, p=p / p.sum())])
    rows[-1] = rows[-1] + ["Only in a validation report."]  # must not count: not a training row
    splits = ["train"] * N_TRAIN + ["validate"] * N_VAL
    manifest = pd.DataFrame({"index": np.arange(len(rows)), "split": splits, "sentences": rows,
                             "latent_class": [f"c{i % 7}" for i in range(len(rows))],
                             "latent_class_prob": rng.uniform(0.001, 0.3, len(rows))})
    sents = vocab + ["Only in a validation report."]
    pll = np.array([-2.0 - 3.0 * np.log1p(j) + rng.normal(0, 1.0) for j in range(len(sents))])
    n_scored = np.array([len(s.split()) + 1 for s in sents])
    table = pd.DataFrame({"sentence_hash": [sentence_hash(s) for s in sents], "sentence": sents,
                          "count": 1, "n_tokens": n_scored, "n_scored": n_scored, "pll": pll,
                          "pll_per_token": pll / n_scored, "eta": 0.0})
    return manifest, table


def _reference_fit(manifest, table, norm="sum"):
    """Independent: Counter over the train rows, np.polyfit with weights sqrt(count) (squared residuals x count)."""
    train = manifest[manifest["split"] == "train"]
    counts = Counter(s for row in train["sentences"] for s in row)
    n_reports = sum(1 for row in train["sentences"] if len(row))
    by_sentence = table.set_index("sentence")
    sents = sorted(counts)
    n = np.array([counts[s] for s in sents], dtype=np.float64)
    x = by_sentence.loc[sents, "pll"].to_numpy(np.float64)
    if norm == "mean":
        x = x / by_sentence.loc[sents, "n_scored"].to_numpy(np.float64)
    y = np.log(n / n_reports)
    k, log_a = np.polyfit(x, y, 1, w=np.sqrt(n))
    resid = y - (log_a + k * x)
    ybar = np.sum(n * y) / n.sum()
    r2 = 1.0 - np.sum(n * resid**2) / np.sum(n * (y - ybar) ** 2)
    return np.exp(log_a), k, r2, len(sents), int(n.sum()), n_reports


@pytest.mark.parametrize("norm", ["sum", "mean"])
def test_fit_matches_weighted_polyfit(norm):
    from medclr.lm.eta_fit import fit_eta_corpus

    manifest, table = _corpus()
    fit = fit_eta_corpus(table, manifest, norm=norm)
    a, k, r2, n_sent, n_pairs, n_reports = _reference_fit(manifest, table, norm)
    assert fit["a"] == pytest.approx(a, rel=1e-9) and fit["k"] == pytest.approx(k, rel=1e-9)
    assert fit["r2"] == pytest.approx(r2, rel=1e-9) and 0 < fit["k"] and not fit["k_clamped"]
    assert (fit["n_sentences"], fit["n_pairs"], fit["n_reports"], fit["split"]) == (n_sent, n_pairs, n_reports, "train")
    assert fit["method"] == "corpus" and fit["norm"] == norm


def test_fit_is_label_free(tmp_path):
    from medclr.lm.calibrate import calibrate
    from medclr.lm.eta_fit import fit_eta_corpus, resolve_eta_params

    manifest, table = _corpus()
    fit = fit_eta_corpus(table, manifest)
    bare = manifest.drop(columns=["latent_class", "latent_class_prob"])
    shuffled = manifest.assign(latent_class=manifest["latent_class"].sample(frac=1, random_state=1).to_numpy(),
                               latent_class_prob=np.random.default_rng(2).permutation(manifest["latent_class_prob"]))
    assert fit_eta_corpus(table, bare) == fit == fit_eta_corpus(table, shuffled)
    assert resolve_eta_params(table, bare) == resolve_eta_params(table, shuffled)
    # calibrate (which has the ground truth) reports the same label-free fit beside the paper's a, k
    res = calibrate(manifest, table, tmp_path / "cal", eta_meta={"norm": "sum"})
    assert res["corpus_fit"] == fit
    v = res["eta_variants"]
    assert (v["corpus_fit"]["a"], v["corpus_fit"]["k"]) == (fit["a"], fit["k"])
    assert (v["paper"]["a"], v["paper"]["k"]) == (0.2, 0.35)
    assert set(v["paper"]["eta_quantiles"]) == {"0.01", "0.1", "0.5", "0.9", "0.99"}


def test_clamp_and_fallback():
    from medclr.lm.eta_fit import fit_eta_corpus, resolve_eta_params

    manifest, table = _corpus()
    inverted = table.assign(pll=-table["pll"] - 100.0)  # an LM that ranks rare sentences first
    fit = fit_eta_corpus(inverted, manifest)
    train = manifest[manifest["split"] == "train"]
    n = np.array(list(Counter(s for row in train["sentences"] for s in row).values()), dtype=np.float64)
    assert fit["k"] == 0.0 and fit["k_clamped"]
    assert fit["a"] == pytest.approx(np.exp(np.sum(n * np.log(n / N_TRAIN)) / n.sum()), rel=1e-9)
    flat = table.assign(pll=-5.0)  # no spread in log p: no fit, the paper's a, k (recorded)
    a, k, rec = resolve_eta_params(flat, manifest)
    assert (a, k, rec["source"]) == (0.2, 0.35, "paper") and "error" in rec["corpus_fit"]
    with pytest.raises(MedclrError, match="both a and k"):
        resolve_eta_params(table, manifest, a=0.1)
    with pytest.raises(MedclrError, match="eta fit"):
        resolve_eta_params(table, manifest, method="cxr-bert")
    # no train rows: the fit falls back to all rows
    assert fit_eta_corpus(table, manifest.assign(split="test"))["split"] == "all"


@pytest.fixture
def fake_scorer(monkeypatch):
    """score_manifest without a model: PLL from the table of _corpus (a fake LM with a fixed fingerprint)."""
    import medclr.lm.load
    import medclr.lm.pll

    _, table = _corpus()
    pll = table.set_index("sentence")

    def score(sentences, *args, **kwargs):
        n = pll.loc[sentences, "n_scored"].to_numpy()
        return SimpleNamespace(pll=pll.loc[sentences, "pll"].to_numpy(), n_tokens=n, n_scored=n)

    monkeypatch.setattr(medclr.lm.pll, "score_sentences", score)
    monkeypatch.setattr(medclr.lm.pll, "model_max_length", lambda model, tok: 128)
    monkeypatch.setattr(medclr.lm.load, "model_fingerprint", lambda model, tok: "fake")


def test_score_records_fit_and_override_wins(fake_scorer, tmp_path):
    from medclr.lm.eta import read_eta_table, score_manifest, write_eta_table
    from medclr.lm.eta_fit import fit_eta_corpus

    manifest, table = _corpus()
    out = tmp_path / "eta.parquet"
    summary = score_manifest(manifest, None, None, out, progress=False)
    got, meta = read_eta_table(out)
    fit = fit_eta_corpus(table, manifest)
    assert meta["eta_params"] == {"source": "corpus", "corpus_fit": fit}  # JSON round trip, exact floats
    assert (meta["a"], meta["k"]) == (summary["a"], summary["k"]) == (fit["a"], fit["k"])
    np.testing.assert_allclose(got["eta"], np.minimum(fit["a"] * np.exp(fit["k"] * got["pll"]), 0.5), rtol=1e-12)
    # the metadata survives write_eta_table / read_eta_table unchanged
    write_eta_table(got, tmp_path / "copy.parquet", meta)
    assert read_eta_table(tmp_path / "copy.parquet")[1] == meta
    # given a, k win over the fit (cached PLLs: eta only); the fit stays on record
    score_manifest(manifest, None, None, out, a=0.1, k=0.5, progress=False)
    got, meta = read_eta_table(out)
    assert (meta["a"], meta["k"], meta["eta_params"]["source"]) == (0.1, 0.5, "given")
    assert meta["eta_params"]["corpus_fit"] == fit
    np.testing.assert_allclose(got["eta"], np.minimum(0.1 * np.exp(0.5 * got["pll"]), 0.5))
    score_manifest(manifest, None, None, out, eta_fit="paper", progress=False)
    assert read_eta_table(out)[1]["a"] == 0.2
    with pytest.raises(MedclrError, match="both a and k"):
        score_manifest(manifest, None, None, out, k=0.5, progress=False)


def test_training_reads_fitted_and_old_tables(fake_scorer, tmp_path):
    from medclr.lm.eta import read_eta_table, score_manifest, write_eta_table
    from medclr.training.data import _eta_from_table

    manifest, _ = _corpus()
    out = tmp_path / "eta.parquet"
    score_manifest(manifest, None, None, out, progress=False)
    table, meta = read_eta_table(out)
    old = tmp_path / "old.parquet"  # a table written before the fit: a, k, no eta_params
    write_eta_table(table.assign(eta=np.minimum(0.2 * np.exp(0.35 * table["pll"]), 0.5)), old,
                    {k: v for k, v in meta.items() if k != "eta_params"} | {"a": 0.2, "k": 0.35})
    rows = manifest[manifest["split"] == "train"]
    by_hash = table.set_index("sentence_hash")
    cfg = {"data": {"eta": str(out), "eta_a": None, "eta_k": None, "eta_max": 0.99}}
    fitted = _eta_from_table(rows, cfg)
    from medclr.data.text import sentence_hash

    want = [by_hash.loc[[sentence_hash(s) for s in r], "eta"].to_numpy(np.float32) for r in rows["sentences"]]
    assert all(np.array_equal(g, w) for g, w in zip(fitted, want))
    assert read_eta_table(old)[1].get("eta_params") is None
    for path in (out, old):  # data.eta_a / eta_k override whatever the table holds
        cfg = {"data": {"eta": str(path), "eta_a": 0.05, "eta_k": 0.1, "eta_max": 0.99}}
        got = _eta_from_table(rows, cfg)
        want = [np.minimum(0.05 * np.exp(0.1 * by_hash.loc[[sentence_hash(s) for s in r], "pll"].to_numpy()), 0.99)
                .astype(np.float32) for r in rows["sentences"]]
        assert all(np.allclose(g, w, rtol=1e-6) for g, w in zip(got, want))
