"""Figures for docs/phantom.md: the contact sheet and the class / false-negative statistics.

    python -m medclr.phantom.figures --img docs/img [--phantom DIR]

writes ``phantom_contact_sheet.png`` (one phantom per finding beside the real
RG1 radiograph from pydicom-data) and, with ``--plan N`` (classes from the
planner, no images) and/or ``--phantom DIR...`` (generated sets),
``phantom_classes.png`` plus markdown tables on stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from medclr.data.groundtruth import read_ground_truth
from medclr.phantom import vocab as V
from medclr.phantom.groundtruth import false_negative_rates
from medclr.phantom.material import load_material
from medclr.phantom.plan import plan_study
from medclr.phantom.renderer import render

PANELS = [
    ("normal PA", "PA", []),
    ("normal AP (portable)", "AP", []),
    ("cardiomegaly, moderate", "PA", [V.finding("cardiomegaly", severity="moderate")]),
    ("R pleural effusion, moderate", "PA", [V.finding("pleural_effusion", side="right", size="moderate")]),
    ("bilateral small effusions", "PA", [V.finding("pleural_effusion", side="bilateral", size="small")]),
    ("L pneumothorax, apical", "PA", [V.finding("pneumothorax", side="left", size="moderate", zone="apex")]),
    ("R pneumothorax, large", "PA", [V.finding("pneumothorax", side="right", size="large")]),
    ("pulmonary edema", "AP", [V.finding("edema", severity="moderate"), V.finding("cardiomegaly", severity="mild")]),
    ("RLL pneumonia", "PA", [V.finding("pneumonia", side="right", zone="lower")]),
    ("LUL consolidation", "PA", [V.finding("consolidation", side="left", zone="upper")]),
    ("L basal plate atelectasis", "PA", [V.finding("atelectasis", side="left", zone="base", kind="plate")]),
    ("R upper lobe mass", "PA", [V.finding("nodule", side="right", zone="upper", kind="mass")]),
    ("calcified granulomas", "PA", [V.finding("nodule", side="left", zone="mid", kind="calcified", count=3)]),
    ("hyperinflation (COPD)", "PA", [V.finding("hyperinflation")]),
    ("low lung volumes", "AP", [V.finding("hypoinflation")]),
    ("elevated R hemidiaphragm", "PA", [V.finding("elevated_hemidiaphragm", side="right")]),
    ("pacemaker", "PA", [V.finding("pacemaker", side="left")]),
    ("ET tube + R IJ line", "AP", [V.finding("tube", kind="et"), V.finding("central_line", side="right", kind="ij")]),
    ("sternotomy wires", "PA", [V.finding("sternotomy"), V.finding("tortuous_aorta")]),
    ("interstitial markings", "PA", [V.finding("interstitial", zone="lower")]),
    ("scoliosis", "PA", [V.finding("scoliosis", side="right")]),
    ("hiatal hernia", "PA", [V.finding("hiatal_hernia", size="large")]),
    ("L rib fracture", "PA", [V.finding("fracture", side="left")]),
]


def _rg1(size: int) -> np.ndarray:
    import importlib.util

    from medclr.io import read_image

    spec = importlib.util.find_spec("data_store")
    if spec is None or not spec.origin:
        return np.zeros((size, size), np.float32)
    img = read_image(Path(spec.origin).parent / "data" / "RG1_UNCR.dcm")
    return np.asarray(Image.fromarray((img * 255).astype(np.uint8)).resize((size, size), Image.BILINEAR)) / 255.0


def _label(img: Image.Image, text: str) -> None:
    d = ImageDraw.Draw(img)
    d.rectangle([0, 0, img.width, 13], fill=(0, 0, 0))
    d.text((3, 1), text, fill=(255, 255, 120))


def contact_sheet(path: Path, size: int = 256, seed: int = 4, cols: int = 6, boxes: bool = True) -> Path:
    m = load_material()
    tiles = []
    real = Image.fromarray((_rg1(size) * 255).astype(np.uint8)).convert("RGB")
    _label(real, "REAL: RG1 (pydicom-data)")
    tiles.append(real)
    for i, (title, view, findings) in enumerate(PANELS):
        spec = {"seed": seed, "k": i, "view": view, "findings": [dict(f) for f in findings]}
        res = render(m, spec, size)
        tile = Image.fromarray(res["image"]).convert("RGB")
        if boxes:
            d = ImageDraw.Draw(tile)
            for bl in res["boxes"]:
                for x, y, w, h in bl:
                    d.rectangle([x, y, x + w - 1, y + h - 1], outline=(255, 80, 40))
        _label(tile, f"{title}  (CTR {res['ctr']:.2f})" if "cardio" in title or "normal" in title else title)
        tiles.append(tile)
    rows = -(-len(tiles) // cols)
    sheet = Image.new("RGB", (cols * size, rows * size), (0, 0, 0))
    for i, t in enumerate(tiles):
        sheet.paste(t, ((i % cols) * size, (i // cols) * size))
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.quantize(colors=96, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    return path


CHEX5_NAMES = ("Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax")


def plan_table(source: str, n: int, seed: int = 0) -> pd.DataFrame:
    """Latent class and CheX5 positives of studies 0..n-1 of a source, from the planner alone (no images):
    the same classes ``generate`` writes for that seed."""
    m = load_material()
    rows = []
    for k in range(n):
        spec = plan_study(m, source, seed, k)
        chex = {f_chex for f in spec["findings"] if f.get("rendered") and (f_chex := V.CHEXPERT_OF.get(f["name"]))}
        rows.append({"latent_class": spec["latent_class"], **{c: c in chex for c in CHEX5_NAMES}})
    df = pd.DataFrame(rows)
    df["latent_class_prob"] = df["latent_class"].map(df["latent_class"].value_counts(normalize=True))
    return df


def table_from_phantom(phantom_dir: Path) -> pd.DataFrame:
    gt = read_ground_truth(phantom_dir, ["latent_class", "latent_class_prob", "findings"])
    for c in CHEX5_NAMES:
        gt[c] = [any(f["chexpert"] == c for f in fs) for fs in gt["findings"]]
    return gt.drop(columns=["findings"])


def class_figure(tables: dict[str, pd.DataFrame], path: Path, batch: int = 64) -> str:
    """Rank-frequency of latent classes, CheX5 prevalence and per-class false-negative rates; returns markdown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / max(1, len(tables))
    summary = []
    for i, (name, df) in enumerate(tables.items()):
        n = len(df)
        counts = df["latent_class"].value_counts()
        p = counts.to_numpy() / n
        ax[0].loglog(np.arange(1, len(counts) + 1), p, ".-", ms=3, lw=0.8, label=f"{name} ({len(counts)} classes)")
        prev = [float(df[c].mean()) for c in CHEX5_NAMES]
        ax[1].bar(np.arange(5) + i * width, prev, width=width, label=name)
        ax[2].semilogx(p, false_negative_rates(p, batch)["p_any"], ".", ms=4, label=name)
        per_sample = false_negative_rates(df["latent_class_prob"].to_numpy(), batch)
        summary.append((name, n, counts, prev, per_sample))
    ax[0].set(title="latent class frequency by rank (long tail)", xlabel="rank", ylabel="share of studies")
    ax[1].set(title="CheX5 prevalence", ylabel="share of studies")
    ax[1].set_xticks(np.arange(5) + 0.4 - width / 2, ["Cardiomeg.", "Edema", "Effusion", "Pneumonia", "PTX"])
    ax[2].set(title=f"P(>=1 same-class sample among the other {batch - 1})", xlabel="class share p",
              ylabel="1 - (1 - p)^(B - 1)")
    for a in ax:
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    md = [f"| set | studies | classes | singletons | top class (share) | mean P(>=1 FN), B={batch} | "
          f"mean E[#FN], B={batch} |", "|---|---:|---:|---:|---|---:|---:|"]
    for name, n, counts, _prev, ps in summary:
        md.append(f"| {name} | {n} | {len(counts)} | {int((counts == 1).sum())} | `{counts.index[0]}` "
                  f"({counts.iloc[0] / n:.1%}) | {ps['p_any'].mean():.3f} | {ps['expected'].mean():.2f} |")
    md += ["", "| set | " + " | ".join(CHEX5_NAMES) + " |", "|---|" + "---:|" * 5]
    for name, _n, _counts, prev, _ps in summary:
        md.append(f"| {name} | " + " | ".join(f"{v:.1%}" for v in prev) + " |")
    md += ["", f"| set | latent class | share p | P(>=1 FN in B={batch}) | E[#FN] |", "|---|---|---:|---:|---:|"]
    for name, n, counts, _prev, _ps in summary:
        for cls, cnt in counts.iloc[:6].items():
            fn = false_negative_rates(np.array([cnt / n]), batch)
            md.append(f"| {name} | `{cls}` | {cnt / n:.4f} | {fn['p_any'][0]:.3f} | {fn['expected'][0]:.2f} |")
    return "\n".join(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--img", type=Path, default=Path("docs/img"))
    ap.add_argument("--phantom", type=Path, nargs="*", default=[], help="generated phantom folders to include")
    ap.add_argument("--plan", type=int, default=0, help="also plan N studies per source (classes only, no images)")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--no-sheet", action="store_true")
    args = ap.parse_args(argv)
    if not args.no_sheet:
        print(contact_sheet(args.img / "phantom_contact_sheet.png", size=args.size))
    tables = {}
    if args.plan:  # Open-i: each usable report once; composed: N draws
        tables[f"openi x{len(load_material().reports)}"] = plan_table("openi", len(load_material().reports))
        tables[f"composed x{args.plan}"] = plan_table("composed", args.plan)
    tables.update({p.name: table_from_phantom(p) for p in args.phantom})
    if tables:
        print(class_figure(tables, args.img / "phantom_classes.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
