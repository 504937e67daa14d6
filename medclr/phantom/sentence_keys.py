"""The ground-truth key of what one report sentence states, and rho_sent: that key's frequency among training pairs.

A step pairs an image with one sentence of its report, so the class whose probability DCL-eta's eta
estimates is that of the sentence, not of the study: "No cardiomegaly." pairs with a tenth of the images
whatever else their reports say. The key is the phantom's own reading of a sentence, by the rules that
filed every sentence of its banks (``medclr.phantom.reports.build_banks``, ``medclr.phantom.textmatch``):

* ``+name[:side]|...``: the rendered findings the sentence asserts (sorted), with the side it states for a
  lateral finding ("+pleural_effusion:left");
* ``-name|...``: otherwise the findings it negates ("-pleural_effusion|pneumothorax");
* ``normal``: neither (normal statements: "The lungs are clear.").

So a composed report's sentence gets the key of the bank it was drawn from, and an Open-i sentence the
key the same matcher gives it. :func:`key_holds` says whether a sentence's statement is true of a study;
:func:`false_negative_rate` turns it into DCL's false-negative rate q of a text anchor (the chance that a
negative image, drawn as training draws studies, is one the sentence is true of: the oracle eta of
DCL-eta_True). :func:`rho_sent` is another quantity, kept under its own name: how often the sentence's
key occurs among the training (report, sentence) pairs, with the sampler's own draw probabilities
(``medclr.data.pairs``). "No cardiomegaly." is true of most images (q ~0.8) but a few per cent of the
pairs state it (rho_sent ~0.05).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from medclr.data.pairs import key_frequency, pair_probabilities
from medclr.phantom import textmatch as tm, vocab as V

NORMAL_KEY = "normal"


@lru_cache(maxsize=65536)
def sentence_key(sentence: str) -> str:
    """The ground-truth key of one report sentence (module docstring)."""
    stated = sorted(tm.positives(sentence, V.RENDERED))
    if stated:
        side = tm.sentence_side(sentence)
        return "+" + "|".join(f"{n}:{side}" if n in V.LATERAL and side in V.SIDES else n for n in stated)
    negated = sorted(tm.negations(sentence, tm.KEYWORDS))
    return "-" + "|".join(negated) if negated else NORMAL_KEY


def rho_sent(sentences: list[list[str]], **sampling) -> list[np.ndarray]:
    """Per report, for each sentence: the frequency of its key among the training pairs as the sampler draws
    them (``sampling``: the keyword arguments of :func:`medclr.data.pairs.pair_probabilities`, i.e. the
    training config's ``data.sentence_sampling``, ``other_sentence_weight``, ``study_sampling``,
    ``study_balance``)."""
    keys = [[sentence_key(s) for s in row] for row in sentences]
    return key_frequency(keys, pair_probabilities(sentences, **sampling))


def key_holds(key: str, latent_class: str, report_keys: frozenset[str] = frozenset()) -> bool:
    """Whether the statement of a sentence with ``key`` is true of a study with ``latent_class``
    (``medclr.phantom.vocab.latent_class``) and ``report_keys`` (the keys of its own report's sentences).

    A "+" key holds when the study has every finding it asserts (a stated side must match, or the study's is
    bilateral); a "-" key when the study has none of the findings it negates; ``normal`` (the lungs are
    clear, no acute process) when the study is normal or its own report says a normal statement: that
    key names no finding, so the study's report is the only ground truth there is for it."""
    if key == NORMAL_KEY:
        return latent_class == V.NORMAL or NORMAL_KEY in report_keys
    tokens = set() if latent_class == V.NORMAL else set(latent_class.split("|"))
    names = {t.split(":")[0] for t in tokens}
    items = key[1:].split("|")
    if key.startswith("-"):
        return not names.intersection(items)
    for item in items:
        name, _, side = item.partition(":")
        if not (item in tokens or (not side and name in names) or (side and f"{name}:bilateral" in tokens)):
            return False
    return True


def false_negative_rate(keys, latent_classes: list[str], report_keys: list[frozenset[str]],
                        study_p: np.ndarray) -> dict[str, float]:
    """DCL's false-negative rate of a text anchor, per sentence key: the probability that a negative image,
    drawn as the run's sampler draws studies (``study_p``: each study's draw probability, summing to 1), is
    one the sentence is true of (:func:`key_holds`). This is the paper's rho(c_x) for a text anchor x, the
    eta of DCL-eta_True.

    Studies are grouped by what :func:`key_holds` reads of them (the latent class, and whether the report
    states a normal statement), so the cost is keys x groups, not keys x studies."""
    mass: dict[tuple[str, bool], float] = {}
    for cls, own, p in zip(latent_classes, report_keys, np.asarray(study_p, dtype=np.float64)):
        g = (cls, NORMAL_KEY in own)
        mass[g] = mass.get(g, 0.0) + float(p)
    groups = [(cls, frozenset({NORMAL_KEY}) if normal else frozenset(), p) for (cls, normal), p in mass.items()]
    return {key: float(sum(p for cls, own, p in groups if key_holds(key, cls, own))) for key in dict.fromkeys(keys)}


def false_negative_floor(keys: list[str], latent_classes: list[str], report_keys: list[frozenset[str]]) -> np.ndarray:
    """Per text anchor of one batch (row i pairs sentence key i with study i), the text-anchored InfoNCE loss
    of a model that can tell apart only which sentences hold of which images: log of how many images of the
    batch the statement holds for (its own always counted). Such a model treats every image the sentence is
    true of as interchangeable (scores them alike, and above the others), so its own image gets 1/count of the
    softmax. It is not a bound on what a model can reach: a model that knows each study's latent class can
    score the images the sentence is true of unequally (some classes' reports state it more often than
    others') and go below it. A batch of many normal studies puts it high for normal statements."""
    n = len(keys)
    counts = np.ones(n)
    for i, key in enumerate(keys):
        counts[i] += sum(key_holds(key, latent_classes[j], report_keys[j]) for j in range(n) if j != i)
    return np.log(counts)
