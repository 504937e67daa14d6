"""medclr.findings: the per-finding validation record, its Platt calibration and the ECE, against numpy."""

import json

import numpy as np
import pytest

from medclr.findings import (
    NOT_VALIDATED,
    expected_calibration_error,
    fit_findings,
    platt_fit,
    probability,
)
from medclr.inference.metadata import CheckpointMeta, read_metadata, write_metadata


def newton_logistic(x: np.ndarray, y: np.ndarray, iters: int = 100) -> tuple[float, float]:
    """Maximum-likelihood (a, b) of P(y=1) = 1 / (1 + exp(-(a x + b))), Newton-Raphson in float64."""
    X = np.stack([x, np.ones_like(x)], axis=1)
    w = np.zeros(2)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-X @ w))
        grad = X.T @ (y - p)
        hess = X.T @ (X * (p * (1 - p))[:, None])
        w = w + np.linalg.solve(hess, grad)
    return float(w[0]), float(w[1])


def test_platt_fit_is_the_maximum_likelihood_logistic():
    rng = np.random.default_rng(0)
    x = rng.normal(size=400)
    y = (rng.random(400) < 1 / (1 + np.exp(-(2.5 * x - 0.7)))).astype(float)
    a, b = platt_fit(x, y)
    ref = newton_logistic(x, y)
    assert a == pytest.approx(ref[0], abs=1e-4) and b == pytest.approx(ref[1], abs=1e-4)


def test_ece_against_its_formula():
    rng = np.random.default_rng(1)
    p, y = rng.random(1000), (rng.random(1000) < 0.3).astype(float)
    bins = np.minimum((p * 10).astype(int), 9)
    ref = sum((bins == b).mean() * abs(y[bins == b].mean() - p[bins == b].mean()) for b in range(10) if (bins == b).any())
    assert expected_calibration_error(p, y) == pytest.approx(ref, abs=1e-12)
    assert expected_calibration_error(np.full(4, 0.25), np.array([1.0, 0, 0, 0])) == pytest.approx(0.0)


def _record(seed=0, n=300):
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, 3)) < 0.3).astype(float)
    noise = rng.normal(size=(n, 3))
    margins = np.stack([labels[:, 0] * 2 + noise[:, 0],      # reads it
                        -labels[:, 1] * 2 + noise[:, 1],     # flipped
                        noise[:, 2]], axis=1)                # chance
    return fit_findings(margins, labels, ["Cardiomegaly", "Pneumothorax", "Edema"], n_boot=200), margins, labels


def test_a_read_finding_a_flipped_one_and_a_chance_one():
    rec, margins, labels = _record()
    c = rec["classes"]
    assert c["Cardiomegaly"]["reads"] and c["Cardiomegaly"]["reason"] is None
    assert c["Cardiomegaly"]["direction"] == "positive" and c["Cardiomegaly"]["auc"] > 0.85
    assert not c["Pneumothorax"]["reads"] and c["Pneumothorax"]["direction"] == "flipped"
    assert "does not reliably read pneumothorax: validation AUC 0.0" in c["Pneumothorax"]["reason"]
    assert "opposite" in c["Pneumothorax"]["reason"]
    assert not c["Edema"]["reads"] and 0.35 < c["Edema"]["auc"] < 0.65
    # chance is "below 0.70", never a reversal: "opposite" needs the whole CI below 0.5
    assert c["Edema"]["reason"].endswith("(below 0.70)") and c["Edema"]["auc_ci"][1] > 0.5
    lo, hi = c["Cardiomegaly"]["auc_ci"]
    assert lo < c["Cardiomegaly"]["auc"] < hi
    # a read finding: the Platt probability; an unread one: NaN and its reason
    p, why = probability(rec, "Cardiomegaly", margins[:, 0])
    a, b = newton_logistic(margins[:, 0], labels[:, 0])
    assert why is None and np.allclose(p, 1 / (1 + np.exp(-(a * margins[:, 0] + b))), atol=1e-4)
    p, why = probability(rec, "Pneumothorax", margins[:, 1])
    assert np.isnan(p).all() and why == c["Pneumothorax"]["reason"]
    assert probability(None, "Edema", 0.3)[1] == NOT_VALIDATED


def test_calibration_lowers_the_ece_of_a_sharp_softmax():
    rec, margins, labels = _record(seed=2, n=2000)
    raw = 1 / (1 + np.exp(-margins[:, 0] / 0.07))  # softmax over the prompt pair at the loss's temperature
    cal, _ = probability(rec, "Cardiomegaly", margins[:, 0])
    assert expected_calibration_error(cal, labels[:, 0]) < 0.05 < expected_calibration_error(raw, labels[:, 0])


def test_a_finding_without_positives_is_not_validated():
    rec = fit_findings(np.zeros((5, 1)), np.zeros((5, 1)), ["Pneumonia"], n_boot=0)
    assert not rec["classes"]["Pneumonia"]["reads"]
    assert "0 positive and 5 negative" in rec["classes"]["Pneumonia"]["reason"]


def test_the_record_round_trips_through_checkpoint_meta(tmp_path):
    rec, _, _ = _record(n=100)
    write_metadata(tmp_path, CheckpointMeta(image_size=64, findings=rec))
    assert read_metadata(tmp_path).findings == json.loads(json.dumps(rec))
    (tmp_path / "checkpoint_meta.json").write_text(json.dumps({"format_version": 1, "image_size": 64}))
    assert read_metadata(tmp_path).findings is None  # version 1: not validated
