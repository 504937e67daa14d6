"""Metric layer of `evaluation`: grounding (CNR, mIoU, upsampling), retrieval, zero-shot, probe, plots.

Pure numpy/sklearn on small arrays; the whole file runs in a few seconds.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, roc_auc_score

from medclr.errors import MedclrError
from medclr.evaluation.grounding import (
    DEFAULT_THRESHOLDS,
    CropGeometry,
    boxes_to_mask,
    category_macro_average,
    cnr,
    grounding_scores,
    iou_per_threshold,
    miou,
    smooth_map,
    upsample_map,
)
from medclr.evaluation.probe import linear_probe, plot_tsne, subsample_indices
from medclr.evaluation.retrieval import bidirectional_retrieval, ranks, retrieval_metrics
from medclr.evaluation.zeroshot import (
    CHEX5,
    PAPER_PROMPTS,
    PromptFileError,
    class_text_embedding,
    cosine_zero_shot_scores,
    load_prompts,
    zero_shot_metrics,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# =========================================================================== grounding


def _perfect(h=20, w=30, box=(5, 4, 10, 6)):
    mask = boxes_to_mask([box], h, w)
    return np.where(mask, 1.0, -1.0), mask


def test_boxes_to_mask_half_open_union_and_clipping():
    m = boxes_to_mask([(2, 3, 4, 2)], 10, 10)
    assert m.sum() == 8
    assert m[3:5, 2:6].all() and not m[5, 2] and not m[3, 6]
    u = boxes_to_mask([(0, 0, 4, 4), (2, 2, 4, 4)], 10, 10)
    assert u.sum() == 16 + 16 - 4  # union, not sum
    assert boxes_to_mask([(8, 8, 5, 5)], 10, 10).sum() == 4  # clipped to the image
    assert boxes_to_mask([(-3, 0, 5, 1)], 10, 10).sum() == 2
    assert boxes_to_mask([(1.5, 1.2, 1.0, 1.0)], 10, 10).sum() == 4  # fractional: touched pixels
    assert boxes_to_mask([], 4, 4).sum() == 0
    with pytest.raises(ValueError):
        boxes_to_mask([(0, 0, -1, 2)], 4, 4)


def test_thresholds_are_the_papers():
    assert DEFAULT_THRESHOLDS.size == 41
    assert DEFAULT_THRESHOLDS[0] == -1.0 and DEFAULT_THRESHOLDS[-1] == 1.0
    assert np.allclose(np.diff(DEFAULT_THRESHOLDS), 0.05)
    assert 0.15 in DEFAULT_THRESHOLDS and 0.0 in DEFAULT_THRESHOLDS  # exact decimals


def test_perfect_map_cnr_inf_and_iou_one():
    sim, mask = _perfect()
    assert cnr(sim, mask) == math.inf  # both variances 0, means differ: documented inf
    value, ious = miou(sim, mask, return_per_threshold=True)
    # map >= t equals the box for every t in (-1, 1]; at t = -1 everything is predicted
    assert np.all(ious[1:] == 1.0)
    assert ious[0] == pytest.approx(mask.sum() / mask.size)
    assert value == pytest.approx((40 + mask.sum() / mask.size) / 41)
    assert iou_per_threshold(sim, mask, [0.0]).tolist() == [1.0]
    # a perfect but noisy map: large, finite CNR
    noisy = sim + np.random.default_rng(0).normal(0, 0.01, sim.shape)
    assert 50 < cnr(noisy, mask) < math.inf


def test_constant_map_cnr_zero():
    _, mask = _perfect()
    assert cnr(np.full(mask.shape, 0.3), mask) == 0.0
    assert cnr(np.zeros(mask.shape), mask) == 0.0
    # IoU of a constant map: full prediction (area ratio) below it, empty above
    ious = iou_per_threshold(np.full(mask.shape, 0.3), mask, [0.2, 0.3, 0.4])
    assert ious.tolist() == [pytest.approx(mask.mean()), pytest.approx(mask.mean()), 0.0]


def test_cnr_matches_bruteforce_float64():
    rng = np.random.default_rng(1)
    for _trial in range(5):
        h, w = rng.integers(10, 60, size=2)
        sim = rng.normal(rng.normal(), rng.uniform(0.1, 2), size=(h, w)).astype(np.float32)
        sim[rng.random((h, w)) < 0.15] = np.nan
        boxes = [(rng.integers(0, w - 3), rng.integers(0, h - 3), rng.integers(1, 8), rng.integers(1, 8)) for _ in range(2)]
        mask = boxes_to_mask(boxes, h, w)
        inside = [float(sim[i, j]) for i in range(h) for j in range(w) if mask[i, j] and not np.isnan(sim[i, j])]
        outside = [float(sim[i, j]) for i in range(h) for j in range(w) if not mask[i, j] and not np.isnan(sim[i, j])]
        if not inside:
            continue
        mi, mo = sum(inside) / len(inside), sum(outside) / len(outside)
        vi = sum((x - mi) ** 2 for x in inside) / len(inside)
        vo = sum((x - mo) ** 2 for x in outside) / len(outside)
        assert cnr(sim, mask) == pytest.approx(abs(mi - mo) / math.sqrt(vi + vo), rel=1e-10)


def test_miou_matches_bruteforce_thresholding():
    rng = np.random.default_rng(2)
    sim = np.clip(rng.normal(0, 0.5, (25, 35)), -1, 1)
    sim[rng.random(sim.shape) < 0.1] = np.nan
    mask = boxes_to_mask([(3, 4, 10, 8), (20, 10, 6, 9)], 25, 35)
    valid = ~np.isnan(sim)
    expected = []
    for t in DEFAULT_THRESHOLDS:
        pred = (np.nan_to_num(sim, nan=-np.inf) >= t) & valid
        gt = mask & valid
        expected.append((pred & gt).sum() / (pred | gt).sum())
    value, ious = miou(sim, mask, return_per_threshold=True)
    np.testing.assert_allclose(ious, expected)
    assert value == pytest.approx(np.mean(expected))


def test_nan_pixels_are_ignored():
    sim, mask = _perfect()
    sim = sim + np.random.default_rng(3).normal(0, 0.1, sim.shape)
    holed = sim.copy()
    holed[:, :3] = np.nan  # outside the box
    holed[4, 5] = np.nan  # inside the box
    keep = ~np.isnan(holed)
    # same as computing on the kept pixels only
    ref_in, ref_out = sim[mask & keep], sim[~mask & keep]
    ref = abs(ref_in.mean() - ref_out.mean()) / math.sqrt(ref_in.var() + ref_out.var())
    assert cnr(holed, mask) == pytest.approx(ref)
    # NaN inside the box is removed from the mask too: with the rest perfect, IoU stays 1
    perfect, _ = _perfect()
    perfect[4, 5] = np.nan
    perfect[0, :] = np.nan
    assert np.all(iou_per_threshold(perfect, mask, [-0.5, 0.0, 0.5, 1.0]) == 1.0)
    # box entirely in NaN: undefined -> NaN, no warning
    allnan = sim.copy()
    allnan[mask] = np.nan
    with np.errstate(all="raise"):
        assert math.isnan(cnr(allnan, mask))
        assert math.isnan(miou(allnan, mask))


def test_grounding_scores_and_shape_errors():
    sim, mask = _perfect()
    out = grounding_scores(sim, [(5, 4, 10, 6)])
    assert out["CNR"] == math.inf and out["mIoU"] == pytest.approx(miou(sim, mask))
    with pytest.raises(ValueError):
        cnr(sim, mask[:-1])


def test_category_macro_average():
    res = category_macro_average([1.0, 3.0, 10.0, np.nan], ["A", "A", "B", "B"])
    assert res["per_category"] == {"A": 2.0, "B": 10.0}
    assert res["macro"] == 6.0 and res["micro"] == pytest.approx(14 / 3)
    assert res["count"] == {"A": 2, "B": 1} and res["n_nan"] == {"A": 0, "B": 1}


# --------------------------------------------------------------------------- upsampling


def test_upsample_known_grid_matches_torch_and_nan_outside_crop():
    # original 100x80 -> shorter side 80 -> 40 (scale 1/2): resized 50x40; centre crop 32:
    # offsets (9, 4) in resized px = rows 18..81, cols 8..71 of the original.
    geo = CropGeometry.from_resize_crop((100, 80), 40, 32)
    assert (geo.resize_h, geo.resize_w, geo.crop_top, geo.crop_left) == (50, 40, 9, 4)
    grid = np.arange(16, dtype=np.float64).reshape(4, 4) / 8 - 1
    out = upsample_map(grid, geo, (100, 80), smooth_sigma=0)
    assert out.shape == (100, 80)
    nan = np.isnan(out)
    expected_nan = np.ones((100, 80), dtype=bool)
    expected_nan[18:82, 8:72] = False
    assert np.array_equal(nan, expected_nan)
    assert geo.crop_slices() == (slice(18, 82), slice(8, 72))
    ref = torch.nn.functional.interpolate(
        torch.tensor(grid)[None, None], size=(64, 64), mode="bilinear", align_corners=False
    )[0, 0].numpy()
    np.testing.assert_allclose(out[18:82, 8:72], ref, atol=1e-6)
    near = upsample_map(grid, geo, mode="nearest", smooth_sigma=None)
    ref_n = torch.nn.functional.interpolate(torch.tensor(grid)[None, None], size=(64, 64), mode="nearest-exact")[0, 0]
    np.testing.assert_array_equal(near[18:82, 8:72], ref_n.numpy())
    with pytest.raises(ValueError):
        upsample_map(grid, geo, (99, 80), smooth_sigma=0)


def test_upsample_biovil_geometry_and_constant_grid():
    # docs/evaluation.md section 1.1's example: 2544x3056 (WxH), resize 512, crop 480: crop side 2385 px.
    geo = CropGeometry.from_resize_crop((3056, 2544), 512, 480)
    rows, cols = geo.crop_slices()
    assert cols == slice(79, 2464)  # same as hi-ml: floor((2544-2385)/2) = 79
    assert rows == slice(333, 2718)  # training's crop (resized row 67); hi-ml's square starts at 335
    out = upsample_map(np.full((15, 15), 0.25), geo)  # default: BioViL smoothing
    assert np.all(out[rows, cols] == np.float32(0.25))
    assert np.isnan(out).sum() == out.size - 2385 * 2385
    grid = np.random.default_rng(7).uniform(-1, 1, (15, 15))
    np.testing.assert_array_equal(upsample_map(grid, geo), upsample_map(smooth_map(grid, 1.5), geo, smooth_sigma=0))
    # no crop: no NaN at all
    assert not np.isnan(upsample_map(np.zeros((4, 5)), CropGeometry.from_resize_crop((40, 50), 8, None))).any()


def test_smooth_map_is_biovil_gaussian():
    g = np.zeros((15, 15))
    g[7, 7] = 1.0
    s = smooth_map(g)
    assert s.sum() == pytest.approx(1.0) and s[7, 7] < 0.1 and s.argmax() == 7 * 15 + 7
    assert np.array_equal(smooth_map(g, 0), g)


# =========================================================================== retrieval


def test_identity_scores_are_perfect():
    res = retrieval_metrics(np.eye(200))
    assert res == {"R@10": 1.0, "R@50": 1.0, "R@100": 1.0, "MedR": 1.0}


def test_reversed_ranks_are_worst():
    n = 120
    s = -np.eye(n) + np.random.default_rng(0).uniform(0, 0.5, (n, n)) * (1 - np.eye(n))  # correct one lowest
    r = ranks(s)
    assert np.all(r == n)
    res = retrieval_metrics(s)
    assert res["R@10"] == 0.0 and res["R@100"] == 0.0 and res["MedR"] == n


def test_ranks_match_argsort_without_ties():
    rng = np.random.default_rng(4)
    s = rng.normal(size=(300, 300))
    order = np.argsort(-s, axis=1)
    expected = np.argmax(order == np.arange(300)[:, None], axis=1) + 1
    np.testing.assert_array_equal(ranks(s), expected)
    np.testing.assert_array_equal(ranks(s, ties="optimistic"), expected)
    res = retrieval_metrics(s)
    assert res["R@10"] == pytest.approx(np.mean(expected <= 10))
    assert res["MedR"] == np.median(expected)


def test_ties_pessimistic_by_default():
    s = np.zeros((50, 50))  # every candidate ties
    assert np.all(ranks(s) == 50) and retrieval_metrics(s)["R@10"] == 0.0
    assert np.all(ranks(s, ties="optimistic") == 1) and retrieval_metrics(s, ties="optimistic")["MedR"] == 1.0
    s = np.array([[1.0, 1.0, 0.0], [2.0, 1.0, 1.0], [0.0, 3.0, 3.0]])
    assert ranks(s).tolist() == [2, 3, 2]
    assert ranks(s, ties="optimistic").tolist() == [1, 2, 1]


def test_rectangular_distractors_and_bad_input():
    s = np.hstack([np.eye(5), np.full((5, 20), 0.5)])
    assert np.all(ranks(s) == 1)
    with pytest.raises(ValueError):
        ranks(np.zeros((5, 3)))
    with pytest.raises(ValueError):
        ranks(np.array([[np.nan, 0.0], [0.0, 1.0]]))


def test_bidirectional_uses_transpose_and_paper_summary():
    # image 0's correct text ranks 2nd; text 0's correct image ranks 1st
    s = np.array([[0.5, 0.9, 0.0], [0.1, 0.8, 0.0], [0.0, 0.0, 1.0]])
    res = bidirectional_retrieval(s, ks=(1, 2))
    assert res["i2t/R@1"] == pytest.approx(2 / 3) and res["t2i/R@1"] == pytest.approx(2 / 3)
    assert ranks(s).tolist() == [2, 1, 1] and ranks(s.T).tolist() == [1, 2, 1]
    assert res["Recall"] == pytest.approx(np.mean([2 / 3, 1, 2 / 3, 1]))
    assert res["MedR"] == 1.0
    with pytest.raises(ValueError):
        bidirectional_retrieval(np.zeros((3, 4)))


# =========================================================================== zero-shot


def test_paper_prompts_are_table_2():
    assert tuple(PAPER_PROMPTS) == CHEX5
    assert PAPER_PROMPTS["Pneumonia"] == {"negative": ["No signs of pneumonia"], "positive": ["Findings suggesting pneumonia"]}
    assert PAPER_PROMPTS["Cardiomegaly"]["negative"] == ["Heart size normal"]
    assert PAPER_PROMPTS["Pleural Effusion"]["positive"] == ["Pleural effusions"]


def test_load_prompts_yaml_json_and_errors(tmp_path):
    y = tmp_path / "p.yaml"
    y.write_text("Cardiomegaly:\n  positive: [Cardiomegaly, The heart is enlarged]\n  negative: Heart size normal\n")
    assert load_prompts(y) == {
        "Cardiomegaly": {"positive": ["Cardiomegaly", "The heart is enlarged"], "negative": ["Heart size normal"]}
    }
    j = tmp_path / "p.json"
    j.write_text(json.dumps(PAPER_PROMPTS))
    assert load_prompts(j) == PAPER_PROMPTS
    bad = tmp_path / "bad.yaml"
    bad.write_text("Edema:\n  positive: [x]\n")
    with pytest.raises(PromptFileError, match="bad.yaml.*Edema"):
        load_prompts(bad)
    with pytest.raises(MedclrError, match="cannot read"):
        load_prompts(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(PromptFileError, match="not valid JSON"):
        load_prompts(broken)


def test_prompt_embedding_is_mean_then_normalised():
    e = np.array([[3.0, 0.0], [0.0, 1.0]])
    np.testing.assert_allclose(class_text_embedding(e), np.array([1.5, 0.5]) / np.linalg.norm([1.5, 0.5]))
    img = np.array([[1.0, 0.0], [0.0, 2.0]])
    pos, neg = cosine_zero_shot_scores(img, {"A": (e, np.array([[0.0, 1.0]]))})
    assert pos.shape == (2, 1)
    assert neg[:, 0].tolist() == pytest.approx([0.0, 1.0])


def _labels(n=400, c=5, seed=0):
    rng = np.random.default_rng(seed)
    y = (rng.random((n, c)) < 0.3).astype(np.float64)
    return y


def test_zero_shot_perfect_and_random():
    y = _labels()
    pos, neg = y.copy(), np.zeros_like(y)  # positive prompt wins exactly for positives
    res = zero_shot_metrics(pos, neg, y, n_boot=50)
    for cls in CHEX5:
        assert res["per_class"][cls]["AUC"] == 1.0 and res["per_class"][cls]["ACC"] == 1.0
    assert res["macro"]["AUC"] == 1.0
    rng = np.random.default_rng(1)
    big = _labels(4000, 5, seed=2)
    res = zero_shot_metrics(rng.normal(size=big.shape), rng.normal(size=big.shape), big, n_boot=0)
    assert abs(res["macro"]["AUC"] - 0.5) < 0.03
    assert math.isnan(res["macro"]["AUC_CI"][0])  # no bootstrap requested


def test_zero_shot_matches_sklearn_and_ignores_uncertain():
    rng = np.random.default_rng(5)
    y = _labels(300, 5, seed=5)
    pos = rng.normal(size=y.shape) + y
    neg = rng.normal(size=y.shape)
    y[rng.random(y.shape) < 0.15] = -1
    y[rng.random(y.shape) < 0.1] = np.nan
    res = zero_shot_metrics(pos, neg, y, n_boot=0)
    for j, cls in enumerate(CHEX5):
        v = np.isin(y[:, j], (0, 1))
        assert res["per_class"][cls]["n"] == v.sum()
        assert res["per_class"][cls]["AUC"] == pytest.approx(roc_auc_score(y[v, j], pos[v, j] - neg[v, j]))
        assert res["per_class"][cls]["ACC"] == pytest.approx(accuracy_score(y[v, j], pos[v, j] > neg[v, j]))
    assert res["macro"]["AUC"] == pytest.approx(np.mean([res["per_class"][c]["AUC"] for c in CHEX5]))


def test_zero_shot_bootstrap_ci_and_vectorised_auc():
    from medclr.metrics import _bootstrap_auc

    rng = np.random.default_rng(6)
    y = _labels(250, 5, seed=6)
    pos = rng.normal(size=y.shape) + 0.8 * y
    neg = rng.normal(size=y.shape)
    y[rng.random(y.shape) < 0.1] = -1
    res = zero_shot_metrics(pos, neg, y, n_boot=400, seed=3)
    for cls in CHEX5:
        r = res["per_class"][cls]
        assert r["AUC_CI"][0] <= r["AUC"] <= r["AUC_CI"][1]
        assert r["ACC_CI"][0] <= r["ACC"] <= r["ACC_CI"][1]
        assert r["AUC_CI"][1] - r["AUC_CI"][0] < 0.3
    assert res["macro"]["AUC_CI"][0] <= res["macro"]["AUC"] <= res["macro"]["AUC_CI"][1]
    assert zero_shot_metrics(pos, neg, y, n_boot=400, seed=3) == res  # seeded
    # the vectorised resample AUC equals sklearn's on the same resample (ties included)
    score = np.round(pos[:, 0] - neg[:, 0], 1)
    idx = rng.integers(0, 250, size=(20, 250))
    valid = np.isin(y[idx, 0], (0, 1))
    yy = np.where(valid, y[idx, 0], 0).astype(int)
    got = _bootstrap_auc(score[idx], yy, valid)
    for b in range(20):
        assert got[b] == pytest.approx(roc_auc_score(yy[b][valid[b]], score[idx[b]][valid[b]]))
    # a class with one label value in the data: AUC NaN, left out of the macro
    y1 = y.copy()
    y1[:, 4] = 0
    res1 = zero_shot_metrics(pos, neg, y1, n_boot=20)
    assert math.isnan(res1["per_class"]["Pneumothorax"]["AUC"]) and not math.isnan(res1["macro"]["AUC"])
    assert res1["per_class"]["Pneumothorax"]["n_boot_AUC"] == 0
    assert res1["macro"]["AUC_left_out"] == ["Pneumothorax"] and len(res1["macro"]["AUC_classes"]) == 4
    # and the report says so: the zero-shot task's note names the class and the count
    from medclr.evaluation.task_zeroshot import ZeroShot

    block = dict(res1, classes=list(CHEX5))
    (note,) = ZeroShot().notes(block)
    assert "Pneumothorax (250 usable labels, 0 positive)" in note and "over 4 of 5 classes" in note
    assert ZeroShot().notes(dict(res, classes=list(CHEX5))) == []


def test_zero_shot_rejects_bad_labels():
    with pytest.raises(ValueError):
        zero_shot_metrics(np.zeros((3, 5)), np.zeros((3, 5)), np.full((3, 5), 2.0), n_boot=0)


# =========================================================================== probe + plots


def _separable(n, seed, d=8, c=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    x = rng.normal(size=(n, d))
    x[np.arange(n), y] += 4.0
    return x, y


def test_subsample_keeps_a_positive_per_class():
    y = np.zeros((500, 3))
    y[:5, 0] = 1  # rare class: 1 % positives
    y[:250, 1] = 1
    y[::2, 2] = np.nan
    y[1::4, 2] = 1
    idx = subsample_indices(y, 0.01, seed=0)
    assert 5 <= idx.size <= 5 + 6
    for j in range(3):
        assert (y[idx, j] == 1).any() and (y[idx, j] == 0).any()
    assert np.array_equal(idx, subsample_indices(y, 0.01, seed=0))
    assert subsample_indices(y, 1.0).size == 500
    yc = np.repeat(np.arange(10), 50)
    idx = subsample_indices(yc, 0.1, seed=1)
    assert idx.size == 50 and np.all(np.bincount(yc[idx]) == 5)  # stratified


def test_linear_probe_on_separable_data():
    xtr, ytr = _separable(600, 0)
    xte, yte = _separable(300, 1)
    res = linear_probe(xtr, ytr, xte, yte, ["a", "b", "c"], seed=0)
    assert list(res) == ["1%", "10%", "100%"]
    assert res["1%"]["n_train"] >= 6
    assert res["100%"]["macro_AUC"] > 0.99 and res["100%"]["accuracy"] > 0.95
    assert set(res["10%"]["per_class"]) == {"a", "b", "c"}
    # multi-label CheXpert-style labels with uncertain entries
    ml = np.stack([(ytr == k).astype(float) for k in range(3)], axis=1)
    ml[::7, 0] = -1
    ml_te = np.stack([(yte == k).astype(float) for k in range(3)], axis=1)
    res = linear_probe(xtr, ml, xte, ml_te, fractions=(0.1, 1.0))
    assert res["100%"]["macro_AUC"] > 0.99 and "accuracy" not in res["100%"]


def test_tsne_and_figures_write_png(tmp_path):
    from medclr.evaluation.plots import figure_to_png, plot_heatmap_panel, plot_roc_curves

    x, y = _separable(60, 2)
    fig, emb = plot_tsne(x, y, tmp_path / "tsne.png", seed=0)
    assert emb.shape == (60, 2) and (tmp_path / "tsne.png").read_bytes()[:8] == PNG_MAGIC
    _, emb2 = plot_tsne(x, y, seed=0)
    np.testing.assert_allclose(emb, emb2)  # seeded
    yl = _labels(80, 2)
    fig = plot_roc_curves(np.random.default_rng(0).normal(size=(80, 2)) + yl, yl, ["A", "B"], tmp_path / "roc.png")
    assert (tmp_path / "roc.png").read_bytes()[:8] == PNG_MAGIC
    geo = CropGeometry.from_resize_crop((60, 50), 16, 14)
    sim = upsample_map(np.random.default_rng(0).uniform(-1, 1, (4, 4)), geo)
    fig = plot_heatmap_panel(np.random.default_rng(1).random((60, 50)), sim, [(10, 12, 15, 20)], tmp_path / "h.png",
                             threshold=0.2)
    assert (tmp_path / "h.png").stat().st_size > 1000
    assert figure_to_png(fig)[:8] == PNG_MAGIC
