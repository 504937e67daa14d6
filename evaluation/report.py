"""report.md and the metrics.json helpers of `medclr eval`: the run's header, a Table-1-shaped
comparison with the paper, then each task's own section and figures (``evaluation/task_*.py``,
in task order). Figures are PNGs under ``figures/`` (kept well under 1 MB: images are shown at
most 512 px on their long side)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from medclr.evaluation.markdown import fmt, table
from medclr.evaluation.tasks import Column, tasks

#: The sample-specific debiasing paper (Wang et al., MLHC 2023), MIMIC-CXR CheX5 + MS-CXR.
PAPER_TABLE1_KEYS = ("AUC", "ACC", "CNR", "mIoU", "Recall", "MedR")
PAPER_TABLE1 = {
    "BioViL (paper)": (0.78, 0.62, 1.14, 0.17, 0.25, 148),
    "LSE+NL (paper)": (0.79, 0.65, 1.40, 0.19, 0.29, 115),
    "DCL-η=0.05 (paper)": (0.80, 0.72, 1.46, 0.19, 0.30, 104),
    "DCL-η_LM (paper)": (0.86, 0.72, 1.49, 0.20, 0.30, 104),
}
CAVEAT = ("The paper's rows are MIMIC-CXR (CheX5, ~1k images per class) and MS-CXR (1,162 phrases) numbers with "
          "ResNet-18 + CXR-BERT; rows of this run come from the data named above. Phantom numbers are not MIMIC "
          "numbers: they show that the pipeline works and how methods rank on a controlled benchmark, not how a "
          "model does on real radiographs.")
TABLE1_TITLE = "## Summary (the shape of the paper's Table 1)"


def summary_columns() -> list[Column]:
    """Table 1's columns: every task's, in task order."""
    return [c for t in tasks() for c in t.columns]


SUMMARY_KEYS = tuple(c.key for c in summary_columns())  # the Table 1 row, in its order


def table1(rows: list[list[Any]], control: list[str]) -> list[str]:
    """Table 1: the given rows, the chance/control row, then the paper's rows."""
    cols = summary_columns()
    paper = [[name, *(fmt(dict(zip(PAPER_TABLE1_KEYS, vals)).get(c.key), 2) for c in cols)]
             for name, vals in PAPER_TABLE1.items()]
    return table(["", *(f"{c.key} {c.arrow}" for c in cols)], [*rows, control, *paper])


def control_cells(blocks: dict, pooled: bool = False) -> list[str]:
    """Each task's cells of the chance/control row ("–" for a task without a block)."""
    cells = []
    for t in tasks():
        b = blocks.get(t.name)
        cells += (t.pooled_control(b) if pooled else t.control(b)) if b else ["–"] * len(t.columns)
    return cells


# --------------------------------------------------------------------------- metrics.json


def summary(metrics: dict) -> dict[str, float | None]:
    """The Table 1 row: each task's summary values (None for a task that did not run)."""
    out: dict[str, float | None] = {}
    for t in tasks():
        block = metrics.get(t.name)
        values = t.summary(block) if block else {}
        out.update({c.key: values.get(c.key) for c in t.columns})
    return out


def summary_notes(metrics: dict) -> dict[str, str]:
    """What qualifies each Table 1 value (``Task.summary_notes``), by column key."""
    out: dict[str, str] = {}
    for t in tasks():
        block = metrics.get(t.name)
        out.update(t.summary_notes(block) if block else {})
    return out


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


def mscxr_boxes(m: dict) -> str:
    """The header's "MS-CXR boxes: ..." for metrics ``m`` (single or pooled): the box file and which phrases,
    or, when the data had none (``mscxr`` is null), that the phrase tasks could not run."""
    if not m.get("mscxr"):
        return ("MS-CXR boxes: none with this data, so grounding and phrase retrieval are not measured (a manifest's "
                "boxes are read from `<stem>.mscxr.parquet` beside it, a MIMIC root's from its "
                "`MS_CXR_Local_Alignment_v*.csv`)")
    phrases = (f"those on the evaluated `{m['split']}` images" if m["mscxr_split"] == "auto"
               else f"MS-CXR split `{m['mscxr_split']}`")
    return f"MS-CXR boxes: `{m['mscxr']}` (phrases: {phrases})"


def _header_lines(m: dict) -> list[str]:
    tr, model, pre = m["model"].get("training") or {}, m["model"], m["model"]["preprocess"]
    lines = ["# medclr evaluation report", "",
             f"- checkpoint: `{m['checkpoint']}`", f"- data: `{m['data']}` (split `{m['split']}`)",
             f"- {mscxr_boxes(m)}",
             f"- model: {model.get('image_arch')}, head `{model['head'].get('type')}`, joint dim {model['joint_dim']}, "
             f"input: shorter side → {pre['resize']} px, centre crop {pre['image_size']} px"]
    if tr:
        uninformative = (f" (an InfoNCE-type loss of an uninformative model is about ln {tr['global_batch']} = "
                         f"{math.log(tr['global_batch']):.3f})" if tr.get("global_batch") else "")
        lines.append(f"- training (checkpoint_meta.json): loss `{tr.get('loss')}`, {tr.get('step')} steps of "
                     f"{tr.get('global_batch')} pairs ({tr.get('n_train')} training pairs), last loss "
                     f"{fmt(tr.get('last_loss'))}{uninformative}")
    lines += [f"- images encoded: {m['n_images_encoded']} ({len(m['failed_images'])} unreadable, left out); encode time "
              f"{m['timing_s']['encode']} s", "- protocol: `docs/evaluation.md` (pinned metric choices and the runner section)",
              ""]
    return lines + [f"> note: {n}" for n in m["notes"]] + ([""] if m["notes"] else [])


def _summary_lines(m: dict) -> list[str]:
    cols = summary_columns()
    notes = m.get("summary_notes") or {}
    rows = [["**this run**", *(fmt(m["summary"][c.key], c.decimals) + (f" ({notes[c.key]})" if c.key in notes else "")
                               for c in cols)]]
    rows += [[label, *(fmt(o.get(c.key), c.decimals) for c in cols)] for label, o in m.get("compare", {}).items()]
    return [TABLE1_TITLE, "", *table1(rows, ["chance / control", *control_cells(m)]), "",
            "AUC/ACC: CheX5 zero-shot, macro over classes. CNR/mIoU: MS-CXR-format grounding, macro over categories. "
            "Recall: mean of R@10/50/100 over both retrieval directions; MedR: mean of the two median ranks. "
            "Chance/control row: AUC of an uninformative score (the zero-shot section adds the AUC of these scores "
            "with labels shuffled across images); grounding with each phrase's map computed for a phrase of "
            "another image, scored against the same boxes (CNR is not 0 for an uninformative map); retrieval at "
            "chance (K/n, (n+1)/2).", "", f"*{CAVEAT}*", ""]


def markdown(metrics: dict, figs: dict[str, dict]) -> str:
    """report.md: the header, Table 1, then each task's section (``figs``: each task's figures, by name)."""
    lines = _header_lines(metrics) + _summary_lines(metrics)
    for t in tasks():
        if metrics.get(t.name):
            lines += t.section(metrics, metrics[t.name], figs.get(t.name, {}))
    return "\n".join(lines) + "\n"


def write_report(outdir: Path, metrics: dict, inp, per_phrase, figures: bool = True) -> Path:
    """report.md, with each task's figures under ``figures/`` unless ``figures=False``
    (``inp``: the runner's ``evaluation.tasks.Inputs``)."""
    figs = {t.name: t.figures(outdir, metrics[t.name], inp, per_phrase)
            for t in tasks() if figures and metrics.get(t.name)}
    path = outdir / "report.md"
    path.write_text(markdown(metrics, figs))
    return path
