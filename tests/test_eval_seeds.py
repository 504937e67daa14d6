"""The seeds protocol of `medclr eval` (several --checkpoint) and the zero-shot prompt check.

* ``medclr.evaluation.seeds.pooled`` / ``paired_difference`` against the formulas written out with numpy
  and scipy (mean, sample sd, Student-t CI of the mean), NaN dropped;
* the CLI with two tiny random checkpoints (the fixtures of ``tests/test_eval_runner.py``): one
  directory per checkpoint, each a complete single run, and a pooled metrics.json whose means and
  sds are those of the per-checkpoint metrics;
* the prompt cosine and the sign check recomputed by brute force through the model's text tower
  and the encoded images;
* one clear line for a checkpoint that does not exist.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from medclr.evaluation.seeds import paired_difference, pooled
from tests.test_eval_runner import make_checkpoint, medclr_main, write_tree

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
KEYS = ("AUC", "ACC", "CNR", "mIoU", "Recall", "MedR")


def by_hand(v, level=0.95):
    v = np.asarray([x for x in v if x is not None and not np.isnan(x)], dtype=np.float64)
    n = v.size
    mean, sd = v.mean(), np.std(v, ddof=1)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / np.sqrt(n)
    return mean, sd, n, mean - half, mean + half


def check(got, want):
    assert got["n"] == want[2]
    np.testing.assert_allclose([got["mean"], got["sd"], got["ci_low"], got["ci_high"]],
                               [want[0], want[1], want[3], want[4]], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- pure functions


def test_pooled_is_mean_sample_sd_and_student_t_ci():
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 10):
        v = rng.normal(0.7, 0.05, n)
        check(pooled(v), by_hand(v))
        check(pooled(list(v), level=0.9), by_hand(v, 0.9))
    v = [0.61, np.nan, 0.66, None, 0.7]  # NaN/None dropped, n counts the rest
    check(pooled(v), by_hand(v))
    assert pooled(v)["n"] == 3
    # n = 3: t_{0.975, 2} = 4.303 (a textbook value), by hand
    e = pooled([1.0, 2.0, 3.0])
    assert e["sd"] == pytest.approx(1.0) and e["ci_high"] - 2.0 == pytest.approx(4.302652729911275 / math.sqrt(3))
    one = pooled([0.8, np.nan])
    assert one["n"] == 1 and one["mean"] == 0.8 and all(math.isnan(one[k]) for k in ("sd", "ci_low", "ci_high"))
    none = pooled([np.nan, None])
    assert none["n"] == 0 and all(math.isnan(none[k]) for k in ("mean", "sd", "ci_low", "ci_high"))
    assert pooled([])["n"] == 0
    inf = pooled([1.0, math.inf])  # a degenerate CNR: the mean is inf, the spread undefined
    assert inf["mean"] == math.inf and math.isnan(inf["sd"]) and inf["n"] == 2
    with pytest.raises(ValueError):
        pooled([1.0, 2.0], level=95)


def test_paired_difference_is_pooled_of_the_per_seed_differences():
    rng = np.random.default_rng(1)
    seed_effect = rng.normal(0, 0.05, 6)  # the seed moves both methods alike
    a = 0.80 + seed_effect + rng.normal(0, 0.005, 6)
    b = 0.75 + seed_effect + rng.normal(0, 0.005, 6)
    d = paired_difference(a, b)
    check(d, by_hand(a - b))
    assert d["ci_low"] > 0  # the paired CI sees the gap ...
    assert pooled(a)["ci_low"] < pooled(b)["ci_high"]  # ... the two unpaired CIs overlap
    a2, b2 = a.copy(), b.copy()
    a2[1], b2[4] = np.nan, np.nan  # a seed missing on either side is dropped from both
    keep = np.array([0, 2, 3, 5])
    check(paired_difference(a2, b2), by_hand(a[keep] - b[keep]))
    assert paired_difference(a2, b2)["n"] == 4
    assert paired_difference([0.5], [0.4])["n"] == 1 and math.isnan(paired_difference([0.5], [0.4])["sd"])
    with pytest.raises(ValueError, match="one value per seed"):
        paired_difference([1.0, 2.0], [1.0])


def test_prompt_diagnostics_on_toy_vectors():
    from medclr.evaluation.diagnostics import prompt_diagnostics, sign_word

    e = np.eye(4)
    prompts = {"A": (e[0], e[1]), "B": (e[0] + e[2], e[0]), "C": (e[0], e[0])}
    # images labelled 1 for A lean along e0 (= A's zero-shot direction e0 - e1): agrees; for B they
    # lean against e2: flipped; C has identical prompts (no direction): NaN
    x = np.stack([e[0] - e[2], e[0] - e[2], e[1] + e[2], e[1] + e[2]]) * 3.0  # normalised inside
    y = np.array([[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, np.nan]], dtype=np.float64)
    d = prompt_diagnostics(prompts, x, y, ["A", "B", "C"])
    assert d["prompt_cosine"] == pytest.approx({"A": 0.0, "B": 1 / math.sqrt(2), "C": 1.0})
    u = (e[0] - e[2]) / math.sqrt(2) - (e[1] + e[2]) / math.sqrt(2)
    assert d["sign_check"]["A"] == pytest.approx((e[0] - e[1]) @ u / (math.sqrt(2) * np.linalg.norm(u)))
    assert d["sign_check"]["A"] > 0 and d["sign_check"]["B"] < 0 and math.isnan(d["sign_check"]["C"])
    assert [sign_word(d["sign_check"][c]) for c in "ABC"] == ["agrees", "**FLIPPED**", "–"]
    only_pos = prompt_diagnostics(prompts, x, np.ones((4, 3)), ["A", "B", "C"])  # no image labelled 0
    assert all(math.isnan(v) for v in only_pos["sign_check"].values())


def test_pool_runs_reads_metrics_json_values():
    """The pooling also works on metrics read back from JSON (null = NaN, "inf" strings)."""
    from medclr.evaluation.seeds_run import pool_runs, run_dir_names

    runs = [{"summary": {"CNR": 1.0, "AUC": None}, "grounding": {"CNR": {"macro": 1.0}, "n_phrases": 3}},
            {"summary": {"CNR": "inf", "AUC": None}, "grounding": {"CNR": {"macro": "inf"}, "n_phrases": 3}},
            {"summary": {"CNR": 2.0, "AUC": None}, "grounding": {"CNR": {"macro": None}, "n_phrases": 3}}]
    p = pool_runs(runs)
    assert p["summary"]["CNR"]["mean"] == math.inf and p["summary"]["AUC"]["n"] == 0
    assert p["grounding"]["CNR"]["n"] == 2 and [q["value"] for q in p["grounding"]["CNR"]["per_checkpoint"]][0] == 1.0
    assert "zeroshot" not in p and "retrieval" not in p
    assert run_dir_names(["runs/s0/", "a/seed 1", "runs/s0"]) == ["1_s0", "2_seed_1", "3_s0"]


# --------------------------------------------------------------------------- the CLI on tiny checkpoints


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    d = tmp_path_factory.mktemp("seeds")
    root, texts = write_tree(d / "mimic", n_test=16, n_train=12, seed=1, n_categories=3)
    a = make_checkpoint(d / "seed0", texts, head="cosine", seed=0)
    b = make_checkpoint(d / "seed1", texts, head="cosine", seed=1)
    return d, root, a, b


def test_cli_several_checkpoints_pools_the_per_checkpoint_metrics(two, capsys):
    d, root, a, b = two
    out = d / "R"
    assert medclr_main("eval", "--checkpoint", a, "--checkpoint", b, "--data", root, "--out", out,
                       "--n-boot", 50, "--no-figures") == 0
    assert "pooled over 2 checkpoints" in capsys.readouterr().out
    runs = [json.loads((out / name / "metrics.json").read_text()) for name in ("1_seed0", "2_seed1")]
    for name in ("1_seed0", "2_seed1"):  # each a complete single run
        assert (out / name / "report.md").is_file() and (out / name / "phrases.csv").is_file()
    assert runs[0]["checkpoint"] == str(a) and runs[1]["checkpoint"] == str(b)
    m = json.loads((out / "metrics.json").read_text())
    assert m["n_checkpoints"] == 2 and [c["dir"] for c in m["checkpoints"]] == ["1_seed0", "2_seed1"]
    assert set(m["summary"]) == set(KEYS) and set(m["summary_sd"]) == set(KEYS)
    for k in KEYS:
        v = [r["summary"][k] for r in runs]
        assert m["summary"][k] == pytest.approx(np.mean(v), rel=1e-12), k
        assert m["summary_sd"][k] == pytest.approx(np.std(v, ddof=1), rel=1e-9, abs=1e-15), k
        assert m["pooled"]["summary"][k]["n"] == 2
    assert runs[0]["summary"]["AUC"] != runs[1]["summary"]["AUC"]  # two seeds, two models
    z = m["pooled"]["zeroshot"]
    for c in z["classes"]:
        e = z["per_class"][c]["AUC"]
        v = [r["zeroshot"]["per_class"][c]["AUC"] for r in runs]
        check(e, by_hand(v))
        assert [p["value"] for p in e["per_checkpoint"]] == v
        assert [p["ci"] for p in e["per_checkpoint"]] == [r["zeroshot"]["per_class"][c]["AUC_CI"] for r in runs]
        assert z["prompt_cosine"][c]["mean"] == pytest.approx(np.mean([r["zeroshot"]["prompt_cosine"][c] for r in runs]))
        s = [r["zeroshot"]["sign_check"][c] for r in runs]
        assert z["sign_check"][c]["n_flipped"] == sum(x < 0 for x in s)
    check(m["pooled"]["grounding"]["CNR"], by_hand([r["grounding"]["CNR"]["macro"] for r in runs]))
    check(m["pooled"]["retrieval"]["Recall"], by_hand([r["retrieval"]["Recall"] for r in runs]))
    report = (out / "report.md").read_text()
    for needle in ("2 checkpoints", "mean ± sd", "95 % CI of the mean", "[1_seed0/report.md](1_seed0/report.md)",
                   "Prompt check", "FLIPPED in", "Table 3", "Table 4", "not MIMIC numbers"):
        assert needle in report, needle
    assert "### Prompt check" in (out / "1_seed0" / "report.md").read_text()
    # the pooled metrics.json works with --compare, as a single run's does
    from medclr.eval_report import read_summary

    assert read_summary(out / "metrics.json")["AUC"] == pytest.approx(m["summary"]["AUC"])


def _brute_force(model, prompts, enc, y):
    """Prompt cosine and sign check per class, recomputed from the text tower's raw outputs."""
    from medclr.evaluation.zeroshot import class_text_embedding

    out = {}
    x = enc.glob / np.linalg.norm(enc.glob, axis=1, keepdims=True)
    for j, (c, sides) in enumerate(prompts.items()):
        raw = {s: model.model.text_encoder.encode(sides[s], normalize=False).float().numpy() for s in sides}
        p, n = class_text_embedding(raw["positive"]), class_text_embedding(raw["negative"])
        img = x[y[:, j] == 1].mean(0) - x[y[:, j] == 0].mean(0)
        out[c] = (p @ n, (p - n) @ img / (np.linalg.norm(p - n) * np.linalg.norm(img)))
    return out


def test_prompt_cosine_and_sign_check_match_a_brute_force_recomputation(two, tmp_path):
    """Through the model's text tower (unnormalised outputs, mean over a side's prompts, then L2, i.e.
    ``zeroshot.class_text_embedding``) and the encoded test images; several prompts per side."""
    import torch

    from medclr.evaluation.data import labels, load_eval_data, split_rows
    from medclr.evaluation.diagnostics import zeroshot_diagnostics
    from medclr.evaluation.runner import Model, encode, evaluate

    _d, root, a, _b = two
    prompts = {"Cardiomegaly": {"positive": ["Cardiomegaly", "The heart is enlarged"], "negative": ["Heart size normal"]},
               "Edema": {"positive": ["Pulmonary edema"], "negative": ["No pulmonary edema", "Lungs are clear"]},
               "Pleural Effusion": {"positive": ["Pleural effusions"], "negative": ["No pleural effusions"]}}
    (tmp_path / "p.json").write_text(json.dumps(prompts))
    z = evaluate(str(a), str(root), str(tmp_path / "o"), tasks=["zeroshot"], prompts_file=str(tmp_path / "p.json"),
                 n_boot=0, figures=False)["zeroshot"]
    data = load_eval_data(root)
    rows = split_rows(data, "test")
    model = Model(a)
    enc = encode(model, data, rows, set(), prompts, 8, 0)
    y = labels(data, enc.rows, list(prompts))
    for c, (cos, sign) in _brute_force(model, prompts, enc, y).items():  # the runner, end to end
        assert -1.0 <= z["prompt_cosine"][c] <= 1.0 and -1.0 <= z["sign_check"][c] <= 1.0
        assert z["prompt_cosine"][c] == pytest.approx(cos, abs=1e-6)  # an untrained tower: cos ~ 0.99998
        assert z["sign_check"][c] == pytest.approx(sign, abs=1e-4)

    # a random tiny text tower maps every prompt near one vector; jolt its weights so the prompts spread,
    # and check again (before the first encode: the engine caches the prompt embeddings)
    model = Model(a)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for prm in model.model.text_encoder.parameters():
            prm.add_(torch.randn(prm.shape, generator=gen))
    enc = encode(model, data, rows, set(), prompts, 8, 0)
    d = zeroshot_diagnostics(model, enc, data, rows, prompts)
    want = _brute_force(model, prompts, enc, y)
    assert min(v[0] for v in want.values()) < 0.99  # not a trivial check any more (cos ~ 0.99998 before)
    for j, c in enumerate(prompts):
        assert d["prompt_cosine"][c] == pytest.approx(want[c][0], abs=1e-5)
        assert d["sign_check"][c] == pytest.approx(want[c][1], abs=1e-4)
        # cosine head: the sign check has the sign of mean score(label 1) - mean score(label 0)
        score = enc.s_pos[:, j] - enc.s_neg[:, j]
        assert np.sign(d["sign_check"][c]) == np.sign(score[y[:, j] == 1].mean() - score[y[:, j] == 0].mean())


def test_one_checkpoint_keeps_the_single_run_layout_and_bad_checkpoint_is_one_line(two, tmp_path, capsys):
    _d, root, a, _b = two
    assert medclr_main("eval", "--checkpoint", a, "--data", root, "--out", tmp_path / "one", "--n-boot", 0,
                       "--tasks", "zeroshot", "--no-figures") == 0
    m = json.loads((tmp_path / "one" / "metrics.json").read_text())
    assert "pooled" not in m and m["checkpoint"] == str(a) and "prompt_cosine" in m["zeroshot"]
    # zero-shot measures no MS-CXR phrase: no phrases.csv
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["metrics.json", "report.md"]
    capsys.readouterr()
    assert medclr_main("eval", "--checkpoint", a, "--checkpoint", tmp_path / "nowhere", "--data", root,
                       "--out", tmp_path / "bad") == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "--checkpoint" in err[0] and "nowhere" in err[0] and "no such directory" in err[0]
    assert not (tmp_path / "bad").exists()  # checked before any checkpoint is evaluated
    with pytest.raises(SystemExit) as exc:
        medclr_main("eval", "--help")
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    assert "--checkpoint runs/dcl_s0 --checkpoint runs/dcl_s1" in help_text and "1_dcl_s0" in help_text


def test_paired_runs_pairs_checkpoint_k_of_each_run(capsys):
    """bench/paired_runs.py: every pooled metric of two runs, differenced seed by seed (k with k)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("paired_runs", Path(__file__).parents[1] / "bench" / "paired_runs.py")
    paired_runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paired_runs)

    def run(auc, cardio):
        def entry(vals):
            defined = [v for v in vals if v is not None]
            return {"mean": float(np.mean(defined)), "per_checkpoint": [{"value": v, "ci": None} for v in vals]}
        return {"pooled": {"summary": {"AUC": entry(auc)},
                           "zeroshot": {"per_class": {"Cardiomegaly": {"AUC": entry(cardio)}}, "classes": ["Cardiomegaly"]}}}

    a, b = run([0.9, 0.7, 0.8], [0.6, 0.9, 0.5]), run([0.6, 0.6, 0.4], [0.6, 0.9, 0.5])
    rows = {r["metric"]: r for r in paired_runs.compare(a, b)}
    assert set(rows) == {"summary.AUC", "zeroshot.per_class.Cardiomegaly.AUC"}
    diff = rows["summary.AUC"]
    mean, _, n, lo, hi = by_hand([0.3, 0.1, 0.4])  # seed by seed, not the 0.8 − 0.533 of unpaired means alone
    np.testing.assert_allclose([diff["diff"], diff["ci_low"], diff["ci_high"]], [mean, lo, hi], rtol=1e-12)
    assert diff["n"] == n == 3 and rows["zeroshot.per_class.Cardiomegaly.AUC"]["diff"] == 0.0
    shuffled = run([0.8, 0.9, 0.7], [0.6, 0.9, 0.5])  # the same values in another seed order pair differently
    assert paired_runs.compare(shuffled, b)[0]["ci_low"] != diff["ci_low"]
    undefined = run([0.9, None, 0.8], [0.6, 0.9, 0.5])  # a seed without the metric (other --tasks, no labels)
    assert [r["metric"] for r in paired_runs.compare(undefined, b)] == ["zeroshot.per_class.Cardiomegaly.AUC"]


def test_eval_defaults_to_the_prompt_set_the_checkpoint_was_calibrated_with(two, tmp_path):
    """Without --prompts, `medclr eval` scores with the checkpoint's own set (its findings record's, as the app
    does) and says which; a checkpoint without a record gets the paper's; --prompts overrides either."""
    import dataclasses
    import shutil

    from medclr.evaluation.runner import evaluate
    from medclr.findings import fit_findings
    from medclr.inference.metadata import read_metadata, write_metadata
    from medclr.prompts import CHEX5

    _d, root, a, _b = two
    rng = np.random.default_rng(0)
    y = (rng.random((40, len(CHEX5))) < 0.5).astype(np.float64)
    report = tmp_path / "report"
    shutil.copytree(a, report)
    record = fit_findings(y + rng.normal(0, 0.5, y.shape), y, CHEX5, n_boot=20, prompts="report")
    write_metadata(report, dataclasses.replace(read_metadata(report), findings=record))

    def run(ckpt, name, **kw):
        return evaluate(str(ckpt), str(root), str(tmp_path / name), tasks=["zeroshot"], n_boot=0, figures=False, **kw)

    own, forced = run(report, "own"), run(report, "forced", prompts_file="report")
    assert own["prompts"] == forced["prompts"] == "report" and run(a, "plain")["prompts"] == "paper"
    assert own["zeroshot"]["prompt_cosine"] == forced["zeroshot"]["prompt_cosine"]  # the same prompts were scored
    assert run(report, "paper", prompts_file="paper")["zeroshot"]["prompt_cosine"] != own["zeroshot"]["prompt_cosine"]
