"""Which of two sentences a checkpoint prefers on one image: the rule behind the app's side and size checks
(``medclr.app.grounding``), which `medclr eval`'s ``sides`` task measures on the MS-CXR phrases.

The model prefers one sentence when its own two-sentence softmax at the checkpoint's temperature gives it at
least :data:`PREFERENCE_ODDS` to 1, a score gap of tau·ln(odds): the same odds whatever head or score scale the
checkpoint has.
"""

from __future__ import annotations

import math

PREFERENCE_ODDS = 2.0


def preference(mine: float, theirs: float, tau: float) -> int:
    """+1 when the model prefers ``mine`` (image–sentence scores, ``DualEncoder.similarity``), -1 when it prefers
    ``theirs``, 0 when the two are closer than :data:`PREFERENCE_ODDS` to 1."""
    gap = tau * math.log(PREFERENCE_ODDS)
    return 1 if mine - theirs >= gap else -1 if theirs - mine >= gap else 0
