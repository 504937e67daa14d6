"""Task `probe`: logistic regression on frozen global embeddings (``docs/evaluation.md`` sections 4 and
7.2): CheX5 labels at 1/10/100 % of the train-split labels with a shuffled-label control, and the
phantom's latent class (its most frequent classes) with a t-SNE of the test embeddings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from medclr.evaluation.markdown import fmt, header, pooled_row, table
from medclr.evaluation.tasks import Task

LATENT_TOP = 10  # latent-class probe: the most frequent classes
FRACTIONS = ("1%", "10%", "100%")


def probe_metrics(enc, data, train_rows: np.ndarray, test_rows: np.ndarray, classes: list[str], seed: int) -> dict:
    from medclr.evaluation.data import has_two_label_values, labels, top_classes
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


class Probe(Task):
    name, order = "probe", 40
    uses = frozenset({"test", "train"})

    def unavailable(self, inp):
        return None if inp.test_rows.size > 0 and inp.train_rows.size > 1 else f"no train and {inp.split} images"

    def run(self, inp):
        return probe_metrics(inp.enc, inp.data, inp.train_rows, inp.test_rows, inp.classes, inp.seed), None

    def figures(self, outdir, p, inp, per_phrase):
        from medclr.evaluation.plots import save_report_figure
        from medclr.evaluation.probe import plot_tsne

        if p.get("_tsne") is None or len(p["_tsne"][0]) < 10:
            return {}
        x, lab = p["_tsne"]
        fig, _ = plot_tsne(x, np.asarray(lab).astype(str), seed=inp.seed, label_name="latent class",
                           title=f"t-SNE of {len(x)} {inp.split} global embeddings")
        return {"tsne": save_report_figure(fig, outdir, "figures/tsne.png")}

    def section(self, metrics, p, figs):
        rows = []
        if "chex5" in p:
            rows.append(["CheX5 macro AUC", *(fmt(p["chex5"][f]["macro_AUC"]) for f in FRACTIONS),
                         fmt(p["control_shuffled_labels"]["macro_AUC"])])
        if "latent_class" in p:
            lc = p["latent_class"]
            what = f"latent class, {len(lc['100%']['per_class'])} most frequent ({lc['n_train']} / {lc['n_test']} images)"
            rows.append([f"{what}: macro AUC", *(fmt(lc[f]["macro_AUC"]) for f in FRACTIONS), "–"])
            rows.append([f"{what}: accuracy", *(fmt(lc[f]["accuracy"]) for f in FRACTIONS), "–"])
        lines = ["## Linear probe on frozen global embeddings", "",
                 f"Logistic regression on {p['n_train']} train-split images (1 / 10 / 100 % of their labels), "
                 f"scored on {p['n_test']} {metrics['split']}-split images.", "",
                 *table(["", "1 %", "10 %", "100 %", "100 %, shuffled train labels"], rows), ""]
        if figs.get("tsne"):
            lines += [f"![t-SNE]({figs['tsne']})", ""]
        return lines

    # --------------------------------------------------------------- several checkpoints

    def pool(self, runs, summary):
        from medclr.evaluation.seeds import metric_at, pooled_entry

        if not any(metric_at(m, "probe", "chex5") for m in runs):
            return None
        return {"chex5_macro_AUC": {f: pooled_entry(runs, ("probe", "chex5", f, "macro_AUC")) for f in FRACTIONS},
                "control_shuffled_labels": pooled_entry(runs, ("probe", "control_shuffled_labels", "macro_AUC"))}

    def pooled_section(self, p, names):
        rows = [pooled_row(f"CheX5 macro AUC, {f} of labels", e) for f, e in p["chex5_macro_AUC"].items()]
        rows.append(pooled_row("CheX5 macro AUC, 100 %, shuffled train labels", p["control_shuffled_labels"]))
        return ["## Linear probe on frozen global embeddings", "", *table(header("", names), rows), ""]


TASK = Probe()
