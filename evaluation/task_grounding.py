"""Task `grounding`: MS-CXR phrase grounding, CNR and mIoU per category (``docs/evaluation.md``
sections 1 and 7.2).

Each phrase's map is the head's region–phrase scores, carried to the original image by
``grounding.upsample_map`` (the resize/crop geometry, BioViL smoothing); control: the same boxes
scored against the map of a phrase of another image. Figures: the median-CNR phrase per category.
"""

from __future__ import annotations

import numpy as np

from medclr.evaluation.markdown import fmt, header, pooled_row, table
from medclr.evaluation.tasks import Column, Task
from medclr.progress import progress_bar

#: The paper's Table 4 (MS-CXR): CNR, mIoU.
PAPER_TABLE4 = {"BioViL (paper)": (1.142, 0.174), "LSE+NL (paper)": (1.400, 0.190), "w/ DCL-η_LM (paper)": (1.486, 0.195)}
PAPER_LINE = "Paper's Table 4 (MS-CXR): " + "; ".join(f"{k} CNR {v[0]:.3f}, mIoU {v[1]:.3f}" for k, v in PAPER_TABLE4.items())
METRICS = ("CNR", "mIoU", "CNR_control", "mIoU_control")


def ground_one(grid: np.ndarray, geo, boxes: np.ndarray) -> tuple[float, float]:
    """CNR and mIoU of one phrase: grid -> original-size map (pinned protocol) vs the union of boxes."""
    from medclr.evaluation import grounding as G

    sim_map = G.upsample_map(grid, geo)
    mask = G.boxes_to_mask(boxes, geo.original_h, geo.original_w)
    return G.cnr(sim_map, mask), G.miou(sim_map, mask)


def flat_map_summary(ranges: np.ndarray, cnr: np.ndarray) -> dict:
    """How many phrase maps the app would refuse to paint (smoothed range < MIN_MAP_RANGE), and the
    range that localised matches (CNR >= 1) produce: the calibration of the threshold."""
    from medclr.inference.heatmap import MIN_MAP_RANGE

    ok = np.isfinite(ranges)
    localised = ok & (np.nan_to_num(cnr, nan=0.0) >= 1.0)
    q = lambda v: [round(float(x), 4) for x in np.quantile(v, (0.05, 0.5, 0.95))] if v.size else None  # noqa: E731
    return {"threshold": MIN_MAP_RANGE, "n_flat": int((ranges[ok] < MIN_MAP_RANGE).sum()), "n": int(ok.sum()),
            "range_q05_q50_q95": q(ranges[ok]), "n_localised": int(localised.sum()),
            "localised_range_q05_q50_q95": q(ranges[localised])}


def grounding_metrics(model, enc, ph, text, seed: int, progress: bool | str = "auto"):
    """(block, per-phrase DataFrame): CNR/mIoU of every phrase and of its other-phrase control."""
    import pandas as pd
    import torch

    from medclr.evaluation import grounding as G
    from medclr.evaluation.data import control_pairs
    from medclr.inference.heatmap import map_range

    ctl = control_pairs(ph, seed)
    n = len(ph)
    out = {k: np.full(n, np.nan) for k in (*METRICS, "map_range")}
    by_image = ph.table.groupby("index", sort=True).indices
    for idx, ks in progress_bar(by_image.items(), desc="grounding", unit="img", total=len(by_image), enabled=progress):
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


def heatmap_figures(outdir, inp, per_phrase) -> list[tuple[str, str]]:
    """Per MS-CXR category, the phrase with the MEDIAN CNR (representative, not the best)."""
    from dataclasses import replace

    from medclr.evaluation import grounding as G
    from medclr.evaluation.plots import display_image, plot_heatmap_panel, save_report_figure
    from medclr.io import read_image

    figs, model, ph = [], inp.model, inp.phrases
    cnr = per_phrase["CNR"].to_numpy(np.float64)
    for cat in progress_bar(sorted(set(ph.table["category"])), desc="figures: heatmaps", unit="fig", enabled=inp.progress):
        ks = np.flatnonzero((ph.table["category"].to_numpy() == cat) & np.isfinite(cnr))
        if ks.size == 0:
            continue
        k = int(ks[np.argsort(cnr[ks], kind="stable")[(ks.size - 1) // 2]])
        idx = int(ph.table["index"].iat[k])
        image = read_image(inp.data.image_path(idx))
        h, w = image.shape
        shown, s = display_image(image)
        text = str(ph.table["text"].iat[k])
        grid = model.region_scores(inp.enc.regions[idx], model.texts([text]))[0]
        geo = replace(model.geometry(h, w), original_h=shown.shape[0], original_w=shown.shape[1])
        sim_map = G.upsample_map(grid, geo)
        boxes = ph.boxes_for(k, h, w) * s
        name = f"figures/grounding_{cat.lower().replace(' ', '_')}.png"
        title = f"{cat}: \"{text[:70]}\"  CNR {fmt(cnr[k], 2)}, mIoU {fmt(per_phrase['mIoU'].iat[k], 2)}"
        save_report_figure(plot_heatmap_panel(shown, sim_map, boxes.tolist(), None, title=title), outdir, name)
        figs.append((f"{cat} (median CNR of its {ks.size} phrases)", name))
    return figs


class Grounding(Task):
    name, order = "grounding", 20
    uses = frozenset({"phrases"})
    columns = (Column("CNR"), Column("mIoU"))

    def unavailable(self, inp):
        return None if len(inp.phrases) > 0 else "no MS-CXR phrases"

    def run(self, inp):
        return grounding_metrics(inp.model, inp.enc, inp.phrases, inp.phrase_text(), inp.seed, inp.progress)

    def summary(self, g):
        return {"CNR": g["CNR"]["macro"], "mIoU": g["mIoU"]["macro"]}

    def control(self, g):
        return [fmt(g["CNR_control"]["macro"]), fmt(g["mIoU_control"]["macro"])]

    def figures(self, outdir, g, inp, per_phrase):
        return {"heatmaps": heatmap_figures(outdir, inp, per_phrase)}

    def section(self, metrics, g, figs):
        cats = sorted(g["CNR"]["per_category"])
        col = lambda k, c: fmt(g[k]["per_category"][c])  # noqa: E731
        rows = [[c, g["CNR"]["count"][c] + g["CNR"]["n_nan"][c], *(col(k, c) for k in METRICS), g["CNR"]["n_nan"][c]]
                for c in cats]
        rows.append(["**macro**", g["n_phrases"], f"**{fmt(g['CNR']['macro'])}**", f"**{fmt(g['mIoU']['macro'])}**",
                     fmt(g["CNR_control"]["macro"]), fmt(g["mIoU_control"]["macro"]), ""])
        rows.append(["micro (all phrases)", g["n_phrases"], *(fmt(g[k]["micro"]) for k in METRICS), ""])
        lines = ["## Phrase grounding (Table 4 shape, per category)", "",
                 f"{g['n_phrases']} phrases on {g['n_images']} images, {g['n_boxes']} boxes. Map: region–phrase "
                 "cosines, smoothed (σ = 1.5 cells), mapped back to the original image (NaN outside the crop); "
                 "interior = union of the phrase's boxes; mIoU over 41 thresholds in [−1, 1].", "",
                 *table(["category", "phrases", "CNR", "mIoU", "CNR, other phrase", "mIoU, other phrase",
                         "undefined (NaN)"], rows), "", PAPER_LINE, ""]
        flat = g.get("flat_maps")
        if flat and flat["n"]:
            lines += [f"Flat maps: {flat['n_flat']} of {flat['n']} phrase maps span less than {flat['threshold']:.2f} "
                      "(cosine, smoothed): the model shows no localised signal for those phrases, and the app draws no "
                      f"heatmap for them. Map range 5/50/95 %: {flat['range_q05_q50_q95']}; of the "
                      f"{flat['n_localised']} phrases with CNR ≥ 1: {flat['localised_range_q05_q50_q95']}.", ""]
        for label, name in figs.get("heatmaps", []):
            lines += [f"**{label}**", "", f"![{label}]({name})", ""]
        return lines

    # --------------------------------------------------------------- several checkpoints

    def pool(self, runs, summary):
        from medclr.evaluation.seeds import metric_at, pooled_entry

        if not any(m.get("grounding") for m in runs):
            return None
        out = {k: pooled_entry(runs, ("grounding", k, "macro")) for k in METRICS}
        out["n_phrases"] = [metric_at(m, "grounding", "n_phrases") for m in runs]
        return out

    def pooled_control(self, g):
        return [fmt(g["CNR_control"]["mean"]), fmt(g["mIoU_control"]["mean"])]

    def pooled_section(self, g, names):
        rows = [pooled_row("CNR (category macro)", g["CNR"]), pooled_row("mIoU (category macro)", g["mIoU"]),
                pooled_row("CNR, other phrase's map", g["CNR_control"]),
                pooled_row("mIoU, other phrase's map", g["mIoU_control"])]
        return ["## Phrase grounding (Table 4 shape)", "",
                f"Phrases per checkpoint: {', '.join(str(n) for n in g['n_phrases'])}. Per category: each "
                "checkpoint's report.", "", *table(header("", names), rows), "", PAPER_LINE, ""]


TASK = Grounding()
