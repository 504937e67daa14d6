"""Figures for evaluation reports: ROC curves per class, grounding heatmap panels.

Figures are built with ``matplotlib.figure.Figure`` on an Agg canvas, never through pyplot, so
nothing touches the global backend or pyplot's figure registry (safe in servers and loops,
no figure leaks). Every function returns the Figure and, when ``path`` is given, also writes
a PNG there; :func:`figure_to_png` gives PNG bytes (e.g. for the app).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from sklearn.metrics import roc_auc_score, roc_curve

__all__ = [
    "BIOVIL_CONTOUR_LEVELS",
    "display_image",
    "figure_to_png",
    "new_figure",
    "plot_heatmap_panel",
    "plot_roc_curves",
    "save_png",
    "save_report_figure",
]

#: BioViL's iso-contour levels (hi-ml-multimodal; docs/evaluation.md section 5).
BIOVIL_CONTOUR_LEVELS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)


def new_figure(width: float, height: float) -> Figure:
    """A Figure attached to an Agg canvas (no pyplot)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


#: Report figures: images shown at most this many px on their long side, PNGs kept under ~0.9 MB.
DISPLAY_MAX = 512
REPORT_DPI = 100
MAX_PNG_BYTES = 900_000


def save_report_figure(fig: Figure, outdir: Path, name: str) -> str:
    """Write ``fig`` to ``outdir/name`` as PNG, at a lower resolution if needed to stay under 1 MB (noisy
    images compress badly). Returns ``name`` (the path relative to the report)."""
    path = Path(outdir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    for dpi in (REPORT_DPI, 72, 50):
        fig.savefig(path, format="png", dpi=dpi)
        if path.stat().st_size < MAX_PNG_BYTES:
            break
    return name


def display_image(image: np.ndarray) -> tuple[np.ndarray, float]:
    """``image`` scaled to at most DISPLAY_MAX px on its long side (antialiased), and the scale."""
    import torch

    h, w = image.shape
    s = min(1.0, DISPLAY_MAX / max(h, w))
    if s == 1.0:
        return image, 1.0
    size = (max(1, round(h * s)), max(1, round(w * s)))
    t = torch.nn.functional.interpolate(torch.from_numpy(np.ascontiguousarray(image))[None, None].float(), size=size,
                                        mode="bilinear", align_corners=False, antialias=True)
    return t[0, 0].numpy(), s


def save_png(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Write ``fig`` as PNG (parent directories created)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, format="png", dpi=dpi)
    return p


def figure_to_png(fig: Figure, dpi: int = 120) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def plot_roc_curves(
    scores: np.ndarray,
    labels: np.ndarray,
    classes: Sequence[str],
    path: str | Path | None = None,
    *,
    title: str | None = None,
) -> Figure:
    """One ROC panel per class (``sklearn.metrics.roc_curve``), AUC in the legend.

    ``scores``/``labels`` are (N, C); labels 1/0 are used, −1 and NaN ignored (as in
    :func:`medclr.evaluation.zeroshot.zero_shot_metrics`). A class with one label value gets an
    empty panel saying so.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if s.ndim == 1:
        s, y = s[:, None], y[:, None]
    if s.shape != y.shape or s.shape[1] != len(classes):
        raise ValueError(f"scores {s.shape} and labels {y.shape} must be (N, {len(classes)})")
    n_cls = len(classes)
    ncols = min(n_cls, 5)
    nrows = math.ceil(n_cls / ncols)
    fig = new_figure(3.0 * ncols, 3.1 * nrows)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for j, (ax, cls) in enumerate(zip(axes, classes)):
        v = np.isin(y[:, j], (0.0, 1.0))
        yj, sj = y[v, j].astype(int), s[v, j]
        ax.plot([0, 1], [0, 1], ls=":", color="grey", lw=1)
        if 0 < yj.sum() < yj.size:
            fpr, tpr, _ = roc_curve(yj, sj)
            ax.plot(fpr, tpr, lw=1.8, label=f"AUC {roc_auc_score(yj, sj):.3f} (n={yj.size})")
            ax.legend(loc="lower right", fontsize=8)
        else:
            ax.text(0.5, 0.5, "one label value only", ha="center", va="center", fontsize=8)
        ax.set(title=str(cls), xlabel="false positive rate", ylabel="true positive rate", xlim=(0, 1), ylim=(0, 1))
        ax.set_aspect("equal")
    for ax in axes[n_cls:]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title)
    if path is not None:
        save_png(fig, path)
    return fig


def _draw_boxes(ax, boxes_xywh) -> None:
    for x, y, w, h in np.asarray(list(boxes_xywh or []), dtype=np.float64).reshape(-1, 4):
        # pixel (i, j) is drawn centred at (j, i) by imshow, so a box starts at x - 0.5
        ax.add_patch(Rectangle((x - 0.5, y - 0.5), w, h, fill=False, ls="--", lw=1.5, ec="black"))


def plot_heatmap_panel(
    image: np.ndarray,
    sim_map: np.ndarray,
    boxes_xywh: Sequence[Sequence[float]] | None = None,
    path: str | Path | None = None,
    *,
    threshold: float | None = None,
    levels: Sequence[float] = BIOVIL_CONTOUR_LEVELS,
    title: str | None = None,
    vmin: float = -1.0,
    vmax: float = 1.0,
) -> Figure:
    """BioViL-style three panels: the image, iso-contours of the map, the map overlaid.

    ``image`` is (H, W) grey (any range; shown with min-max scaling); ``sim_map`` (H, W)
    region–sentence scores at the same resolution, NaN outside the crop (drawn transparent).
    Overlay: ``RdBu_r``, fixed range [vmin, vmax] = [−1, 1], alpha 0.5, with a colour bar.
    Contours at ``levels`` (BioViL's 0.25/0.5/0.75/1.0), or at the single ``threshold`` when
    given. Ground-truth boxes ``(x, y, w, h)`` are black dashed rectangles on every panel.
    """
    img = np.asarray(image, dtype=np.float64)
    m = np.asarray(sim_map, dtype=np.float64)
    if img.ndim != 2 or m.shape != img.shape:
        raise ValueError(f"image {img.shape} and sim_map {m.shape} must be the same (H, W)")
    fig = new_figure(12.0, 4.4)
    ax_img, ax_iso, ax_map = fig.subplots(1, 3)
    for ax in (ax_img, ax_iso, ax_map):
        ax.imshow(img, cmap="gray", interpolation="bilinear")
        ax.set_axis_off()
    ax_img.set_title("input")
    lv = [float(threshold)] if threshold is not None else sorted(float(v) for v in levels)
    finite = m[np.isfinite(m)]
    lv_drawn = [v for v in lv if finite.size and finite.min() < v < finite.max()]
    if lv_drawn:
        cs = ax_iso.contour(np.ma.masked_invalid(m), levels=lv_drawn, cmap="RdBu_r", vmin=vmin, vmax=vmax, linewidths=1.5)
        ax_iso.clabel(cs, inline=True, fontsize=7, fmt="%.2f")
    ax_iso.set_title("isolines " + ", ".join(f"{v:g}" for v in lv))
    im = ax_map.imshow(np.ma.masked_invalid(m), cmap="RdBu_r", vmin=vmin, vmax=vmax, alpha=0.5, interpolation="nearest")
    fig.colorbar(im, ax=ax_map, fraction=0.046, pad=0.02, label="similarity")
    ax_map.set_title("similarity")
    for ax in (ax_img, ax_iso, ax_map):
        _draw_boxes(ax, boxes_xywh)
    if title:
        fig.suptitle(title)
    if path is not None:
        save_png(fig, path)
    return fig
