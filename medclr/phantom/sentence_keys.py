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
key the same matcher gives it. :func:`rho_sent` turns keys into the oracle's eta with the training
sampler's own draw probabilities (``medclr.data.pairs``).
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
