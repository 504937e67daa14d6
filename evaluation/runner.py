"""`medclr eval`: checkpoint + data -> metrics.json, phrases.csv, report.md and figures.

One pass encodes every image needed (test split for zero-shot and the probe, train split for the
probe, MS-CXR images for grounding and retrieval); the tasks then work on the stored features with
the pure metric functions of ``medclr.evaluation.grounding/retrieval/zeroshot/probe``. Choices made here
(written down in ``docs/evaluation.md``, section "The runner"):

* zero-shot score = the checkpoint's own image-sentence score (its similarity head, what the loss
  was trained on; for a cosine head that is ``zeroshot.zero_shot_scores`` on global embeddings);
* grounding map = the head's region-sentence cosines, ``upsample_map`` with the exact resize/crop
  geometry of ``medclr.inference`` preprocessing (BioViL smoothing 1.5 cells), at original size;
* retrieval = RoIAlign (``torchvision.ops.roi_align``, aligned, 3x3 bins, 2x2 samples per bin) of
  the region features the head compares with text (after the non-local block for LSE+NL), one
  vector per box, the unnormalised mean over the phrase's boxes, L2-normalised; scores are its
  cosines with the phrase embeddings (query = box feature for image->text);
* controls (the protocol must not be gameable): labels shuffled across images for zero-shot, each
  phrase's map recomputed with a phrase of another image for grounding, the analytic chance level
  (K/n, (n+1)/2) for retrieval, training labels shuffled for the probe.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from medclr.evaluation import grounding as G
from medclr.inference.engine import MIN_MAP_RANGE, map_range
from medclr.evaluation.data import (EvalData, Encoded, Model, Phrases, control_pairs, encode, has_two_label_values,
                             labels, phrases, prompt_set, split_rows, top_classes)
from medclr.errors import MedclrError

log = logging.getLogger(__name__)
__all__ = ["TASKS", "Encoded", "Model", "box_feature", "encode", "evaluate", "ground_one", "retrieval_scores",
           "text_level_retrieval"]
TASKS = ("zeroshot", "grounding", "retrieval", "probe")
ROI_BINS, ROI_SAMPLES = 3, 2
LATENT_TOP = 10  # latent-class probe: the most frequent classes


# --------------------------------------------------------------------------- tasks


def zeroshot_task(enc: Encoded, data: EvalData, test_rows: np.ndarray, prompts, n_boot: int, seed: int) -> dict:
    from medclr.evaluation.zeroshot import zero_shot_metrics

    classes = list(prompts)
    p = enc.take(test_rows)
    y = labels(data, enc.rows[p], classes)
    res = zero_shot_metrics(enc.s_pos[p], enc.s_neg[p], y, classes, n_boot=n_boot, seed=seed)
    shuffled = y[np.random.default_rng(seed).permutation(len(y))]
    ctl = zero_shot_metrics(enc.s_pos[p], enc.s_neg[p], shuffled, classes, n_boot=0)
    res.update(n_images=int(p.size), classes=classes,
               control_shuffled_labels={"AUC": ctl["macro"]["AUC"], "ACC": ctl["macro"]["ACC"],
                                        "per_class_AUC": {c: v["AUC"] for c, v in ctl["per_class"].items()}})
    res["_scores"] = (enc.s_pos[p] - enc.s_neg[p], y)  # for the ROC figure; dropped from metrics.json
    return res


def ground_one(grid: np.ndarray, geo: G.CropGeometry, boxes: np.ndarray) -> tuple[float, float]:
    """CNR and mIoU of one phrase: grid -> original-size map (pinned protocol) vs the union of boxes."""
    sim_map = G.upsample_map(grid, geo)
    mask = G.boxes_to_mask(boxes, geo.original_h, geo.original_w)
    return G.cnr(sim_map, mask), G.miou(sim_map, mask)


def grounding_task(model: Model, enc: Encoded, ph: Phrases, text: torch.Tensor, seed: int) -> tuple[dict, pd.DataFrame]:
    ctl = control_pairs(ph, seed)
    n = len(ph)
    out = {k: np.full(n, np.nan) for k in ("CNR", "mIoU", "CNR_control", "mIoU_control", "map_range")}
    by_image = ph.table.groupby("index", sort=True).indices
    for idx, ks in tqdm(by_image.items(), desc="grounding", unit="img", total=len(by_image)):
        if int(idx) not in enc.regions:
            continue
        h, w = enc.sizes[int(idx)]
        geo = model.geometry(h, w)
        grids = model.region_scores(enc.regions[int(idx)], torch.cat([text[ks], text[ctl[ks]]]))
        for j, k in enumerate(ks):
            boxes = ph.boxes_for(k, h, w)
            out["CNR"][k], out["mIoU"][k] = ground_one(grids[j], geo, boxes)
            out["map_range"][k] = map_range(G.smooth_map(grids[j]))  # what the app shows, before painting
            out["CNR_control"][k], out["mIoU_control"][k] = ground_one(grids[len(ks) + j], geo, boxes)
    cats = ph.table["category"].tolist()
    res = {k: G.category_macro_average(v, cats) for k, v in out.items() if k != "map_range"}
    res["flat_maps"] = flat_map_summary(out["map_range"], out["CNR"])
    res["n_phrases"], res["n_images"] = n, len(by_image)
    res["n_boxes"] = int(sum(len(b) for b in ph.boxes))
    per = pd.DataFrame(out)
    per["control_phrase"] = ph.table["text"].to_numpy()[ctl]
    return res, per


def flat_map_summary(ranges: np.ndarray, cnr: np.ndarray) -> dict:
    """How many phrase maps the app would refuse to paint (smoothed range < MIN_MAP_RANGE), and the
    range that localised matches (CNR >= 1) produce: the calibration of the threshold."""
    ok = np.isfinite(ranges)
    localised = ok & (np.nan_to_num(cnr, nan=0.0) >= 1.0)
    q = lambda v: [round(float(x), 4) for x in np.quantile(v, (0.05, 0.5, 0.95))] if v.size else None  # noqa: E731
    return {"threshold": MIN_MAP_RANGE, "n_flat": int((ranges[ok] < MIN_MAP_RANGE).sum()), "n": int(ok.sum()),
            "range_q05_q50_q95": q(ranges[ok]), "n_localised": int(localised.sum()),
            "localised_range_q05_q50_q95": q(ranges[localised])}


def box_feature(regions: torch.Tensor, boxes_xywh: np.ndarray, geo: G.CropGeometry) -> tuple[torch.Tensor, int]:
    """One D vector for a phrase: RoIAlign of each box on the (D, h, w) region features, mean over
    boxes (unnormalised). Boxes are mapped original px -> resized px -> crop px -> grid cells and
    clipped to the crop; a box wholly outside it becomes a thin strip at the nearest crop edge
    (counted in the second return value)."""
    from torchvision.ops import roi_align

    d, gh, gw = regions.shape
    crop = geo.boxes_to_crop(boxes_xywh)  # medclr.geometry: the crop training and inference cut
    x1, x2 = np.clip(crop[:, [0, 2]], 0, geo.crop_w).T
    y1, y2 = np.clip(crop[:, [1, 3]], 0, geo.crop_h).T
    outside = int(((x2 - x1) <= 0).sum() + ((y2 - y1) <= 0).sum() > 0) if crop.size else 0
    # a degenerate box keeps a minimal extent of 1 crop pixel inside the window
    x1, y1 = np.minimum(x1, geo.crop_w - 1), np.minimum(y1, geo.crop_h - 1)
    x2, y2 = np.maximum(x2, x1 + 1), np.maximum(y2, y1 + 1)
    cells = np.stack([x1 * gw / geo.crop_w, y1 * gh / geo.crop_h, x2 * gw / geo.crop_w, y2 * gh / geo.crop_h], 1)
    rois = torch.as_tensor(cells, dtype=regions.dtype, device=regions.device)
    pooled = roi_align(regions[None], [rois], output_size=ROI_BINS, spatial_scale=1.0,
                       sampling_ratio=ROI_SAMPLES, aligned=True)  # (n_boxes, D, bins, bins)
    return pooled.mean(dim=(0, 2, 3)), outside


def retrieval_scores(box_feats: torch.Tensor, text: torch.Tensor) -> np.ndarray:
    """scores[phrase box feature, phrase sentence] = cosine (rows: image side, columns: text)."""
    a = torch.nn.functional.normalize(box_feats.float(), dim=-1)
    return (a @ torch.nn.functional.normalize(text.float(), dim=-1).T).cpu().numpy().astype(np.float64)


def text_level_retrieval(s: np.ndarray, texts, ks=(10, 50, 100)) -> dict:
    """Retrieval where identical phrase texts are one candidate (CXR-Phantom repeats template sentences).

    Image->text: each box feature ranks the DISTINCT texts (pessimistic ties). Text->image: each distinct
    text ranks the boxes; its rank is that of its best box among those whose phrase has this text.
    Chance R@K: K/U for i2t (U distinct texts); for t2i, 1 - C(n-g, K)/C(n, K) averaged over texts
    (g = boxes with the text: no correct box among K drawn at random)."""
    from scipy.special import gammaln

    codes, uniq = pd.factorize(pd.Series(list(texts)))
    n, u = len(codes), len(uniq)
    first = np.array([np.flatnonzero(codes == c)[0] for c in range(u)])
    a = s[:, first]  # (n boxes, u texts); duplicates have identical columns
    correct = a[np.arange(n), codes]
    i2t = np.count_nonzero(a >= correct[:, None], axis=1)  # 1-based, the correct one counted once
    t2i = np.empty(u, np.int64)
    for c in range(u):
        col, mine = a[:, c], codes == c
        t2i[c] = 1 + np.count_nonzero(col[~mine] >= col[mine].max())
    g = np.bincount(codes, minlength=u)

    def p_hit(k: int) -> float:  # P(at least one of the g correct boxes among k random ones)
        if k >= n:
            return 1.0
        lc = lambda a_, b_: gammaln(a_ + 1) - gammaln(b_ + 1) - gammaln(a_ - b_ + 1)  # noqa: E731
        return float(np.mean([1.0 if n - gi < k else 1.0 - np.exp(lc(n - gi, k) - lc(n, k)) for gi in g]))

    out = {"n_texts": int(u)}
    for name, r in (("i2t", i2t), ("t2i", t2i)):
        out.update({f"{name}/R@{k}": float(np.mean(r <= k)) for k in ks})
        out[f"{name}/MedR"] = float(np.median(r))
    out["Recall"] = float(np.mean([out[f"{d}/R@{k}"] for d in ("i2t", "t2i") for k in ks]))
    out["MedR"] = (out["i2t/MedR"] + out["t2i/MedR"]) / 2.0
    out["chance"] = {**{f"i2t/R@{k}": min(k, u) / u for k in ks}, **{f"t2i/R@{k}": p_hit(k) for k in ks}}
    out["chance"]["Recall"] = float(np.mean(list(out["chance"].values())))
    return out


def retrieval_task(model: Model, enc: Encoded, ph: Phrases, text: torch.Tensor) -> tuple[dict, pd.DataFrame, np.ndarray]:
    from medclr.evaluation.retrieval import DEFAULT_KS, bidirectional_retrieval, ranks

    keep = [k for k in range(len(ph)) if int(ph.table["index"].iat[k]) in enc.regions]
    feats, n_out = [], 0
    by_image = ph.table.iloc[keep].groupby("index", sort=True).indices
    order = []
    for idx, local in tqdm(by_image.items(), desc="retrieval: RoIAlign", unit="img", total=len(by_image)):
        h, w = enc.sizes[int(idx)]
        geo = model.geometry(h, w)
        ctx = model.compared_regions(enc.regions[int(idx)][None])[0]
        for j in local:
            k = keep[j]
            f, o = box_feature(ctx, ph.boxes_for(k, h, w), geo)
            feats.append(f)
            order.append(k)
            n_out += o
    order = np.asarray(order, dtype=np.int64)
    s = retrieval_scores(torch.stack(feats), text[order])
    res = bidirectional_retrieval(s)
    n = len(order)
    res["n_phrases"], res["n_phrases_box_outside_crop"] = n, int(n_out)
    res["n_duplicate_texts"] = int(n - ph.table["text"].iloc[order].nunique())
    res["chance"] = {**{f"R@{k}": min(k, n) / n for k in DEFAULT_KS}, "MedR": (n + 1) / 2.0}
    res["chance"]["Recall"] = float(np.mean([res["chance"][f"R@{k}"] for k in DEFAULT_KS]))
    res["text_level"] = text_level_retrieval(s, ph.table["text"].to_numpy()[order])
    per = pd.DataFrame({"i2t_rank": np.zeros(len(ph), np.int64), "t2i_rank": np.zeros(len(ph), np.int64)})
    per.loc[order, "i2t_rank"] = ranks(s)
    per.loc[order, "t2i_rank"] = ranks(s.T)
    return res, per, (order, s)


def probe_task(enc: Encoded, data: EvalData, train_rows: np.ndarray, test_rows: np.ndarray, classes: list[str],
               seed: int) -> dict:
    from medclr.evaluation.probe import linear_probe

    ptr, pte = enc.take(train_rows), enc.take(test_rows)
    xtr, xte = enc.glob[ptr], enc.glob[pte]
    res: dict[str, Any] = {"n_train": int(ptr.size), "n_test": int(pte.size), "_tsne": None}
    ytr, yte = labels(data, enc.rows[ptr], classes), labels(data, enc.rows[pte], classes)
    if has_two_label_values(ytr) and has_two_label_values(yte):
        res["chex5"] = linear_probe(xtr, ytr, xte, yte, classes, seed=seed)
        shuffled = ytr[np.random.default_rng(seed).permutation(len(ytr))]
        res["control_shuffled_labels"] = linear_probe(xtr, shuffled, xte, yte, classes, fractions=(1.0,), seed=seed)["100%"]
    if "latent_class" in data.manifest.columns:
        # the phantom's latent classes are many and mostly rare: probe the 10 most frequent (>= 5 train images)
        lc = data.manifest["latent_class"].fillna("").astype(str).to_numpy()
        ltr, lte = lc[enc.rows[ptr]], lc[enc.rows[pte]]
        top = top_classes(ltr, LATENT_TOP)
        code = {c: j for j, c in enumerate(top)}
        mtr, mte = np.isin(ltr, top), np.isin(lte, top)
        if len(top) > 1 and len(set(lte[mte])) > 1:
            res["latent_class"] = linear_probe(xtr[mtr], np.array([code[c] for c in ltr[mtr]]), xte[mte],
                                               np.array([code[c] for c in lte[mte]]), top, seed=seed)
            res["latent_class"]["n_train"], res["latent_class"]["n_test"] = int(mtr.sum()), int(mte.sum())
        res["_tsne"] = (xte, np.where(np.isin(lte, top[:9]), lte, "other"))
    return res


# --------------------------------------------------------------------------- orchestration


def _available(data: EvalData, test_rows: np.ndarray, train_rows: np.ndarray, ph: Phrases, classes: list[str]) -> dict:
    y = labels(data, test_rows, classes) if test_rows.size else np.zeros((0, len(classes)))
    return {"zeroshot": test_rows.size > 0 and has_two_label_values(y),
            "grounding": len(ph) > 0, "retrieval": len(ph) > 1, "probe": test_rows.size > 0 and train_rows.size > 1}


def evaluate(checkpoint: str, data_path: str, out: str, *, tasks: list[str] | None = None, split: str = "test",
             prompts_file: str | None = None, max_images: int | None = None, max_train_images: int | None = 2000,
             max_phrases: int | None = None, mscxr_split: str = "auto", batch_size: int = 32, workers: int = 0,
             device: str = "cpu", n_boot: int = 1000, seed: int = 0, figures: bool = True,
             compare: dict[str, str] | None = None) -> dict:
    """Run the evaluation and write ``out``/metrics.json, phrases.csv, report.md, figures/*.png."""
    from medclr.evaluation.data import load_eval_data
    from medclr.evaluation.diagnostics import zeroshot_diagnostics
    from medclr.evaluation.report import jsonable, read_summary, summary, write_report

    t0 = time.perf_counter()
    compared = {label: read_summary(path) for label, path in (compare or {}).items()}
    data = load_eval_data(data_path)
    prompts = prompt_set(prompts_file)
    classes = list(prompts)
    test_rows = split_rows(data, split, max_images, seed)
    train_rows = split_rows(data, "train", max_train_images, seed) if split != "train" else np.zeros(0, np.int64)
    ph = phrases(data, mscxr_split, max_phrases, seed, rows=test_rows)
    avail = _available(data, test_rows, train_rows, ph, classes)
    wanted = list(TASKS) if not tasks else list(tasks)
    if tasks:
        missing = [t for t in wanted if not avail[t]]
        if missing:
            why = {"zeroshot": f"no {split} images with 1/0 labels for {classes}", "grounding": "no MS-CXR phrases",
                   "retrieval": "fewer than 2 MS-CXR phrases", "probe": f"no train and {split} images"}
            raise MedclrError(f"--tasks {missing[0]}: not available on {data.source} ({why[missing[0]]})")
    run = [t for t in wanted if avail[t]]
    notes = list(data.notes) + [f"task {t} skipped: not available on this data" for t in wanted if t not in run]
    if not run:
        raise MedclrError(f"{data.source}: nothing to evaluate (no {split} images with labels, no MS-CXR phrases)")

    model = Model(checkpoint, device=device)
    need = set()
    if {"zeroshot", "probe"} & set(run):
        need |= set(test_rows.tolist())
    if "probe" in run:
        need |= set(train_rows.tolist())
    phrase_images = set(ph.table["index"].astype(int).tolist()) if {"grounding", "retrieval"} & set(run) else set()
    enc = encode(model, data, np.asarray(sorted(need | phrase_images), dtype=np.int64), phrase_images,
                 prompts if "zeroshot" in run else None, batch_size, workers)
    t_enc = time.perf_counter() - t0
    if enc.rows.size == 0:
        raise MedclrError(f"{data.source}: none of the {len(enc.failed)} images could be read "
                          f"(first: {enc.failed[0]['error'] if enc.failed else 'no image'})")
    metrics: dict[str, Any] = {"checkpoint": str(checkpoint), "data": data.source, "mscxr": data.mscxr_source,
                               "split": split, "mscxr_split": mscxr_split, "tasks": run, "seed": seed,
                               "model": model.describe(), "n_images_encoded": int(enc.rows.size),
                               "failed_images": enc.failed, "notes": notes}
    per_phrase = ph.table[["phrase_id", "dicom_id", "index", "category", "text", "manifest_split"]].copy()
    extras: dict[str, Any] = {}
    if "zeroshot" in run:
        metrics["zeroshot"] = zeroshot_task(enc, data, test_rows, prompts, n_boot, seed)
        metrics["zeroshot"].update(zeroshot_diagnostics(model, enc, data, test_rows, prompts))  # prompt check
    if {"grounding", "retrieval"} & set(run):
        text = model.texts(ph.table["text"].tolist())
        in_train = int((ph.table["manifest_split"] == "train").sum())
        if in_train:
            notes.append(f"{in_train} of {len(ph)} MS-CXR phrases are on images of the manifest's train split")
    if "grounding" in run:
        metrics["grounding"], g = grounding_task(model, enc, ph, text, seed)
        per_phrase = pd.concat([per_phrase, g], axis=1)
    if "retrieval" in run:
        metrics["retrieval"], r, extras["retrieval"] = retrieval_task(model, enc, ph, text)
        per_phrase = pd.concat([per_phrase, r], axis=1)
    if "probe" in run:
        metrics["probe"] = probe_task(enc, data, train_rows, test_rows, classes, seed)
    metrics["summary"] = summary(metrics)
    metrics["compare"] = compared
    metrics["timing_s"] = {"encode": round(t_enc, 1), "total": None}

    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    per_phrase.to_csv(outdir / "phrases.csv", index=False)
    write_report(outdir, metrics, model=model, enc=enc, data=data, ph=ph, per_phrase=per_phrase, extras=extras,
                 figures=figures)
    metrics["timing_s"]["total"] = round(time.perf_counter() - t0, 1)
    (outdir / "metrics.json").write_text(json.dumps(jsonable(metrics), indent=2, allow_nan=False) + "\n")
    return metrics
