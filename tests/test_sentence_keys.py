"""The phantom's sentence oracles against brute-force counts over the reports of a small phantom, under every
sampling the trainer has: q, DCL's false-negative rate of a sentence (the DCL-eta_True oracle), and rho_sent, the
frequency of its ground-truth key among training pairs."""

from collections import Counter

import numpy as np
import pytest


@pytest.fixture(scope="module")
def studies():
    """(report sentences, latent class) of 60 phantom studies (half Open-i, half composed), as the planner writes them."""
    from medclr.phantom import load_material
    from medclr.phantom.plan import plan_study

    material = load_material()
    out = []
    for k in range(60):
        spec = plan_study(material, "both", 3, k)
        sentences = list(spec["findings_text"]) + list(spec["impression_text"])
        if sentences:
            out.append((sentences, spec["latent_class"]))
    return out


@pytest.fixture(scope="module")
def reports(studies):
    return [r for r, _ in studies]


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


def test_false_negative_rate_is_the_drawn_share_of_studies_a_sentence_is_true_of(studies):
    """DCL's oracle q (loss.eta_source=true) against a brute-force float64 count over 60 phantom studies: for each
    sentence key, the sum over studies of the study's draw probability where the statement holds of it."""
    from medclr.data.pairs import study_weights
    from medclr.phantom.sentence_keys import false_negative_rate, key_holds, rho_sent, sentence_key

    reports = [r for r, _ in studies]
    classes = [c for _, c in studies]
    own = [frozenset(sentence_key(x) for x in r) for r in reports]
    keys = sorted({sentence_key(x) for r in reports for x in r} | {"-pneumothorax", "+pneumothorax", "normal"})
    for weights in (None, study_weights(reports, "findings", 1.0)):
        p = np.full(len(reports), 1 / len(reports)) if weights is None else weights / weights.sum()
        got = false_negative_rate(keys, classes, own, p)
        for key in keys:
            want = 0.0
            for cls, keys_of_report, ps in zip(classes, own, p):
                want += float(ps) * key_holds(key, cls, keys_of_report)
            assert got[key] == pytest.approx(want, abs=1e-12), key
    q = false_negative_rate(["-pneumothorax"], classes, own, np.full(len(reports), 1 / len(reports)))
    rho = {sentence_key(x): r for row, rs in zip(reports, rho_sent(reports)) for x, r in zip(row, rs)}
    assert q["-pneumothorax"] > 5 * rho["-pneumothorax"]  # true of most images, stated in a few pairs


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
