"""Weighted report draws (`data.study_sampling: findings`): the weights and the sampler that uses them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from medclr.errors import MedclrError


def _inclusion_probabilities(w: np.ndarray, k: int) -> np.ndarray:
    """Brute force: P(i among k draws without replacement, each draw proportional to w of the rest)."""
    p = np.zeros(len(w))
    for order in itertools.permutations(range(len(w)), k):
        prob, left = 1.0, float(w.sum())
        for i in order:
            prob *= w[i] / left
            left -= w[i]
        p[list(order)] += prob
    return p


def test_weighted_batches_sample_without_replacement_in_proportion_to_the_weights():
    from medclr.training.sampler import GlobalBatchSampler

    w = np.array([1.0, 2.0, 4.0, 8.0, 1.0, 0.5])
    s = GlobalBatchSampler(len(w), 2, seed=5, weights=w)
    counts = np.zeros(len(w))
    steps = 20000
    for step in range(steps):
        b = s.global_batch_indices(step)
        assert len(set(b.tolist())) == 2, "an index twice in one global batch"
        counts[b] += 1
    # seeded, so deterministic; the margin is ~6 binomial sd at 20,000 draws
    np.testing.assert_allclose(counts / steps, _inclusion_probabilities(w, 2), atol=0.02)
    uniform = GlobalBatchSampler(len(w), 2, seed=5)
    assert not np.array_equal(uniform.global_batch_indices(0), s.global_batch_indices(0)) or \
        not np.array_equal(uniform.global_batch_indices(1), s.global_batch_indices(1))


def test_weighted_batches_are_a_function_of_the_step_split_over_ranks():
    from medclr.training.sampler import GlobalBatchSampler

    w = np.linspace(0.2, 3.0, 23)
    ranks = [iter(GlobalBatchSampler(23, 8, r, 2, seed=3, weights=w)) for r in range(2)]
    one = GlobalBatchSampler(23, 8, seed=3, weights=w)
    for step in range(12):
        parts = [next(it) for it in ranks]
        assert {key for p in parts for key, _ in p} == {step}, "weighted items are keyed by the step"
        assert [i for p in parts for _, i in p] == one.global_batch_indices(step).tolist()
    resumed = GlobalBatchSampler(23, 8, 1, 2, seed=3, start_step=7, weights=w)
    again = iter(GlobalBatchSampler(23, 8, 1, 2, seed=3, weights=w))
    assert next(iter(resumed)) == [x for _, x in zip(range(8), again)][7]
    for bad in (w[:-1], np.where(np.arange(23) == 4, 0.0, w)):
        with pytest.raises(MedclrError, match="weights"):
            GlobalBatchSampler(23, 8, weights=bad)


def test_study_weights_group_reports_by_their_rarest_stated_finding():
    from medclr.data.pairs import study_weights

    rows = [["Small left pleural effusion.", "No pneumothorax."],          # effusion
            ["Bilateral pleural effusions.", "Right pneumothorax."],       # effusion + pneumothorax -> pneumothorax
            ["Moderate pleural effusion."],                                # effusion
            ["No pleural effusion or pneumothorax.", "Heart size normal."],  # negated only -> none
            ["Possible pneumonia."],                                       # hedged -> none
            ["The lungs are clear."]]                                      # none
    # counts: effusion 3, pneumothorax 1, none 3
    w = study_weights(rows, "findings", power=1.0)
    np.testing.assert_allclose(w, [1 / 3, 1.0, 1 / 3, 1 / 3, 1 / 3, 1 / 3])
    np.testing.assert_allclose(study_weights(rows, "findings", power=0.5),
                               [3 ** -0.5, 1.0, 3 ** -0.5, 3 ** -0.5, 3 ** -0.5, 3 ** -0.5])
    np.testing.assert_allclose(study_weights(rows, "findings", power=0.0), np.ones(6))
    assert study_weights(rows, "uniform") is None
    with pytest.raises(MedclrError, match="study_sampling"):
        study_weights(rows, "classes")


def test_study_sampling_config_is_validated_with_one_line():
    from medclr.training.config import load_config

    base = ["data.manifest=m.parquet", "out=o"]
    cfg = load_config("infonce", base)
    assert cfg["data"]["study_sampling"] == "uniform"  # the papers' draw stays the default
    assert load_config("infonce", base + ["data.study_sampling=findings"])["data"]["study_balance"] == 0.5
    with pytest.raises(MedclrError, match=r"data.study_sampling 'rare': expected uniform or findings"):
        load_config("infonce", base + ["data.study_sampling=rare"])
    with pytest.raises(MedclrError, match=r"data.study_balance 2(\.0)?: expected a number in \[0, 1\]"):
        load_config("infonce", base + ["data.study_balance=2"])
