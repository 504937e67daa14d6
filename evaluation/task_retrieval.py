"""Task `retrieval`: MS-CXR box features against phrase embeddings, both directions (``docs/evaluation.md``
sections 2 and 7.2).

One vector per phrase: RoIAlign (aligned, 3x3 bins, 2x2 samples per bin) of each box on the region
features the head compares with text, the unnormalised mean over the phrase's boxes, L2-normalised;
scores are its cosines with the phrase embeddings. Control: the analytic chance level.
"""

from __future__ import annotations

import numpy as np

from medclr.evaluation.markdown import fmt, header, pooled_row, table
from medclr.evaluation.tasks import Column, Task
from medclr.progress import progress_bar

ROI_BINS, ROI_SAMPLES = 3, 2
DIRECTION_KEYS = ("R@10", "R@50", "R@100", "MedR")
#: The paper's Table 5: I->T R@10 R@50 R@100 MedR, T->I R@10 R@50 R@100 MedR.
PAPER_TABLE5 = {
    "BioViL (paper)": (0.07, 0.26, 0.40, 151, 0.08, 0.26, 0.40, 146),
    "LSE+NL (paper)": (0.09, 0.29, 0.44, 123, 0.10, 0.32, 0.49, 107),
    "w/ DCL-η_LM (paper)": (0.10, 0.31, 0.48, 106, 0.10, 0.33, 0.50, 102),
}


def box_feature(regions, boxes_xywh: np.ndarray, geo):
    """One D vector for a phrase: RoIAlign of each box on the (D, h, w) region features, mean over
    boxes (unnormalised). Boxes are mapped original px -> resized px -> crop px -> grid cells and
    clipped to the crop; a box wholly outside it becomes a thin strip at the nearest crop edge
    (counted in the second return value)."""
    import torch
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


def retrieval_scores(box_feats, text) -> np.ndarray:
    """scores[phrase box feature, phrase sentence] = cosine (rows: image side, columns: text)."""
    import torch

    a = torch.nn.functional.normalize(box_feats.float(), dim=-1)
    return (a @ torch.nn.functional.normalize(text.float(), dim=-1).T).cpu().numpy().astype(np.float64)


def phrase_retrieval(model, enc, ph, text, progress: bool | str = "auto"):
    """(block, per-phrase ranks): R@K/MedR both ways, chance, the text-level view; ``block["_examples"]``
    keeps (phrase order, scores) for the figure."""
    import pandas as pd
    import torch

    from medclr.evaluation.retrieval import DEFAULT_KS, bidirectional_retrieval, ranks, text_level_retrieval

    keep = [k for k in range(len(ph)) if int(ph.table["index"].iat[k]) in enc.regions]
    feats, order, n_out = [], [], 0
    by_image = ph.table.iloc[keep].groupby("index", sort=True).indices
    for idx, local in progress_bar(by_image.items(), desc="retrieval: RoIAlign", unit="img", total=len(by_image),
                                   enabled=progress):
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
    res["_examples"] = (order, s)  # for the figure; dropped from metrics.json
    per = pd.DataFrame({"i2t_rank": np.zeros(len(ph), np.int64), "t2i_rank": np.zeros(len(ph), np.int64)})
    per.loc[order, "i2t_rank"] = ranks(s)
    per.loc[order, "t2i_rank"] = ranks(s.T)
    return res, per


def examples_figure(outdir, inp, order: np.ndarray, s: np.ndarray, n_queries: int = 4, top: int = 5):
    """Text -> image examples: each row is a phrase, its true box, then the top boxes retrieved."""
    from medclr.evaluation.plots import display_image, new_figure, save_report_figure
    from medclr.io import read_image

    ph = inp.phrases
    if order.size < 2:
        return None
    cats = ph.table["category"].to_numpy()[order]
    rng = np.random.default_rng(inp.seed)
    picks: list[int] = []
    for c in rng.permutation(sorted(set(cats))):
        if len(picks) < n_queries:
            picks.append(int(rng.choice(np.flatnonzero(cats == c))))
    top = min(top, order.size)
    fig = new_figure(2.0 * (top + 1), 2.3 * len(picks))
    axes = np.atleast_2d(fig.subplots(len(picks), top + 1, squeeze=False))
    cache: dict[int, np.ndarray] = {}

    def crop(pos: int, ax, label: str, colour: str) -> None:
        from matplotlib.patches import Rectangle

        k = int(order[pos])
        idx = int(ph.table["index"].iat[k])
        if idx not in cache:
            cache[idx] = read_image(inp.data.image_path(idx))
        img = cache[idx]
        h, w = img.shape
        b = ph.boxes_for(k, h, w)
        x0, y0 = b[:, 0].min(), b[:, 1].min()
        x1, y1 = (b[:, 0] + b[:, 2]).max(), (b[:, 1] + b[:, 3]).max()
        m = 0.25 * max(x1 - x0, y1 - y0) + 4
        r0, r1 = int(max(0, y0 - m)), int(min(h, y1 + m))
        c0, c1 = int(max(0, x0 - m)), int(min(w, x1 + m))
        shown, sc = display_image(img[r0:r1, c0:c1])
        ax.imshow(shown, cmap="gray")
        for x, y, bw, bh in b:
            ax.add_patch(Rectangle(((x - c0) * sc - 0.5, (y - r0) * sc - 0.5), bw * sc, bh * sc, fill=False,
                                   ec="yellow", lw=1.2, ls="--"))
        ax.set_title(label, fontsize=7, color=colour)
        ax.set_xticks([])
        ax.set_yticks([])
        for sp in ax.spines.values():
            sp.set_edgecolor(colour)
            sp.set_linewidth(2.5 if colour != "black" else 0.5)

    for row, q in enumerate(picks):
        col = s[:, q]  # text q against every box feature
        ranked = np.argsort(-col, kind="stable")
        rank = 1 + int((col > col[q]).sum() + (col == col[q]).sum() - 1)
        text = str(ph.table["text"].iat[int(order[q])])
        crop(q, axes[row, 0], f"truth (rank {rank})\n{text[:34]}", "black")
        for j in range(top):
            p = int(ranked[j])
            crop(p, axes[row, j + 1], f"#{j + 1} cos {col[p]:.2f}\n{str(ph.table['text'].iat[int(order[p])])[:30]}",
                 "green" if p == q else "black")
    fig.suptitle("text → box retrieval: the phrase's true box, then the top boxes (green = correct)", fontsize=9)
    return save_report_figure(fig, outdir, "figures/retrieval_examples.png")


def _direction_cells(get, nd_medr: int = 1) -> list[str]:
    return [fmt(get(d, k), nd_medr if k == "MedR" else 3) for d in ("i2t", "t2i") for k in DIRECTION_KEYS]


class Retrieval(Task):
    name, order = "retrieval", 30
    uses = frozenset({"phrases"})
    columns = (Column("Recall"), Column("MedR", "↓", 1))

    def unavailable(self, inp):
        return None if len(inp.phrases) > 1 else "fewer than 2 MS-CXR phrases"

    def run(self, inp):
        return phrase_retrieval(inp.model, inp.enc, inp.phrases, inp.phrase_text(), inp.progress)

    def summary(self, r):
        return {"Recall": r["Recall"], "MedR": r["MedR"]}

    def control(self, r):
        return [fmt(r["chance"]["Recall"]), fmt(r["chance"]["MedR"], 1)]

    def figures(self, outdir, r, inp, per_phrase):
        return {"examples": examples_figure(outdir, inp, *r["_examples"])}

    def section(self, metrics, r, figs):
        ch, t = r["chance"], r.get("text_level")
        rows = [["this run", *_direction_cells(lambda d, k: r[f"{d}/{k}"])],
                ["chance", *_direction_cells(lambda d, k: ch[k])]]
        if t:
            rows.append([f"this run, text level ({t['n_texts']} distinct texts)",
                         *_direction_cells(lambda d, k: t[f"{d}/{k}"])])
            rows.append(["chance, text level", *_direction_cells(lambda d, k: t["chance"].get(f"{d}/{k}"), 3)])
        rows += [[k, *(fmt(v, 2) if i % 4 != 3 else str(v) for i, v in enumerate(vals))] for k, vals in PAPER_TABLE5.items()]
        lines = ["## Retrieval (Table 5 shape)", "",
                 f"{r['n_phrases']} phrases: box features by RoIAlign on the region features (mean over the phrase's "
                 f"boxes) against the phrase embeddings. Ties count against the query. {r['n_duplicate_texts']} phrase "
                 f"texts repeat another phrase's text; {r['n_phrases_box_outside_crop']} phrases have a box outside the "
                 "model's crop. The paper's MedR is on 1,162 candidates; ours on the number above. Text level: "
                 "identical texts are one candidate (image→text ranks the distinct texts; text→image ranks a "
                 "distinct text's best box among the boxes of all its phrases); its Recall is "
                 f"{fmt(t['Recall']) if t else '–'} (chance {fmt(t['chance']['Recall']) if t else '–'}).", "",
                 *table(["", "I→T R@10", "R@50", "R@100", "MedR", "T→I R@10", "R@50", "R@100", "MedR"], rows), ""]
        if figs.get("examples"):
            lines += [f"![retrieval examples]({figs['examples']})", ""]
        return lines

    # --------------------------------------------------------------- several checkpoints

    def pool(self, runs, summary):
        from medclr.evaluation.seeds import metric_at, pooled_entry

        if not any(m.get("retrieval") for m in runs):
            return None
        r = {k: pooled_entry(runs, ("retrieval", k)) for k in ("Recall", "MedR")}
        r["chance"] = {k: pooled_entry(runs, ("retrieval", "chance", k)) for k in ("Recall", "MedR")}
        r["n_phrases"] = [metric_at(m, "retrieval", "n_phrases") for m in runs]
        return r

    def pooled_control(self, r):
        return [fmt(r["chance"]["Recall"]["mean"]), fmt(r["chance"]["MedR"]["mean"], 1)]

    def pooled_section(self, r, names):
        rows = [pooled_row("Recall (mean R@10/50/100, both directions)", r["Recall"]),
                pooled_row("MedR", r["MedR"], 1), pooled_row("Recall at chance", r["chance"]["Recall"]),
                pooled_row("MedR at chance", r["chance"]["MedR"], 1)]
        return ["## Retrieval (Table 1's Recall and MedR)", "",
                f"Phrases per checkpoint: {', '.join(str(n) for n in r['n_phrases'])}. Per direction and text "
                "level: each checkpoint's report.", "", *table(header("", names), rows), ""]


TASK = Retrieval()
