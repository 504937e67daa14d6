"""report.md of a several-checkpoint (seeds) `medclr eval`: the pooled tables, from the metrics
dict :func:`medclr.evaluation.seeds_run.evaluate_seeds` writes. Every pooled number is shown as
mean ± sd (n) with the Student-t 95 % CI of the mean over seeds, each checkpoint's own value beside
it (with its percentile-bootstrap CI where the single run computes one: zero-shot AUC/ACC)."""

from __future__ import annotations

import math
from typing import Any

from medclr.evaluation.diagnostics import EXPLAIN, sign_word
from medclr.evaluation.report import CAVEAT, PAPER_TABLE1, PAPER_TABLE3, PAPER_TABLE4, SUMMARY_KEYS as KEYS, _table, fmt

__all__ = ["mean_sd", "pooled_markdown"]


def mean_sd(e: dict | None, nd: int = 3) -> str:
    """"0.712 ± 0.031" (the sd is left out when undefined, e.g. n = 1)."""
    if not e or e.get("n", 0) == 0:
        return "–"
    sd = e.get("sd")
    return fmt(e["mean"], nd) + ("" if sd is None or (isinstance(sd, float) and math.isnan(sd)) else f" ± {fmt(sd, nd)}")


def _interval(lo: Any, hi: Any, nd: int = 3) -> str:
    bad = [v is None or (isinstance(v, float) and not math.isfinite(v)) for v in (lo, hi)]
    return "–" if any(bad) else f"[{lo:.{nd}f}, {hi:.{nd}f}]"


def _per_ckpt(p: dict, nd: int) -> str:
    ci = p.get("ci")
    return fmt(p["value"], nd) + (f" {_interval(ci[0], ci[1], nd)}" if ci else "")


def _row(label: str, e: dict, nd: int = 3) -> list[Any]:
    """label | mean ± sd | n | 95 % CI over seeds | each checkpoint's value [bootstrap CI]."""
    return [label, mean_sd(e, nd), e["n"], _interval(e["ci_low"], e["ci_high"], nd),
            *(_per_ckpt(p, nd) for p in e["per_checkpoint"])]


def _header(first: str, names: list[str]) -> list[str]:
    return [first, "mean ± sd", "n", "95 % CI of the mean (t)", *names]


def _summary_lines(m: dict) -> list[str]:
    s = m["pooled"]["summary"]
    nd = {k: 1 if k == "MedR" else 3 for k in KEYS}
    rows = [[f"**mean ± sd** ({m['n_checkpoints']} checkpoints)", *(mean_sd(s[k], nd[k]) for k in KEYS)],
            ["95 % CI of the mean over seeds (t)", *(_interval(s[k]["ci_low"], s[k]["ci_high"], nd[k]) for k in KEYS)]]
    rows += [[f"{c['dir']}", *(fmt(c["summary"].get(k), nd[k]) for k in KEYS)] for c in m["checkpoints"]]
    rows += [[label, *(fmt(o.get(k), nd[k]) for k in KEYS)] for label, o in m.get("compare", {}).items()]
    p = m["pooled"]
    g, r, z = p.get("grounding"), p.get("retrieval"), p.get("zeroshot")
    rows.append(["chance / control (mean)", "0.500" if z else "–", "–",
                 fmt(g["CNR_control"]["mean"]) if g else "–", fmt(g["mIoU_control"]["mean"]) if g else "–",
                 fmt(r["chance"]["Recall"]["mean"]) if r else "–", fmt(r["chance"]["MedR"]["mean"], 1) if r else "–"])
    rows += [[name, *(fmt(v, 2) if i < 5 else str(v) for i, v in enumerate(vals))] for name, vals in PAPER_TABLE1.items()]
    return ["## Summary (the shape of the paper's Table 1)", "",
            *_table(["", "AUC ↑", "ACC ↑", "CNR ↑", "mIoU ↑", "Recall ↑", "MedR ↓"], rows), "",
            "Each checkpoint's row is its own report's Table 1 row. The CI is that of the mean over the checkpoints "
            "(Student t, n − 1 degrees of freedom): how well these seeds pin the method's expected score. The sd is "
            "the spread of one run.", "", f"*{CAVEAT}*", ""]


def _zeroshot_lines(z: dict, names: list[str]) -> list[str]:
    cls = z["classes"]
    rows = [_row(c, z["per_class"][c]["AUC"]) for c in cls]
    rows.append(_row("**macro AUC**", z["macro"]["AUC"]))
    rows.append(_row("macro ACC", z["macro"]["ACC"]))
    rows.append(_row("macro AUC, shuffled labels", z["control_shuffled_labels"]["AUC"]))
    lines = ["## Zero-shot classification (Table 3 shape)", "",
             f"Images per checkpoint: {', '.join(str(n) for n in z['n_images'])}. Per checkpoint: AUC "
             "[95 % percentile-bootstrap CI of that run].", "",
             *_table(_header("class", names), rows), ""]
    if tuple(cls) == ("Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax"):
        ours = [mean_sd(z["per_class"][c]["AUC"]) for c in cls] + [mean_sd(z["macro"]["AUC"])]
        lines += ["Paper's Table 3 (MIMIC-CXR) beside the mean over checkpoints:", "",
                  *_table(["", "Cardiomegaly", "Edema", "Effusion", "Pneumonia", "Pneumothorax", "Avg"],
                          [["this run (mean ± sd)", *ours]] + [[k, *(fmt(v) for v in vals)] for k, vals in PAPER_TABLE3.items()]),
                  ""]
    rows = []
    for c in cls:
        pc, sc = z["prompt_cosine"][c], z["sign_check"][c]
        n_def = sum(math.isfinite(p["value"]) for p in sc["per_checkpoint"])
        rows.append([c, mean_sd(pc, 4), mean_sd(sc), sign_word(sc["mean"]), f"{sc['n_flipped']} of {n_def}",
                     *(f"{fmt(a['value'], 4)} / {fmt(b['value'])}"
                       for a, b in zip(pc["per_checkpoint"], sc["per_checkpoint"]))])
    lines += ["### Prompt check", "", EXPLAIN, "",
              *_table(["class", "prompt cosine", "sign check", "sign of the mean", "FLIPPED in",
                       *(f"{n}: prompt cos / sign check" for n in names)], rows), ""]
    return lines


def pooled_markdown(m: dict) -> str:
    """The pooled report.md (links to each checkpoint's own report)."""
    names = [c["dir"] for c in m["checkpoints"]]
    p = m["pooled"]
    lines = [f"# medclr evaluation report: {m['n_checkpoints']} checkpoints (training seeds), pooled", "",
             f"- data: `{m['data']}` (split `{m['split']}`); MS-CXR boxes: `{m['mscxr']}` (phrases: "
             + (f"those on the evaluated `{m['split']}` images" if m["mscxr_split"] == "auto"
                else f"MS-CXR split `{m['mscxr_split']}`") + ")",
             f"- tasks: {', '.join(m['tasks'])}; seed of samples, bootstraps and controls: {m['seed']}",
             "- each checkpoint is evaluated alone, exactly as a single `medclr eval` (its own report, metrics.json, "
             "figures); this page pools them: mean ± sd (sample sd, ddof = 1) over checkpoints, n = checkpoints "
             "with a defined value, and the 95 % CI of the mean over seeds (Student t). `docs/evaluation.md` §8.",
             "- protocol: `docs/evaluation.md` (pinned metric choices and the runner section)", "",
             *_table(["", "checkpoint", "report"],
                     [[c["dir"], f"`{c['checkpoint']}`", f"[{c['dir']}/report.md]({c['dir']}/report.md)"]
                      for c in m["checkpoints"]]), ""]
    lines += [f"> note: {n}" for n in m["notes"]] + ([""] if m["notes"] else [])
    lines += _summary_lines(m)
    if p.get("zeroshot"):
        lines += _zeroshot_lines(p["zeroshot"], names)
    g = p.get("grounding")
    if g:
        rows = [_row("CNR (category macro)", g["CNR"]), _row("mIoU (category macro)", g["mIoU"]),
                _row("CNR, other phrase's map", g["CNR_control"]), _row("mIoU, other phrase's map", g["mIoU_control"])]
        lines += ["## Phrase grounding (Table 4 shape)", "",
                  f"Phrases per checkpoint: {', '.join(str(n) for n in g['n_phrases'])}. Per category: each "
                  "checkpoint's report.", "", *_table(_header("", names), rows), "",
                  "Paper's Table 4 (MS-CXR): " + "; ".join(f"{k} CNR {v[0]:.3f}, mIoU {v[1]:.3f}"
                                                          for k, v in PAPER_TABLE4.items()), ""]
    r = p.get("retrieval")
    if r:
        rows = [_row("Recall (mean R@10/50/100, both directions)", r["Recall"]), _row("MedR", r["MedR"], 1),
                _row("Recall at chance", r["chance"]["Recall"]), _row("MedR at chance", r["chance"]["MedR"], 1)]
        lines += ["## Retrieval (Table 1's Recall and MedR)", "",
                  f"Phrases per checkpoint: {', '.join(str(n) for n in r['n_phrases'])}. Per direction and text "
                  "level: each checkpoint's report.", "", *_table(_header("", names), rows), ""]
    pr = p.get("probe")
    if pr:
        rows = [_row(f"CheX5 macro AUC, {f} of labels", e) for f, e in pr["chex5_macro_AUC"].items()]
        rows.append(_row("CheX5 macro AUC, 100 %, shuffled train labels", pr["control_shuffled_labels"]))
        lines += ["## Linear probe on frozen global embeddings", "", *_table(_header("", names), rows), ""]
    return "\n".join(lines) + "\n"
