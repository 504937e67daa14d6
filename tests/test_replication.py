"""bench/paper_replication.py as a campaign, at toy size (--preset tiny): phantom, domain LM, the paper's and the
rule's eta tables, a shared warm start, runs one at a time; finished runs are skipped, a run stopped mid-way
resumes from its last checkpoint to the weights an uninterrupted run ends on, and RESULTS.md is rebuilt from the
run metrics under docs/ alone."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def campaign(work: Path, docs: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "paper_replication.py"), "--preset", "tiny", "--work",
                          str(work), "--docs", str(docs), *args], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_campaign_skips_finished_runs_and_resumes_a_half_finished_one(tmp_path):
    from medclr.inference.checkpoint import weights_sha256
    from medclr.training.checkpoint import _publish

    work, docs = tmp_path / "work", tmp_path / "docs"
    runs = docs / "replication" / "tiny" / "runs"
    campaign(work, docs, "--max-runs", "2")  # the plan's first two: InfoNCE and DCL-eta_LM, seed 0
    assert sorted(p.name for p in runs.iterdir()) == ["DCL-eta_LM_s0.json", "InfoNCE_s0.json"]
    first = json.loads((runs / "InfoNCE_s0.json").read_text())
    assert first["warm_start"]["steps"] == 6 and first["steps"] == 6 and 0 <= first["test"]["AUC"] <= 1
    lm = json.loads((runs / "DCL-eta_LM_s0.json").read_text())
    assert lm["eta_table"] == "eta_paper.parquet" and lm["warm_start"] == first["warm_start"]
    done_at = (runs / "InfoNCE_s0.json").stat().st_mtime_ns

    # DCL-eta_LM seed 0 as a run killed right after its step-3 checkpoint: no metrics, steps 4-6 gone, OUT holding
    # what step 3 published
    run = work / "runs" / "DCL-eta_LM_s0"
    straight = weights_sha256(run)
    (runs / "DCL-eta_LM_s0.json").unlink()
    for name in ("eval_test",):
        subprocess.run(["rm", "-r", str(run / name)], check=True)
    for step in (4, 5, 6):
        subprocess.run(["rm", "-r", str(run / "checkpoints" / f"step-{step:07d}")], check=True)
    _publish(run / "checkpoints" / "step-0000003", run)
    (run / "trainer_state.json").write_text((run / "checkpoints" / "step-0000003" / "trainer_state.json").read_text())
    status = campaign(work, docs, "--status").stderr
    assert "InfoNCE        seed 0  done" in status and "DCL-eta_LM     seed 0  partial (step 3)" in status
    assert "DCL-eta_LM     seed 1  missing" in status

    campaign(work, docs, "--max-runs", "1")
    log = (work / "logs" / "DCL-eta_LM_s0.log").read_text()
    assert "at step 3 of 6" in log  # resumed, not retrained
    assert weights_sha256(run) == straight  # resume is exact: the weights an uninterrupted run ends on
    assert (runs / "InfoNCE_s0.json").stat().st_mtime_ns == done_at  # a finished run is not run again
    assert (runs / "DCL-eta_LM_s0.json").exists() and not (runs / "InfoNCE_s1.json").exists()

    # seed 1 of both, as another sitting would commit them: RESULTS.md is rebuilt from the metrics alone
    for name in ("InfoNCE", "DCL-eta_LM"):
        rec = json.loads((runs / f"{name}_s0.json").read_text())
        rec["seed"] = 1
        rec["test"] = {k: v + 0.01 if name == "DCL-eta_LM" and isinstance(v, float) else v for k, v in rec["test"].items()}
        (runs / f"{name}_s1.json").write_text(json.dumps(rec))
    out = campaign(tmp_path / "elsewhere", docs, "--report")
    claims = [json.loads(x) for x in out.stdout.splitlines() if x.startswith('{"group"')]
    assert {c["metric"] for c in claims if c["claim"] == "DCL-eta_LM >= InfoNCE"} == {"AUC", "CNR", "mIoU", "Recall"}
    assert all(c["seeds"] == 2 and c["ci_low"] <= c["mean"] <= c["ci_high"] for c in claims)
    text = (docs / "RESULTS.md").read_text()
    assert "| P1 | DCL-eta_LM >= InfoNCE | AUC | 2 |" in text and "4 of 4 planned runs done" in text
    assert "## The eta tables against DCL's oracle" in text and "paper (DCL-eta_LM: a = 0.2, k = 0.35)" in text
