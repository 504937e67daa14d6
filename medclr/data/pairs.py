"""How often a training step pairs an image with each report sentence, and how often a sentence's key occurs.

Training pairs each image with one sentence of its report per visit (``training.data.PairDataset``):
which reports a batch holds is ``study_weights`` (uniform: every report once per epoch), which sentence
of the report a visit draws is ``sentence_probabilities``. :func:`pair_probabilities` multiplies the two
into the probability that a random training pair is (report i, sentence j), and :func:`key_frequency`
sums it over every (i, j) whose sentence has the same key: the frequency of what a sentence states among
the pairs the loss sees. That is the class probability rho that the debiased losses' eta estimates, for
whatever key the caller gives: the phantom's ground truth (``medclr.phantom.sentence_keys``, the DCL-eta_True
oracle) or a label-free key read from the words (:func:`medclr.data.hard_negatives.meaning_key`, the target
``medclr.lm.eta_fit`` calibrates eta_LM to).

Weighted study draws (Gumbel top-k, ``training.sampler``) are without replacement within a batch, so a
report's inclusion probability is not exactly proportional to its weight; the proportional value is
used here (exact for uniform draws, and within a batch's worth of the truth for weights of moderate spread).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from medclr.errors import MedclrError


def sentence_probabilities(sentences: list[list[str]], mode: str, other_weight: float = 0.1) -> list[np.ndarray] | None:
    """Per row, the probability of drawing each of its sentences (None = uniform).

    ``findings``: a sentence that states a finding (``medclr.data.hard_negatives.states_finding``:
    it names one and is neither negated nor hedged) weighs 1, any other sentence ``other_weight``.
    Reports are mostly boilerplate ("No pneumothorax.", "Heart size normal."): drawn uniformly, a
    report's finding sentence is 9 % of the demo's draws although a third of its reports state one;
    with weight 0.1 it is most of them, so a fixed step budget shows the image tower each finding
    several times as often. Label-free: only the report's own words decide."""
    from medclr.data.hard_negatives import states_finding

    if mode == "uniform":
        return None
    if mode != "findings":
        raise MedclrError(f"config data.sentence_sampling {mode!r}: expected uniform or findings")
    out = []
    for row in sentences:
        w = np.array([1.0 if states_finding(s) else other_weight for s in row], dtype=np.float64)
        out.append(w / w.sum())
    return out


def study_weights(sentences: list[list[str]], mode: str, power: float = 0.5) -> np.ndarray | None:
    """Per row, its weight in the batch draw (None = uniform: every row once per epoch).

    ``findings``: a report's group is the rarest finding it states (``stated_findings``; counts over
    these rows), or "none"; the row weighs count(group) ** -power. Power 1 draws every group equally
    often, 0 is uniform, 0.5 (the default) halves the imbalance on a log scale. The demo's training
    reports state pneumonia in 51 of 2,660 and pneumothorax in 109, so a fixed step budget shows the
    image tower those findings a few dozen times each; the rare groups gain what the "none" group
    (1,451 reports) and the common findings lose. Label-free: the report's own words decide. It
    changes the class frequencies the losses see, which the debiased losses' η assume natural."""
    from medclr.data.hard_negatives import stated_findings

    if mode == "uniform":
        return None
    if mode != "findings":
        raise MedclrError(f"config data.study_sampling {mode!r}: expected uniform or findings")
    stated = [stated_findings(row) for row in sentences]
    counts = Counter(f for found in stated for f in found)
    counts["none"] = sum(not found for found in stated)
    group = [min(found, key=lambda f: (counts[f], f)) if found else "none" for found in stated]
    return np.array([counts[g] ** -float(power) for g in group], dtype=np.float64)


def pair_probabilities(sentences: list[list[str]], sentence_sampling: str = "uniform", other_weight: float = 0.1,
                       study_sampling: str = "uniform", study_balance: float = 0.5) -> list[np.ndarray]:
    """Per report i, a float64 array P[i][j] = probability that a training pair is (report i, sentence j);
    all entries sum to 1. The arguments are the ``data.*`` keys of a training config of the same names."""
    if not sentences or any(len(row) == 0 for row in sentences):
        raise MedclrError("pair probabilities: every report needs at least one sentence")
    within = sentence_probabilities(sentences, sentence_sampling, other_weight)
    weights = study_weights(sentences, study_sampling, study_balance)
    study = np.ones(len(sentences)) if weights is None else np.asarray(weights, dtype=np.float64)
    study = study / study.sum()
    return [study[i] * (np.full(len(row), 1.0 / len(row)) if within is None else within[i])
            for i, row in enumerate(sentences)]


def key_frequency(keys: list[list[str]], pairs: list[np.ndarray]) -> list[np.ndarray]:
    """Per report, for each sentence: the total pair probability of every (report, sentence) whose key equals
    this sentence's key (``keys`` aligned with ``pairs``)."""
    if len(keys) != len(pairs) or any(len(k) != len(p) for k, p in zip(keys, pairs)):
        raise MedclrError("key frequency: keys and pair probabilities must have the same shape")
    mass: defaultdict[str, float] = defaultdict(float)
    for row_keys, row_p in zip(keys, pairs):
        for key, p in zip(row_keys, row_p):
            mass[key] += float(p)
    return [np.array([mass[k] for k in row_keys], dtype=np.float64) for row_keys in keys]


def drawn_mean(values: list[np.ndarray], pairs: list[np.ndarray]) -> float:
    """The mean of a per-(report, sentence) quantity over the pairs as training draws them."""
    return float(sum(float(np.dot(v, p)) for v, p in zip(values, pairs)))


__all__ = ["drawn_mean", "key_frequency", "pair_probabilities", "sentence_probabilities", "study_weights"]
