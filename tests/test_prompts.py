"""One prompt reduction and zero-shot score (medclr.prompts) for training's validation AUC and
`medclr eval` (issue 16): the same images and prompts give the same scores through both."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from medclr.data.labels import CHEX5
from medclr.prompts import CHEX5_PROMPTS, CHEX5_REPORT_PROMPTS
from tests.conftest_app import app_assets, engine  # noqa: F401 - fixtures


def _validation_set(n: int = 6):
    """Preprocessed crops and CheX5 labels (both values in every class; one uncertain)."""
    g = torch.Generator().manual_seed(0)
    images = torch.rand(n, 1, 224, 224, generator=g)
    labels = np.tile(np.array([[1.0], [0.0]]), (n // 2, len(CHEX5)))
    labels[0, 1] = -1.0
    return images, labels


class _DS:
    """What training's Validator reads: ``ds[i]["image"]`` (a preprocessed crop) and ``ds.table``."""

    def __init__(self, images, table):
        self.images, self.table = images, table

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return {"image": self.images[i]}


@pytest.mark.parametrize("name, prompts", [("paper", CHEX5_PROMPTS), ("report", CHEX5_REPORT_PROMPTS)],
                         ids=["paper", "report (several per side)"])
def test_validation_and_eval_give_the_same_zero_shot_scores(engine, name, prompts):  # noqa: F811
    from medclr.evaluation.data import Model
    from medclr.evaluation.zeroshot import class_text_embedding, zero_shot_metrics
    from medclr.training.hooks import Validator

    images, labels = _validation_set()
    ds = _DS(images, SimpleNamespace(sentences=[["No pneumothorax."]] * len(images), labels=labels))
    val = Validator({"val": {"prompts": name}}, torch.device("cpu"), None)  # training's val.prompts
    reduced = val._zero_shot_prompts(engine.model, labels)
    _img, v_pos, v_neg = val._embed_images(engine.model, ds, reduced)

    # `medclr eval`: evaluation.data.Model.zero_shot -> the inference engine, on the same crops
    e_pos, e_neg = Model.zero_shot(SimpleNamespace(engine=engine), engine.image_features(images), prompts)
    np.testing.assert_allclose(v_pos, e_pos, atol=1e-6)
    np.testing.assert_allclose(v_neg, e_neg, atol=1e-6)
    # the same reduction as evaluation.zeroshot's protocol function (mean of unnormalised, then L2)
    for c in CHEX5:
        raw = engine.model.text_encoder.encode(prompts[c]["positive"], normalize=False).double().numpy()
        np.testing.assert_allclose(reduced[c][0].numpy(), class_text_embedding(raw), atol=1e-6)

    # and validation's logged AUC is the eval AUC of those scores
    res = val._score(engine.model, ds)
    m = zero_shot_metrics(e_pos, e_neg, labels, classes=CHEX5, n_boot=0)
    assert res["val/chex5_auc"] == pytest.approx(m["macro"]["AUC"])
