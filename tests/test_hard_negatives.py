"""Negation-aware training: the rule negations, the hard-negative term, and its place in a batch."""

from __future__ import annotations

import math

import pytest
import torch

from medclr.data.hard_negatives import KINDS, hard_negatives, is_negated, negate, short_form, swap_finding, swap_side
from medclr.losses.hard_negatives import hard_negative_term
from medclr.prompts import CHEX5_PROMPTS


@pytest.mark.parametrize("sentence, expected", [
    ("Small left pleural effusion.", "No small left pleural effusion."),
    ("Cardiomegaly.", "No cardiomegaly."),
    ("There is a small right pleural effusion.", "There is no small right pleural effusion."),
    ("There is no pneumothorax.", "There is pneumothorax."),
    ("No pneumonia, effusions, edema, pneumothorax, adenopathy, nodules or masses.",
     "Pneumonia, effusions, edema, pneumothorax, adenopathy, nodules or masses."),
    ("The heart is not significantly enlarged.", "The heart is significantly enlarged."),
    ("The lungs are clear.", "The lungs are not clear."),
    ("Heart size normal", "Heart size abnormal"),
    ("Heart size within normal limits.", "Heart size outside normal limits."),
    ("Lungs are clear without consolidation.", "Lungs are clear with consolidation."),
    ("The lungs are clear of focal airspace disease or effusion.", "The lungs show focal airspace disease or effusion."),
    ("Negative for pneumothorax.", "Positive for pneumothorax."),
    ("PICC line tip in the SVC.", "No PICC line tip in the SVC."),
])
def test_negate_flips_polarity(sentence, expected):
    flipped = negate(sentence)
    assert flipped == expected and flipped != sentence
    if "normal" not in sentence:  # normal/abnormal flip a word, not a negation cue
        assert is_negated(flipped) != is_negated(sentence)


@pytest.mark.parametrize("sentence", [
    "No pneumothorax, but a small left effusion.",       # contrast: mixed polarity
    "Possible small left pleural effusion.",             # hedged
    "Pneumonia cannot be excluded.",
    "No change in the small right effusion.",            # a change statement, not a finding
    "The effusion has resolved.",
    "No effusion and no pneumothorax.",                  # two cues
    "...", "",
])
def test_mixed_hedged_or_empty_sentences_have_no_negation(sentence):
    assert negate(sentence) is None


def test_negation_round_trips_on_the_zero_shot_prompts():
    for cls, sides in CHEX5_PROMPTS.items():
        for prompt in sides["positive"] + sides["negative"]:
            once = negate(prompt)
            assert once is not None and once.lower() != prompt.lower(), (cls, prompt)
            assert negate(once) == prompt, (cls, prompt, once)
    # the paper's own pairs are each other's negation where the wording allows it
    for cls in ("Edema", "Pleural Effusion", "Pneumothorax"):
        assert negate(CHEX5_PROMPTS[cls]["positive"][0]) == CHEX5_PROMPTS[cls]["negative"][0]


def test_hard_negative_term_is_the_two_way_softmax_in_float64():
    g = torch.Generator().manual_seed(0)
    pos, neg = torch.rand(7, generator=g, dtype=torch.float64) * 2 - 1, torch.rand(7, generator=g, dtype=torch.float64) * 2 - 1
    tau = 0.07
    by_hand = [-math.log(math.exp(p / tau) / (math.exp(p / tau) + math.exp(n / tau))) for p, n in zip(pos.tolist(), neg.tolist())]
    got = hard_negative_term(pos.requires_grad_(), neg, tau, global_count=7)
    assert got.item() == pytest.approx(sum(by_hand) / 7, rel=1e-6)
    got.backward()
    assert (pos.grad < 0).all()  # raising the stated sentence's score always lowers the term
    # two processes with 3 and 4 of the pairs: the per-process terms average to the full-batch mean
    a = hard_negative_term(pos[:3].detach(), neg[:3], tau, global_count=7, world_size=2)
    b = hard_negative_term(pos[3:].detach(), neg[3:], tau, global_count=7, world_size=2)
    assert ((a + b) / 2).item() == pytest.approx(sum(by_hand) / 7, rel=1e-6)
    assert hard_negative_term(pos[:0], neg[:0], tau, global_count=0).item() == 0.0


def test_finding_and_side_swaps_state_what_the_report_does_not():
    report = ["Small left pleural effusion.", "No pneumothorax.", "Heart size is normal."]
    for k in range(6):
        swapped = swap_finding(report[0], report, pick=lambda n, k=k: k % n)
        assert swapped is not None and swapped.startswith("Small left ") and "effusion" not in swapped
    assert swap_side(report[0], report) == "Small right pleural effusion."
    # a report that states the other side (or both) gives no side swap; negated sentences no swaps
    assert swap_side("Left pleural effusion.", ["Left pleural effusion.", "Right basilar atelectasis."]) is None
    assert swap_side("Left pleural effusion.", ["Left pleural effusion.", "Bilateral pleural effusions."]) is None
    assert swap_finding("No pneumothorax.", report, pick=lambda n: 0) is None
    # never a finding the report states: here every finding but one is stated
    stated = ["Pleural effusion.", "Pulmonary edema.", "Cardiomegaly.", "Pneumonia.", "Consolidation.",
              "Atelectasis.", "Nodule."]
    assert swap_finding("Pleural effusion.", stated, pick=lambda n: 0) == "Pneumothorax."


def test_hard_negatives_never_repeat_the_report_and_follow_kinds():
    report = ["Small left pleural effusion.", "No small left pleural effusion."]  # contradictory on purpose
    made = hard_negatives(report[0], report, KINDS, pick=lambda n: 0)
    assert "No small left pleural effusion." not in made and len(made) == 2
    assert hard_negatives(report[0], report, ("side",)) == ["Small right pleural effusion."]
    assert hard_negatives(report[0], report, ()) == []
    with pytest.raises(ValueError, match="hard negative kinds"):
        hard_negatives(report[0], report, ("synonym",))


@pytest.mark.parametrize("sentence, expected", [
    ("Small left apical pneumothorax.", ["Pneumothorax."]),
    ("There is a small right pneumothorax.", ["Pneumothorax."]),
    ("Moderate bilateral pleural effusions.", ["Pleural effusions."]),
    ("Mild cardiomegaly.", ["Cardiomegaly."]),
    ("There is no pneumothorax.", ["No pneumothorax."]),
    ("Pneumothorax is not seen.", ["No pneumothorax."]),
    ("No evidence of pulmonary edema.", ["No pulmonary edema."]),
    # a negated list: each finding that stands alone in its item, never one with a qualifier
    ("No focal consolidation, pleural effusion, or pneumothorax identified.", ["No pleural effusion.", "No pneumothorax."]),
    ("No pneumonia, effusions, adenopathy or masses.", ["No pneumonia.", "No effusions."]),
    # nothing the sentence entails about one finding alone
    ("No large pneumothorax.", [None]),                   # a small one may be there
    ("No pneumothorax or significant pulmonary edema.", ["No pneumothorax."]),
    ("The heart is not enlarged.", [None]),
    ("Possible small left pleural effusion.", [None]),   # hedged
    ("Small left pleural effusion and atelectasis.", [None]),  # two findings stated
    ("Heart size normal.", [None]),
    ("Interval resolution of the pneumothorax.", [None]),
])
def test_short_form_is_what_the_sentence_entails_about_one_finding(sentence, expected):
    made = {short_form(sentence, pick=lambda n, k=k: k % n) for k in range(4)}
    assert made == set(expected)
    for text in made - {None}:  # a short form keeps the sentence's polarity
        assert is_negated(text) == is_negated(sentence)


def test_collate_puts_each_hard_negative_after_the_sentences_and_never_the_positive():
    from types import SimpleNamespace

    from medclr.training.data import Collate

    seen = []

    def tokenize(proxy, sentences):
        seen.append(list(sentences))
        return {"input_ids": torch.zeros(len(sentences), 4, dtype=torch.long)}

    import medclr.models.text as text

    reports = [["Small left pleural effusion.", "No pneumothorax."], ["Possible pneumonia."], ["No pneumothorax."]]
    items = [{"image": torch.zeros(1, 4, 4), "sentence": r[0], "index": i, "text_index": i, "eta": None,
              "hard": hard_negatives(r[0], r, ("negation", "side"))} for i, r in enumerate(reports)]
    encoder = SimpleNamespace(tokenizer=None, max_length=8, strip_punctuation=False)
    original = text.TextEncoder.tokenize
    text.TextEncoder.tokenize = tokenize
    try:
        on = Collate(encoder)(items)
        off = Collate(encoder)([{**it, "hard": []} for it in items])
    finally:
        text.TextEncoder.tokenize = original
    assert on["hard_index"].tolist() == [0, 0, 2]  # the hedged sentence has none
    assert seen[0] == ["Small left pleural effusion.", "Possible pneumonia.", "No pneumothorax.",
                       "No small left pleural effusion.", "Small right pleural effusion.", "Pneumothorax."]
    assert off["hard_index"].numel() == 0 and off["tokens"]["input_ids"].shape[0] == 3
    for row, i in enumerate(on["hard_index"].tolist()):
        assert seen[0][3 + row] != items[i]["sentence"]


def test_findings_sampling_weighs_stated_findings_over_boilerplate():
    import numpy as np

    from medclr.data.pairs import sentence_probabilities
    from medclr.errors import MedclrError

    rows = [["No pneumothorax.", "Small left pleural effusion.", "Heart size normal.", "Possible pneumonia."],
            ["The lungs are clear."]]
    p = sentence_probabilities(rows, "findings", other_weight=0.1)
    np.testing.assert_allclose(p[0], np.array([0.1, 1.0, 0.1, 0.1]) / 1.3)  # hedged and negated weigh 0.1
    np.testing.assert_allclose(p[1], [1.0])
    assert sentence_probabilities(rows, "uniform") is None
    with pytest.raises(MedclrError, match="sentence_sampling"):
        sentence_probabilities(rows, "rare")
