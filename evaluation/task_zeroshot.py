"""Task `zeroshot`: CheX5 zero-shot classification (``docs/evaluation.md`` sections 3 and 7.2).

Scores are the checkpoint's own image–sentence scores with each class's reduced prompts (computed
while encoding, ``evaluation.data.encode``); metrics are ``zero_shot_metrics`` (AUC, ACC, bootstrap
CIs), with a shuffled-label control and the prompt check (``evaluation.diagnostics``).
"""

from __future__ import annotations

import math

import numpy as np

from medclr.evaluation.markdown import ci, fmt, header, mean_sd, pooled_row, table
from medclr.evaluation.tasks import Column, Task

#: The paper's Table 3, zero-shot AUC: Cardiomegaly, Edema, Pleural Effusion, Pneumonia, Pneumothorax, Avg.
PAPER_TABLE3 = {
    "BioViL (paper)": (0.752, 0.887, 0.914, 0.768, 0.594, 0.783),
    "LSE+NL (paper)": (0.888, 0.876, 0.798, 0.853, 0.526, 0.788),
    "w/ DCL-η_LM (paper)": (0.884, 0.889, 0.913, 0.861, 0.760, 0.862),
}
TABLE3_CLASSES = ("Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax")
TABLE3_HEADER = ["", "Cardiomegaly", "Edema", "Effusion", "Pneumonia", "Pneumothorax", "Avg"]


def zeroshot_metrics(enc, data, test_rows: np.ndarray, prompts, n_boot: int, seed: int) -> dict:
    """AUC/ACC of the encoded scores on the test images, with the shuffled-label control."""
    from medclr.evaluation.data import labels
    from medclr.metrics import zero_shot_metrics

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


def calibration_metrics(engine, z: dict) -> dict | None:
    """Per class, the expected calibration error on the test images of the probability a reader is shown:
    before (softmax over the prompt pair at the loss's temperature) and after the checkpoint's validation
    calibration (``medclr.findings``), and whether the checkpoint reads the finding. None without a record."""
    from medclr.findings import expected_calibration_error, probability, sigmoid

    record = engine.findings_record
    if record is None:
        return None
    margin, y = z["_scores"]
    out = {}
    for j, c in enumerate(z["classes"]):
        calibrated, note = probability(record, c, margin[:, j])
        out[c] = {"ECE_softmax": expected_calibration_error(sigmoid(margin[:, j] / engine.tau), y[:, j]),
                  "ECE_calibrated": expected_calibration_error(calibrated, y[:, j]) if note is None else None,
                  "reads": note is None, "validation_AUC": (record["classes"].get(c) or {}).get("auc"),
                  "note": note}
    return out


class ZeroShot(Task):
    name, order = "zeroshot", 10
    uses = frozenset({"test", "prompts"})
    columns = (Column("AUC"), Column("ACC"))

    def unavailable(self, inp):
        from medclr.evaluation.data import has_two_label_values, labels

        if inp.test_rows.size and has_two_label_values(labels(inp.data, inp.test_rows, inp.classes)):
            return None
        return f"no {inp.split} images with 1/0 labels for {inp.classes}"

    def run(self, inp):
        from medclr.evaluation.diagnostics import zeroshot_diagnostics

        res = zeroshot_metrics(inp.enc, inp.data, inp.test_rows, inp.prompts, inp.n_boot, inp.seed)
        res.update(zeroshot_diagnostics(inp.model, inp.enc, inp.data, inp.test_rows, inp.prompts))  # prompt check
        res["calibration"] = calibration_metrics(inp.model.engine, res)
        return res, None

    def notes(self, z):
        left = z["macro"]["AUC_left_out"]
        if not left:
            return []
        pc = z["per_class"]
        why = ", ".join(f"{c} ({pc[c]['n']} usable labels, {pc[c]['n_pos']} positive)" for c in left)
        return [f"zeroshot: no AUC for {why}: the macro AUC and ACC are over {len(z['macro']['AUC_classes'])} of "
                f"{len(z['classes'])} classes ({', '.join(z['macro']['AUC_classes']) or 'none'})"]

    def summary(self, z):
        return {"AUC": z["macro"]["AUC"], "ACC": z["macro"]["ACC"]}

    def summary_notes(self, z):
        if not z["macro"]["AUC_left_out"]:
            return {}
        over = f"over {len(z['macro']['AUC_classes'])} of {len(z['classes'])} classes"
        return {"AUC": over, "ACC": over}

    def control(self, z):
        return ["0.500", "–"]

    def figures(self, outdir, z, inp, per_phrase):
        from medclr.evaluation.plots import plot_roc_curves, save_report_figure

        scores, y = z["_scores"]
        fig = plot_roc_curves(scores, y, z["classes"], title="CheX5 zero-shot ROC")
        return {"roc": save_report_figure(fig, outdir, "figures/roc.png")}

    def section(self, metrics, z, figs):
        from medclr.evaluation.diagnostics import markdown_lines

        cls, pc = z["classes"], z["per_class"]
        rows = [[c, f"{fmt(pc[c]['AUC'])}{ci(pc[c]['AUC_CI'])}", f"{fmt(pc[c]['ACC'])}{ci(pc[c]['ACC_CI'])}", pc[c]["n"],
                 pc[c]["n_pos"], fmt(z["control_shuffled_labels"]["per_class_AUC"][c])] for c in cls]
        rows.append(["**macro**", f"**{fmt(z['macro']['AUC'])}**{ci(z['macro']['AUC_CI'])}",
                     f"**{fmt(z['macro']['ACC'])}**{ci(z['macro']['ACC_CI'])}", "", "",
                     fmt(z["control_shuffled_labels"]["AUC"])])
        lines = ["## Zero-shot classification (Table 3 shape)", "",
                 f"{z['n_images']} images; 95 % percentile-bootstrap CIs ({z['n_boot']} resamples). Labels −1/NaN are "
                 "left out per class.", "",
                 *table(["class", "AUC [95 % CI]", "ACC [95 % CI]", "n", "n pos", "AUC, shuffled labels"], rows), "",
                 *markdown_lines(z)]  # evaluation.diagnostics: prompt cosine and sign check
        if z.get("calibration"):
            rows = [[c, fmt(v["validation_AUC"]), "reads it" if v["reads"] else "not shown", fmt(v["ECE_softmax"]),
                     fmt(v["ECE_calibrated"])] for c, v in z["calibration"].items()]
            lines += ["### Calibration (what the app and the scorer show)", "",
                      "Expected calibration error on these images (10 bins): the softmax over the prompt pair at the "
                      "loss's temperature, and the checkpoint's per-finding Platt calibration from its validation "
                      "split (`medclr.findings`; a finding below the validation bar is shown without a probability).",
                      "", *table(["class", "validation AUC", "app", "ECE softmax", "ECE calibrated"], rows), ""]
        if tuple(cls) == TABLE3_CLASSES:
            ours = [pc[c]["AUC"] for c in cls] + [z["macro"]["AUC"]]
            lines += ["Paper's Table 3 (MIMIC-CXR) beside this run:", "",
                      *table(TABLE3_HEADER, [["this run", *(fmt(v) for v in ours)]]
                             + [[k, *(fmt(v) for v in vals)] for k, vals in PAPER_TABLE3.items()]), ""]
        if figs.get("roc"):
            lines += [f"![ROC curves]({figs['roc']})", ""]
        return lines

    # --------------------------------------------------------------- several checkpoints

    def pooled_summary(self, runs):
        from medclr.evaluation.seeds import pooled_entry

        return {k: pooled_entry(runs, ("zeroshot", "macro", k), ("zeroshot", "macro", f"{k}_CI")) for k in ("AUC", "ACC")}

    def pool(self, runs, summary):
        from medclr.evaluation.seeds import metric_at, pooled_entry

        if not any(m.get("zeroshot") for m in runs):
            return None
        classes: list[str] = []
        for m in runs:
            classes += [c for c in (metric_at(m, "zeroshot", "classes") or []) if c not in classes]
        entry = lambda *path: pooled_entry(runs, ("zeroshot", *path))  # noqa: E731
        z: dict = {"classes": classes, "n_images": [metric_at(m, "zeroshot", "n_images") for m in runs]}
        z["per_class"] = {c: {"AUC": pooled_entry(runs, ("zeroshot", "per_class", c, "AUC"),
                                                  ("zeroshot", "per_class", c, "AUC_CI"))} for c in classes}
        z["macro"] = {"AUC": summary["AUC"], "ACC": summary["ACC"]}
        z["control_shuffled_labels"] = {"AUC": entry("control_shuffled_labels", "AUC")}
        z["prompt_cosine"] = {c: entry("prompt_cosine", c) for c in classes}
        z["sign_check"] = {}
        for c in classes:
            e = entry("sign_check", c)
            e["n_flipped"] = int(sum(p["value"] < 0 for p in e["per_checkpoint"]))
            z["sign_check"][c] = e
        return z

    def pooled_section(self, z, names):
        from medclr.evaluation.diagnostics import EXPLAIN, sign_word

        cls = z["classes"]
        rows = [pooled_row(c, z["per_class"][c]["AUC"]) for c in cls]
        rows.append(pooled_row("**macro AUC**", z["macro"]["AUC"]))
        rows.append(pooled_row("macro ACC", z["macro"]["ACC"]))
        rows.append(pooled_row("macro AUC, shuffled labels", z["control_shuffled_labels"]["AUC"]))
        lines = ["## Zero-shot classification (Table 3 shape)", "",
                 f"Images per checkpoint: {', '.join(str(n) for n in z['n_images'])}. Per checkpoint: AUC "
                 "[95 % percentile-bootstrap CI of that run].", "",
                 *table(header("class", names), rows), ""]
        if tuple(cls) == TABLE3_CLASSES:
            ours = [mean_sd(z["per_class"][c]["AUC"]) for c in cls] + [mean_sd(z["macro"]["AUC"])]
            lines += ["Paper's Table 3 (MIMIC-CXR) beside the mean over checkpoints:", "",
                      *table(TABLE3_HEADER, [["this run (mean ± sd)", *ours]]
                             + [[k, *(fmt(v) for v in vals)] for k, vals in PAPER_TABLE3.items()]), ""]
        rows = []
        for c in cls:
            pc, sc = z["prompt_cosine"][c], z["sign_check"][c]
            n_def = sum(math.isfinite(p["value"]) for p in sc["per_checkpoint"])
            rows.append([c, mean_sd(pc, 4), mean_sd(sc), sign_word(sc["mean"]), f"{sc['n_flipped']} of {n_def}",
                         *(f"{fmt(a['value'], 4)} / {fmt(b['value'])}"
                           for a, b in zip(pc["per_checkpoint"], sc["per_checkpoint"]))])
        lines += ["### Prompt check", "", EXPLAIN, "",
                  *table(["class", "prompt cosine", "sign check", "sign of the mean", "FLIPPED in",
                          *(f"{n}: prompt cos / sign check" for n in names)], rows), ""]
        return lines


TASK = ZeroShot()
