"""Paired differences between two pooled ``medclr eval`` runs trained on the same seeds.

Every metric the pooled ``metrics.json`` holds per checkpoint (summary, per-class AUC, grounding
and its controls, retrieval) becomes one JSON line: A's and B's means and the mean of the per-seed
differences A − B with its Student-t 95 % CI (``medclr.evaluation.seeds.paired_difference``; checkpoint
k of A is paired with checkpoint k of B, so pass the seeds in the same order to both evals).

    python bench/paired_runs.py A/metrics.json B/metrics.json            # JSON lines
    python bench/paired_runs.py A/metrics.json B/metrics.json --markdown # the table docs/ quote
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from medclr.evaluation.seeds import paired_difference

# The rows docs/experiments/2026-11-23-negation-aware-text.md quotes (the rest stay in the JSON lines).
HEADLINE = ("summary.AUC", "summary.CNR", "summary.mIoU", "summary.Recall", "summary.MedR",
            *(f"zeroshot.per_class.{c}.AUC" for c in
              ("Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax")))


def per_seed(tree: dict, prefix: str = "") -> Iterator[tuple[str, list]]:
    """(dotted name, [value per checkpoint]) for every pooled entry under ``tree``."""
    for key, node in tree.items():
        if not isinstance(node, dict):
            continue
        name = f"{prefix}{key}"
        if "per_checkpoint" in node:
            yield name, [c.get("value") for c in node["per_checkpoint"]]
        else:
            yield from per_seed(node, name + ".")


def compare(a: dict, b: dict) -> list[dict]:
    pa, pb = dict(per_seed(a["pooled"])), dict(per_seed(b["pooled"]))
    rows = []
    for name, va in pa.items():
        vb = pb.get(name)
        if vb is None or len(vb) != len(va) or None in va or None in vb:
            continue  # a metric one arm did not compute (other --tasks) or left undefined for a seed
        d = paired_difference(va, vb)
        rows.append({"metric": name, "a": float(sum(va) / len(va)), "b": float(sum(vb) / len(vb)),
                     "diff": d["mean"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n": d["n"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="pooled metrics.json of arm A")
    p.add_argument("b", type=Path, help="pooled metrics.json of arm B (same seeds, same order)")
    p.add_argument("--markdown", action="store_true", help="print the headline rows as a Markdown table")
    args = p.parse_args(argv)
    runs = []
    for path in (args.a, args.b):
        m = json.loads(path.read_text())
        if "pooled" not in m:
            sys.exit(f"paired_runs: {path} is not a pooled `medclr eval` metrics.json (evaluate 2+ checkpoints)")
        runs.append(m)
    rows = compare(*runs)
    if not args.markdown:
        for r in rows:
            print(json.dumps(r))
        return 0
    by = {r["metric"]: r for r in rows}
    print("| metric | A | B | A − B [95 % CI] |\n| --- | --- | --- | --- |")
    for name in HEADLINE:
        if name in by:
            r = by[name]
            label = name.removeprefix("summary.").removeprefix("zeroshot.per_class.")
            print(f"| {label} | {r['a']:.3f} | {r['b']:.3f} | {r['diff']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
