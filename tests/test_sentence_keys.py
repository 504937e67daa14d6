"""rho_sent: the frequency of a sentence's ground-truth key among training pairs (the DCL-eta_True oracle),
against a brute-force count over the reports of a small phantom, under every sampling the trainer has."""

from collections import Counter

import numpy as np
import pytest


@pytest.fixture(scope="module")
def reports():
    """The report sentences of 60 phantom studies (half Open-i, half composed), as the planner writes them."""
    from medclr.phantom import load_material
    from medclr.phantom.plan import plan_study

    material = load_material()
    out = []
    for k in range(60):
        spec = plan_study(material, "both", 3, k)
        sentences = list(spec["findings_text"]) + list(spec["impression_text"])
        if sentences:
            out.append(sentences)
    return out


def test_sentence_keys_read_polarity_finding_and_side():
    from medclr.phantom.sentence_keys import NORMAL_KEY, sentence_key

    assert sentence_key("No pneumothorax.") == sentence_key("There is no pneumothorax.") == "-pneumothorax"
    assert sentence_key("Small left pleural effusion.") == "+pleural_effusion:left"
    assert sentence_key("Small right pleural effusion.") == "+pleural_effusion:right"
    assert sentence_key("No pleural effusion or pneumothorax.") == "-pleural_effusion|pneumothorax"
    assert sentence_key("No acute cardiopulmonary process.") == NORMAL_KEY


def _brute_force(reports, sentence_weight, study_weight):
    """rho per (report, sentence) by explicit loops: P(pair) = study share x sentence share, summed per key."""
    from medclr.phantom.sentence_keys import sentence_key

    total_w = sum(study_weight(r) for r in reports)
    mass = Counter()
    for r in reports:
        sw = [sentence_weight(s) for s in r]
        for s, w in zip(r, sw):
            mass[sentence_key(s)] += study_weight(r) / total_w * w / sum(sw)
    return [[mass[sentence_key(s)] for s in r] for r in reports]


def test_rho_sent_matches_brute_force_uniform(reports):
    from medclr.phantom.sentence_keys import rho_sent

    got = rho_sent(reports)
    want = _brute_force(reports, lambda s: 1.0, lambda r: 1.0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    # every pair's key frequency: summed over the distinct keys it is 1
    from medclr.phantom.sentence_keys import sentence_key

    per_key = {sentence_key(s): r for row, rr in zip(reports, got) for s, r in zip(row, rr)}
    assert sum(per_key.values()) == pytest.approx(1.0, abs=1e-12)
    # a key met once in the corpus, in a report of n sentences, has rho = 1 / (reports * n)
    counts = Counter(sentence_key(s) for r in reports for s in r)
    once = [(len(r), rr[j]) for r, rr in zip(reports, got) for j, s in enumerate(r) if counts[sentence_key(s)] == 1]
    assert once and all(r == pytest.approx(1.0 / (len(reports) * n)) for n, r in once)


def test_rho_sent_matches_brute_force_weighted(reports):
    """Finding sentences drawn first (weight 1 vs 0.1) and studies weighted by their rarest finding."""
    from medclr.data.hard_negatives import stated_findings, states_finding
    from medclr.phantom.sentence_keys import rho_sent

    counts = Counter(f for r in reports for f in stated_findings(r))
    counts["none"] = sum(not stated_findings(r) for r in reports)

    def study_weight(r):
        found = stated_findings(r)
        group = min(found, key=lambda f: (counts[f], f)) if found else "none"
        return counts[group] ** -0.5

    got = rho_sent(reports, sentence_sampling="findings", other_weight=0.1, study_sampling="findings",
                   study_balance=0.5)
    want = _brute_force(reports, lambda s: 1.0 if states_finding(s) else 0.1, study_weight)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    assert not np.allclose(np.concatenate(got), np.concatenate(rho_sent(reports)))  # the sampling matters


def test_training_oracle_is_rho_sent_of_the_drawn_sentence(reports):
    """loss.eta_source=true gives each sentence its own rho_sent (the study prior is eta_source=study_prior)."""
    import pandas as pd

    from medclr.phantom.sentence_keys import rho_sent
    from medclr.training.data import _eta_study_prior, _eta_true

    rows = pd.DataFrame({"sentences": reports, "latent_class_prob": np.linspace(0.01, 0.2, len(reports))})
    data = {"sentence_sampling": "uniform", "other_sentence_weight": 0.1, "study_sampling": "uniform",
            "study_balance": 0.5, "eta_max": 0.99}
    got = _eta_true(rows, {"data": data})
    for g, w in zip(got, rho_sent(reports)):
        np.testing.assert_allclose(g, w.astype(np.float32))
    assert any(len(set(g.tolist())) > 1 for g in got)  # sentences of one study differ
    prior = _eta_study_prior(rows, "m.parquet")
    assert [p.tolist() for p in prior[:2]] == [[np.float32(0.01)], [np.float32(rows["latent_class_prob"][1])]]


def test_key_holds_reads_polarity_side_and_normal():
    from medclr.phantom.sentence_keys import NORMAL_KEY, key_holds

    assert key_holds("+pleural_effusion:left", "cardiomegaly|pleural_effusion:left")
    assert key_holds("+pleural_effusion:left", "pleural_effusion:bilateral")  # bilateral has a left effusion
    assert not key_holds("+pleural_effusion:left", "pleural_effusion:right")
    assert key_holds("+pneumothorax", "pneumothorax:right")  # a short form states no side
    assert not key_holds("+cardiomegaly|edema", "cardiomegaly")  # every asserted finding must be there
    assert key_holds("-pneumothorax", "normal") and key_holds("-pneumothorax", "cardiomegaly")
    assert not key_holds("-pleural_effusion|pneumothorax", "pneumothorax:right")
    assert key_holds(NORMAL_KEY, "normal")
    assert not key_holds(NORMAL_KEY, "edema")
    assert key_holds(NORMAL_KEY, "cardiomegaly", frozenset({NORMAL_KEY, "+cardiomegaly"}))


def test_false_negative_floor_counts_the_images_a_sentence_is_true_of():
    from medclr.phantom.sentence_keys import false_negative_floor

    keys = ["-pneumothorax", "+pneumothorax:right", "+cardiomegaly", "normal"]
    classes = ["normal", "pneumothorax:right", "cardiomegaly", "normal"]
    reports = [frozenset({"normal", "-pneumothorax"}), frozenset({"+pneumothorax:right"}),
               frozenset({"+cardiomegaly", "-pneumothorax"}), frozenset({"normal"})]
    # "No pneumothorax" is true of studies 0, 2, 3; the pneumothorax and cardiomegaly sentences of their own
    # study only; "normal" of studies 0 and 3 (normal) and not 1 or 2 (findings, no normal sentence)
    np.testing.assert_allclose(false_negative_floor(keys, classes, reports), np.log([3, 1, 1, 2]))
    # a sentence that the matcher keys as false of its own study still counts its own image (the positive)
    assert false_negative_floor(["+edema"], ["normal"], [frozenset()])[0] == 0.0
