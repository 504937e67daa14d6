"""Masked-LM scoring: pseudo-log-likelihood, eta_LM, and a small domain LM fitted on a report corpus.

* :func:`pseudo_log_likelihood` / :func:`score_sentences` (``medclr.lm.pll``): exact PLL, batched.
* :func:`load_masked_lm` (``medclr.lm.load``): offline-first loading with a check for a missing MLM head.
* ``medclr.lm.fit``: WordPiece tokenizer + small BERT MLM (``medclr lm fit``).
* ``medclr.lm.eta``: sentence table with PLL and eta, cached (``medclr lm score``), and
  :func:`~medclr.lm.eta.join_eta` to align eta with the manifest's ``sentences``.
* ``medclr.lm.eta_fit``: a, k of eta fitted label-free to the corpus's sentence frequencies (the default of
  ``medclr lm score``).
* ``medclr.lm.calibrate``: eta_LM against the phantom's true class probability (``medclr lm calibrate``).

Only numpy is imported here; torch and transformers load on first use.
"""

from medclr.lm.load import load_masked_lm, model_fingerprint
from medclr.lm.pll import PLLResult, pseudo_log_likelihood, score_sentences

__all__ = ["PLLResult", "load_masked_lm", "model_fingerprint", "pseudo_log_likelihood", "score_sentences"]
