"""report.md of a several-checkpoint (seeds) `medclr eval`: the pooled tables, from the metrics
dict :func:`medclr.evaluation.seeds_run.evaluate_seeds` writes. Every pooled number is shown as
mean ± sd (n) with the Student-t 95 % CI of the mean over seeds, each checkpoint's own value beside
it (with its percentile-bootstrap CI where the single run computes one: zero-shot AUC/ACC)."""

from __future__ import annotations

from medclr.evaluation.markdown import fmt, interval, mean_sd, table
from medclr.evaluation.report import CAVEAT, TABLE1_TITLE, control_cells, mscxr_boxes, summary_columns, table1
from medclr.evaluation.tasks import tasks

__all__ = ["mean_sd", "pooled_markdown"]


def _summary_lines(m: dict) -> list[str]:
    s, cols = m["pooled"]["summary"], summary_columns()
    rows = [[f"**mean ± sd** ({m['n_checkpoints']} checkpoints)", *(mean_sd(s[c.key], c.decimals) for c in cols)],
            ["95 % CI of the mean over seeds (t)",
             *(interval(s[c.key]["ci_low"], s[c.key]["ci_high"], c.decimals) for c in cols)]]
    rows += [[f"{c['dir']}", *(fmt(c["summary"].get(k.key), k.decimals) for k in cols)] for c in m["checkpoints"]]
    rows += [[label, *(fmt(o.get(c.key), c.decimals) for c in cols)] for label, o in m.get("compare", {}).items()]
    control = ["chance / control (mean)", *control_cells(m["pooled"], pooled=True)]
    return [TABLE1_TITLE, "", *table1(rows, control), "",
            "Each checkpoint's row is its own report's Table 1 row. The CI is that of the mean over the checkpoints "
            "(Student t, n − 1 degrees of freedom): how well these seeds pin the method's expected score. The sd is "
            "the spread of one run.", "", f"*{CAVEAT}*", ""]


def pooled_markdown(m: dict) -> str:
    """The pooled report.md (links to each checkpoint's own report), each task's pooled section in task order."""
    names = [c["dir"] for c in m["checkpoints"]]
    p = m["pooled"]
    lines = [f"# medclr evaluation report: {m['n_checkpoints']} checkpoints (training seeds), pooled", "",
             f"- data: `{m['data']}` (split `{m['split']}`); {mscxr_boxes(m)}",
             f"- tasks: {', '.join(m['tasks'])}; seed of samples, bootstraps and controls: {m['seed']}",
             "- each checkpoint is evaluated alone, exactly as a single `medclr eval` (its own report, metrics.json, "
             "figures); this page pools them: mean ± sd (sample sd, ddof = 1) over checkpoints, n = checkpoints "
             "with a defined value, and the 95 % CI of the mean over seeds (Student t). `docs/evaluation.md` §8.",
             "- protocol: `docs/evaluation.md` (pinned metric choices and the runner section)", "",
             *table(["", "checkpoint", "report"],
                    [[c["dir"], f"`{c['checkpoint']}`", f"[{c['dir']}/report.md]({c['dir']}/report.md)"]
                     for c in m["checkpoints"]]), ""]
    lines += [f"> note: {n}" for n in m["notes"]] + ([""] if m["notes"] else [])
    lines += _summary_lines(m)
    for t in tasks():
        if p.get(t.name):
            lines += t.pooled_section(p[t.name], names)
    return "\n".join(lines) + "\n"
