"""report.md and its figures for `medclr eval`: a Table-1-shaped comparison with the paper, the
per-class tables (the paper's Tables 3-5), the probe, ROC curves, grounding heatmap panels,
retrieval examples and a t-SNE. Figures are PNGs under ``figures/`` (kept well under 1 MB:
images are shown at most 512 px on their long side)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from medclr.evaluation import grounding as G

DISPLAY_MAX = 512
DPI = 100
MAX_PNG_BYTES = 900_000

#: The sample-specific debiasing paper (Wang et al., MLHC 2023), MIMIC-CXR CheX5 + MS-CXR.
PAPER_TABLE1 = {  # AUC, ACC, CNR, mIoU, Recall, MedR
    "BioViL (paper)": (0.78, 0.62, 1.14, 0.17, 0.25, 148),
    "LSE+NL (paper)": (0.79, 0.65, 1.40, 0.19, 0.29, 115),
    "DCL-η=0.05 (paper)": (0.80, 0.72, 1.46, 0.19, 0.30, 104),
    "DCL-η_LM (paper)": (0.86, 0.72, 1.49, 0.20, 0.30, 104),
}
PAPER_TABLE3 = {  # zero-shot AUC: Cardiomegaly, Edema, Pleural Effusion, Pneumonia, Pneumothorax, Avg
    "BioViL (paper)": (0.752, 0.887, 0.914, 0.768, 0.594, 0.783),
    "LSE+NL (paper)": (0.888, 0.876, 0.798, 0.853, 0.526, 0.788),
    "w/ DCL-η_LM (paper)": (0.884, 0.889, 0.913, 0.861, 0.760, 0.862),
}
PAPER_TABLE4 = {"BioViL (paper)": (1.142, 0.174), "LSE+NL (paper)": (1.400, 0.190), "w/ DCL-η_LM (paper)": (1.486, 0.195)}
PAPER_TABLE5 = {  # I->T R@10 R@50 R@100 MedR, T->I R@10 R@50 R@100 MedR
    "BioViL (paper)": (0.07, 0.26, 0.40, 151, 0.08, 0.26, 0.40, 146),
    "LSE+NL (paper)": (0.09, 0.29, 0.44, 123, 0.10, 0.32, 0.49, 107),
    "w/ DCL-η_LM (paper)": (0.10, 0.31, 0.48, 106, 0.10, 0.33, 0.50, 102),
}
CAVEAT = ("The paper's rows are MIMIC-CXR (CheX5, ~1k images per class) and MS-CXR (1,162 phrases) numbers with "
          "ResNet-18 + CXR-BERT; rows of this run come from the data named above. Phantom numbers are not MIMIC "
          "numbers: they show that the pipeline works and how methods rank on a controlled benchmark, not how a "
          "model does on real radiographs.")


def fmt(x: Any, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if isinstance(x, (int, np.integer)) or float(x).is_integer() and abs(x) >= 10:
        return f"{x:g}" if not isinstance(x, (int, np.integer)) else str(int(x))
    return f"{x:.{nd}f}"


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(*header), _row(*(["---"] * len(header))), *(_row(*r) for r in rows)]


def _ci(ci: Any) -> str:
    if not ci or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in ci):
        return ""
    return f" [{ci[0]:.3f}, {ci[1]:.3f}]"


# --------------------------------------------------------------------------- figures


def save(fig, outdir: Path, name: str) -> str:
    """Write ``fig`` as PNG, at a lower resolution if needed to stay under 1 MB (noisy images
    compress badly). Returns ``name`` (the path relative to the report)."""
    path = outdir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    for dpi in (DPI, 72, 50):
        fig.savefig(path, format="png", dpi=dpi)
        if path.stat().st_size < MAX_PNG_BYTES:
            break
    return name


def _display(image: np.ndarray) -> tuple[np.ndarray, float]:
    h, w = image.shape
    s = min(1.0, DISPLAY_MAX / max(h, w))
    if s == 1.0:
        return image, 1.0
    size = (max(1, round(h * s)), max(1, round(w * s)))
    t = torch.nn.functional.interpolate(torch.from_numpy(np.ascontiguousarray(image))[None, None].float(), size=size,
                                        mode="bilinear", align_corners=False, antialias=True)
    return t[0, 0].numpy(), s


def heatmap_figures(outdir: Path, metrics: dict, model, enc, data, ph, per_phrase) -> list[tuple[str, str]]:
    """Per MS-CXR category, the phrase with the MEDIAN CNR (representative, not the best)."""
    from medclr.evaluation.plots import plot_heatmap_panel
    from medclr.io import read_image

    figs = []
    cnr = per_phrase["CNR"].to_numpy(np.float64)
    cats = sorted(set(ph.table["category"]))
    for cat in tqdm(cats, desc="figures: heatmaps", unit="fig"):
        ks = np.flatnonzero((ph.table["category"].to_numpy() == cat) & np.isfinite(cnr))
        if ks.size == 0:
            continue
        k = int(ks[np.argsort(cnr[ks], kind="stable")[(ks.size - 1) // 2]])
        idx = int(ph.table["index"].iat[k])
        image = read_image(data.image_path(idx))
        h, w = image.shape
        shown, s = _display(image)
        text = str(ph.table["text"].iat[k])
        grid = model.region_scores(enc.regions[idx], model.texts([text]))[0]
        geo = replace(model.geometry(h, w), original_h=shown.shape[0], original_w=shown.shape[1])
        sim_map = G.upsample_map(grid, geo)
        boxes = ph.boxes_for(k, h, w) * s
        name = f"figures/grounding_{cat.lower().replace(' ', '_')}.png"
        title = f"{cat}: \"{text[:70]}\"  CNR {fmt(cnr[k], 2)}, mIoU {fmt(per_phrase['mIoU'].iat[k], 2)}"
        save(plot_heatmap_panel(shown, sim_map, boxes.tolist(), None, title=title), outdir, name)
        figs.append((f"{cat} (median CNR of its {ks.size} phrases)", name))
    return figs


def retrieval_figure(outdir: Path, model, enc, data, ph, extras, seed: int = 0, n_queries: int = 4, top: int = 5):
    """Text -> image examples: each row is a phrase, its true box, then the top boxes retrieved."""
    from matplotlib.patches import Rectangle

    from medclr.evaluation.plots import new_figure
    from medclr.io import read_image

    order, s = extras
    if order.size < 2:
        return None
    cats = ph.table["category"].to_numpy()[order]
    rng = np.random.default_rng(seed)
    picks: list[int] = []
    for c in rng.permutation(sorted(set(cats))):
        if len(picks) < n_queries:
            picks.append(int(rng.choice(np.flatnonzero(cats == c))))
    top = min(top, order.size)
    fig = new_figure(2.0 * (top + 1), 2.3 * len(picks))
    axes = np.atleast_2d(fig.subplots(len(picks), top + 1, squeeze=False))
    cache: dict[int, np.ndarray] = {}

    def crop(pos: int, ax, label: str, colour: str) -> None:
        k = int(order[pos])
        idx = int(ph.table["index"].iat[k])
        if idx not in cache:
            cache[idx] = read_image(data.image_path(idx))
        img = cache[idx]
        h, w = img.shape
        b = ph.boxes_for(k, h, w)
        x0, y0 = b[:, 0].min(), b[:, 1].min()
        x1, y1 = (b[:, 0] + b[:, 2]).max(), (b[:, 1] + b[:, 3]).max()
        m = 0.25 * max(x1 - x0, y1 - y0) + 4
        r0, r1 = int(max(0, y0 - m)), int(min(h, y1 + m))
        c0, c1 = int(max(0, x0 - m)), int(min(w, x1 + m))
        shown, sc = _display(img[r0:r1, c0:c1])
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
    return save(fig, outdir, "figures/retrieval_examples.png")


# --------------------------------------------------------------------------- metrics.json


SUMMARY_KEYS = ("AUC", "ACC", "CNR", "mIoU", "Recall", "MedR")  # the Table 1 row, in its order


def summary(metrics: dict) -> dict[str, float | None]:
    """The Table 1 row: zero-shot AUC/ACC (macro), grounding CNR/mIoU (category macro), Recall, MedR."""
    z, g, r = metrics.get("zeroshot"), metrics.get("grounding"), metrics.get("retrieval")
    return {"AUC": z["macro"]["AUC"] if z else None, "ACC": z["macro"]["ACC"] if z else None,
            "CNR": g["CNR"]["macro"] if g else None, "mIoU": g["mIoU"]["macro"] if g else None,
            "Recall": r["Recall"] if r else None, "MedR": r["MedR"] if r else None}


def read_summary(path: str | Path) -> dict[str, Any]:
    """The Table 1 row of another run's metrics.json (for ``--compare``)."""
    import json

    from medclr.errors import MedclrError

    try:
        s = json.loads(Path(path).read_text())["summary"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MedclrError(f"--compare {path}: not a `medclr eval` metrics.json ({type(exc).__name__})") from None
    return {k: (math.inf if v == "inf" else math.nan if v is None else v) for k, v in s.items()}


def jsonable(x: Any) -> Any:
    """For metrics.json (strict JSON): NaN -> null, ±inf -> "inf"/"-inf", keys starting with _ dropped."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items() if not str(k).startswith("_")}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        v = float(x)
        return None if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else v)
    return x


# --------------------------------------------------------------------------- markdown


def _summary_rows(metrics: dict) -> list[list[Any]]:
    s = metrics["summary"]
    keys = SUMMARY_KEYS
    rows = [["**this run**", *(fmt(s[k], 1 if k == "MedR" else 3) for k in keys)]]
    rows += [[label, *(fmt(o.get(k), 1 if k == "MedR" else 3) for k in keys)] for label, o in metrics.get("compare", {}).items()]
    g, r = metrics.get("grounding"), metrics.get("retrieval")
    rows.append(["chance / control", "0.500" if metrics.get("zeroshot") else "–", "–",
                 fmt(g["CNR_control"]["macro"]) if g else "–", fmt(g["mIoU_control"]["macro"]) if g else "–",
                 fmt(r["chance"]["Recall"]) if r else "–", fmt(r["chance"]["MedR"], 1) if r else "–"])
    rows += [[name, *(fmt(v, 2) if i < 5 else str(v) for i, v in enumerate(vals))] for name, vals in PAPER_TABLE1.items()]
    return rows


def markdown(metrics: dict, figs: dict[str, Any]) -> str:
    from medclr.evaluation.diagnostics import markdown_lines

    m = metrics
    tr = m["model"].get("training") or {}
    lines = ["# medclr evaluation report", "",
             f"- checkpoint: `{m['checkpoint']}`", f"- data: `{m['data']}` (split `{m['split']}`)",
             f"- MS-CXR boxes: `{m['mscxr']}` (phrases: " + (f"those on the evaluated `{m['split']}` images" if m["mscxr_split"] == "auto"
                                                else f"MS-CXR split `{m['mscxr_split']}`") + ")",
             f"- model: {m['model'].get('image_arch')}, head `{m['model']['head'].get('type')}`, joint dim "
             f"{m['model']['joint_dim']}, input: shorter side → {m['model']['preprocess']['resize']} px, centre crop "
             f"{m['model']['preprocess']['image_size']} px",
             *([f"- training (trainer_state.json): loss `{tr.get('loss')}`, {tr.get('step')} steps of {tr.get('global_batch')} "
                f"pairs ({tr.get('n_train')} training pairs), last loss {fmt(tr.get('last_loss'))}"
                + (f" (an InfoNCE-type loss of an uninformative model is about ln {tr['global_batch']} = "
                   f"{math.log(tr['global_batch']):.3f})"
                   if tr.get("global_batch") else "")] if tr else []),
             f"- images encoded: {m['n_images_encoded']} ({len(m['failed_images'])} unreadable, left out); encode time "
             f"{m['timing_s']['encode']} s",
             "- protocol: `docs/evaluation.md` (pinned metric choices and the runner section)", ""]
    lines += [f"> note: {n}" for n in m["notes"]] + ([""] if m["notes"] else [])
    lines += ["## Summary (the shape of the paper's Table 1)", "",
              *_table(["", "AUC ↑", "ACC ↑", "CNR ↑", "mIoU ↑", "Recall ↑", "MedR ↓"], _summary_rows(m)), "",
              "AUC/ACC: CheX5 zero-shot, macro over classes. CNR/mIoU: MS-CXR-format grounding, macro over categories. "
              "Recall: mean of R@10/50/100 over both retrieval directions; MedR: mean of the two median ranks. "
              "Chance/control row: AUC of an uninformative score (the zero-shot section adds the AUC of these scores "
              "with labels shuffled across images); grounding with each phrase's map computed for a phrase of "
              "another image, scored against the same boxes (CNR is not 0 for an uninformative map); retrieval at "
              "chance (K/n, (n+1)/2).", "",
              f"*{CAVEAT}*", ""]
    z = m.get("zeroshot")
    if z:
        cls = z["classes"]
        rows = [[c, f"{fmt(z['per_class'][c]['AUC'])}{_ci(z['per_class'][c]['AUC_CI'])}",
                 f"{fmt(z['per_class'][c]['ACC'])}{_ci(z['per_class'][c]['ACC_CI'])}", z["per_class"][c]["n"],
                 z["per_class"][c]["n_pos"], fmt(z["control_shuffled_labels"]["per_class_AUC"][c])] for c in cls]
        rows.append(["**macro**", f"**{fmt(z['macro']['AUC'])}**{_ci(z['macro']['AUC_CI'])}",
                     f"**{fmt(z['macro']['ACC'])}**{_ci(z['macro']['ACC_CI'])}", "", "",
                     fmt(z["control_shuffled_labels"]["AUC"])])
        lines += ["## Zero-shot classification (Table 3 shape)", "",
                  f"{z['n_images']} images; 95 % percentile-bootstrap CIs ({z['n_boot']} resamples). Labels −1/NaN are "
                  "left out per class.", "",
                  *_table(["class", "AUC [95 % CI]", "ACC [95 % CI]", "n", "n pos", "AUC, shuffled labels"], rows), "",
                  *markdown_lines(z)]  # evaluation.diagnostics: prompt cosine and sign check
        if tuple(cls) == ("Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax"):
            ours = [z["per_class"][c]["AUC"] for c in cls] + [z["macro"]["AUC"]]
            lines += ["Paper's Table 3 (MIMIC-CXR) beside this run:", "",
                      *_table(["", "Cardiomegaly", "Edema", "Effusion", "Pneumonia", "Pneumothorax", "Avg"],
                              [["this run", *(fmt(v) for v in ours)]]
                              + [[k, *(fmt(v) for v in vals)] for k, vals in PAPER_TABLE3.items()]), ""]
        if figs.get("roc"):
            lines += [f"![ROC curves]({figs['roc']})", ""]
    g = m.get("grounding")
    if g:
        cats = sorted(g["CNR"]["per_category"])
        rows = [[c, g["CNR"]["count"][c] + g["CNR"]["n_nan"][c], fmt(g["CNR"]["per_category"][c]),
                 fmt(g["mIoU"]["per_category"][c]), fmt(g["CNR_control"]["per_category"][c]),
                 fmt(g["mIoU_control"]["per_category"][c]), g["CNR"]["n_nan"][c]] for c in cats]
        rows.append(["**macro**", g["n_phrases"], f"**{fmt(g['CNR']['macro'])}**", f"**{fmt(g['mIoU']['macro'])}**",
                     fmt(g["CNR_control"]["macro"]), fmt(g["mIoU_control"]["macro"]), ""])
        rows.append(["micro (all phrases)", g["n_phrases"], fmt(g["CNR"]["micro"]), fmt(g["mIoU"]["micro"]),
                     fmt(g["CNR_control"]["micro"]), fmt(g["mIoU_control"]["micro"]), ""])
        lines += ["## Phrase grounding (Table 4 shape, per category)", "",
                  f"{g['n_phrases']} phrases on {g['n_images']} images, {g['n_boxes']} boxes. Map: region–phrase "
                  "cosines, smoothed (σ = 1.5 cells), mapped back to the original image (NaN outside the crop); "
                  "interior = union of the phrase's boxes; mIoU over 41 thresholds in [−1, 1].", "",
                  *_table(["category", "phrases", "CNR", "mIoU", "CNR, other phrase", "mIoU, other phrase",
                           "undefined (NaN)"], rows), "",
                  "Paper's Table 4 (MS-CXR): " + "; ".join(f"{k} CNR {v[0]:.3f}, mIoU {v[1]:.3f}"
                                                          for k, v in PAPER_TABLE4.items()), ""]
        flat = g.get("flat_maps")
        if flat and flat["n"]:
            lines += [f"Flat maps: {flat['n_flat']} of {flat['n']} phrase maps span less than {flat['threshold']:.2f} "
                      "(cosine, smoothed): the model shows no localised signal for those phrases, and the app draws no "
                      f"heatmap for them. Map range 5/50/95 %: {flat['range_q05_q50_q95']}; of the "
                      f"{flat['n_localised']} phrases with CNR ≥ 1: {flat['localised_range_q05_q50_q95']}.", ""]
        for label, name in figs.get("heatmaps", []):
            lines += [f"**{label}**", "", f"![{label}]({name})", ""]
    r = m.get("retrieval")
    if r:
        ks = ("R@10", "R@50", "R@100", "MedR")
        ours = [r[f"i2t/{k}"] for k in ks] + [r[f"t2i/{k}"] for k in ks]
        ch = r["chance"]
        rows = [["this run", *(fmt(v, 1 if i % 4 == 3 else 3) for i, v in enumerate(ours))],
                ["chance", *(fmt(ch[k], 1 if k == "MedR" else 3) for k in ks), *(fmt(ch[k], 1 if k == "MedR" else 3) for k in ks)]]
        t = r.get("text_level")
        if t:
            rows.append([f"this run, text level ({t['n_texts']} distinct texts)",
                         *(fmt(t[f"{d}/{k}"], 1 if k == "MedR" else 3) for d in ("i2t", "t2i") for k in ks)])
            rows.append(["chance, text level", *(fmt(t["chance"].get(f"{d}/{k}"), 3) for d in ("i2t", "t2i") for k in ks)])
        rows += [[k, *(fmt(v, 2) if i % 4 != 3 else str(v) for i, v in enumerate(vals))] for k, vals in PAPER_TABLE5.items()]
        lines += ["## Retrieval (Table 5 shape)", "",
                  f"{r['n_phrases']} phrases: box features by RoIAlign on the region features (mean over the phrase's "
                  f"boxes) against the phrase embeddings. Ties count against the query. {r['n_duplicate_texts']} phrase "
                  f"texts repeat another phrase's text; {r['n_phrases_box_outside_crop']} phrases have a box outside the "
                  "model's crop. The paper's MedR is on 1,162 candidates; ours on the number above. Text level: "
                  "identical texts are one candidate (image→text ranks the distinct texts; text→image ranks a "
                  "distinct text's best box among the boxes of all its phrases); its Recall is "
                  f"{fmt(r['text_level']['Recall']) if r.get('text_level') else '–'} "
                  f"(chance {fmt(r['text_level']['chance']['Recall']) if r.get('text_level') else '–'}).", "",
                  *_table(["", "I→T R@10", "R@50", "R@100", "MedR", "T→I R@10", "R@50", "R@100", "MedR"], rows), ""]
        if figs.get("retrieval"):
            lines += [f"![retrieval examples]({figs['retrieval']})", ""]
    p = m.get("probe")
    if p:
        lines += ["## Linear probe on frozen global embeddings", "",
                  f"Logistic regression on {p['n_train']} train-split images (1 / 10 / 100 % of their labels), "
                  f"scored on {p['n_test']} {m['split']}-split images.", ""]
        rows = []
        if "chex5" in p:
            rows.append(["CheX5 macro AUC", *(fmt(p["chex5"][f]["macro_AUC"]) for f in ("1%", "10%", "100%")),
                         fmt(p["control_shuffled_labels"]["macro_AUC"])])
        if "latent_class" in p:
            lc = p["latent_class"]
            what = f"latent class, {len(lc['100%']['per_class'])} most frequent ({lc['n_train']} / {lc['n_test']} images)"
            rows.append([f"{what}: macro AUC", *(fmt(lc[f]["macro_AUC"]) for f in ("1%", "10%", "100%")), "–"])
            rows.append([f"{what}: accuracy", *(fmt(lc[f]["accuracy"]) for f in ("1%", "10%", "100%")), "–"])
        lines += _table(["", "1 %", "10 %", "100 %", "100 %, shuffled train labels"], rows) + [""]
        if figs.get("tsne"):
            lines += [f"![t-SNE]({figs['tsne']})", ""]
    return "\n".join(lines) + "\n"


def write_report(outdir: Path, metrics: dict, *, model, enc, data, ph, per_phrase, extras, figures: bool = True) -> Path:
    """report.md, with its figures under ``figures/`` unless ``figures=False``."""
    figs: dict[str, Any] = {}
    z, p = metrics.get("zeroshot"), metrics.get("probe")
    if figures and z:
        from medclr.evaluation.plots import plot_roc_curves

        scores, y = z["_scores"]
        figs["roc"] = save(plot_roc_curves(scores, y, z["classes"], title="CheX5 zero-shot ROC"), outdir, "figures/roc.png")
    if figures and metrics.get("grounding"):
        figs["heatmaps"] = heatmap_figures(outdir, metrics, model, enc, data, ph, per_phrase)
    if figures and metrics.get("retrieval"):
        figs["retrieval"] = retrieval_figure(outdir, model, enc, data, ph, extras["retrieval"], metrics["seed"])
    if figures and p and p.get("_tsne") is not None:
        from medclr.evaluation.probe import plot_tsne

        x, lab = p["_tsne"]
        if len(x) >= 10:
            fig, _ = plot_tsne(x, np.asarray(lab).astype(str), seed=metrics["seed"], label_name="latent class",
                               title=f"t-SNE of {len(x)} {metrics['split']} global embeddings")
            figs["tsne"] = save(fig, outdir, "figures/tsne.png")
    path = outdir / "report.md"
    path.write_text(markdown(metrics, figs))
    return path
