"""Task `sides`: does the model tell which side a finding is on? The app's side check, measured on the MS-CXR
phrases that name one side (``docs/evaluation.md``, section 7.2).

A phrase names one side when ``medclr.data.hard_negatives.swap_side`` rewrites it with the image's report (left and
right exchanged; never when the phrase says bilateral or the report states the other side anywhere, so the
swapped phrase is false on the image: training's "other side" hard negatives follow the same rule). Its image
scores both (``DualEncoder.similarity``, what the loss trains), and ``medclr.inference.preference`` decides as the
app decides before it paints a phrase that names a side: the side written (right), the other side (wrong: the app
withholds the map and offers the other side's), or neither (undecided: no map). Control: a model that knows no
sides and decides as often gets right = wrong = (right + wrong) / 2.
"""

from __future__ import annotations

import numpy as np

from medclr.evaluation.markdown import fmt, header, interval, pooled_row, table
from medclr.evaluation.tasks import Task
from medclr.progress import progress_bar

RATES = ("right", "wrong", "undecided")


def sided_phrases(ph, manifest) -> dict[int, str]:
    """Phrase position -> the phrase with the other side, for the phrases that name one side."""
    from medclr.data.hard_negatives import swap_side

    out = {}
    for k, (text, idx) in enumerate(zip(ph.table["text"], ph.table["index"])):
        report = manifest["sentences"].iat[int(idx)] if "sentences" in manifest else None
        swapped = swap_side(str(text), [str(s) for s in report] if report is not None else [])
        if swapped is not None:
            out[k] = swapped
    return out


def _counts(decisions: np.ndarray) -> dict:
    n = int(decisions.size)
    c = {name: int((decisions == v).sum()) for name, v in zip(RATES, (1, -1, 0))}
    out = {"n": n, **{f"n_{k}": v for k, v in c.items()}, **{k: (v / n if n else None) for k, v in c.items()}}
    decided = c["right"] + c["wrong"]
    out["accuracy_decided"] = c["right"] / decided if decided else None
    out["accuracy_decided_CI"] = _wilson(c["right"], decided)
    return out


def _wilson(k: int, n: int) -> list[float] | None:
    """95 % Wilson interval of a proportion (scipy's ``binomtest``), None when n = 0."""
    from scipy.stats import binomtest

    if n == 0:
        return None
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return [float(ci.low), float(ci.high)]


def side_checks(model, enc, ph, text, manifest, progress: bool | str = "auto"):
    """(block, per-phrase DataFrame): each sided phrase's score gap over its other-side twin and the decision."""
    import pandas as pd
    import torch

    from medclr.inference.preference import preference

    swapped = {k: s for k, s in sided_phrases(ph, manifest).items() if int(ph.table["index"].iat[k]) in enc.regions}
    gap, decision = np.full(len(ph), np.nan), np.full(len(ph), np.nan)
    other = np.full(len(ph), None, dtype=object)
    if swapped:
        keys = sorted(swapped)
        twin = model.texts([swapped[k] for k in keys])
        by_image: dict[int, list[int]] = {}  # image -> positions in keys
        for p, k in enumerate(keys):
            by_image.setdefault(int(ph.table["index"].iat[k]), []).append(p)
        for idx, pos in progress_bar(by_image.items(), desc="sides", unit="img", total=len(by_image),
                                     enabled=progress):
            ks = [keys[p] for p in pos]
            s = model.scores(enc.regions[idx], torch.cat([text[ks], twin[pos]]))
            for j, k in enumerate(ks):
                gap[k] = s[j] - s[len(ks) + j]
                decision[k] = preference(float(s[j]), float(s[len(ks) + j]), model.tau)
                other[k] = swapped[k]
    sided = np.isfinite(decision)
    cats = ph.table["category"].to_numpy()
    block = _counts(decision[sided])
    block["per_category"] = {c: _counts(decision[sided & (cats == c)]) for c in sorted(set(cats[sided]))}
    block["n_phrases_total"] = len(ph)
    return block, pd.DataFrame({"side_alternative": other, "side_gap": gap, "side": decision})


class Sides(Task):
    name, order = "sides", 22
    uses = frozenset({"phrases"})

    def unavailable(self, inp):
        if not len(inp.phrases):
            return "no MS-CXR phrases"
        return None if sided_phrases(inp.phrases, inp.data.manifest) else "no MS-CXR phrase names one side"

    def run(self, inp):
        return side_checks(inp.model, inp.enc, inp.phrases, inp.phrase_text(), inp.data.manifest, inp.progress)

    def section(self, metrics, block, figs):
        def row(label, c):
            return [label, c["n"], *(f"{fmt(c[k])} ({c['n_' + k]})" for k in RATES),
                    f"{fmt(c['accuracy_decided'])} {interval(*(c['accuracy_decided_CI'] or (None, None)))}"]

        rows = [row(cat, c) for cat, c in block["per_category"].items()]
        rows.append(row("**all**", block))
        chance = (block["right"] + block["wrong"]) / 2 if block["n"] else None
        from medclr.inference.preference import PREFERENCE_ODDS

        return ["## Sides: the app's side check", "",
                f"{block['n']} of {block['n_phrases_total']} phrases name one side (left or right, the other side "
                "stated nowhere in the image's report). Each is scored on its image against the same phrase with the "
                f"other side; the model prefers one at {PREFERENCE_ODDS:.0f}:1 odds or more by its own two-sentence "
                "softmax (the rule the app applies before it paints a phrase that names a side). Right: the side "
                "written; wrong: the other (the app would withhold the map and offer the other side's); undecided: "
                "neither (no map). A model "
                f"that knows no sides and decides as often gets right = wrong = {fmt(chance)}.", "",
                *table(["category", "phrases", "right", "wrong", "undecided",
                        "right of decided [95 % Wilson CI]"], rows), ""]

    # --------------------------------------------------------------- several checkpoints

    def pool(self, runs, summary):
        from medclr.evaluation.seeds import pooled_entry

        if not any(m.get("sides") for m in runs):
            return None
        return {k: pooled_entry(runs, ("sides", k)) for k in (*RATES, "accuracy_decided")}

    def pooled_section(self, pooled, names):
        rows = [pooled_row(f"{k} (fraction of the sided phrases)", pooled[k]) for k in RATES]
        rows.append(pooled_row("right of decided", pooled["accuracy_decided"]))
        return ["## Sides: the app's side check", "", "Per category: each checkpoint's report.", "",
                *table(header("", names), rows), ""]


TASK = Sides()
