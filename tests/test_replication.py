"""bench/paper_replication.py end to end at toy size (--dry-run): phantom, domain LM, eta table, two methods x
two seeds trained and evaluated as medclr subprocesses, then the claims with paired CIs, the loss effect on
both draws against the false-negative floor, and the eta_LM calibration, written to RESULTS.md."""

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_preset_dry_run_writes_claims_with_confidence_intervals(tmp_path):
    work = tmp_path / "work"
    docs = work / "docs"  # a dry run writes there, never to the repository's docs/
    out = subprocess.run([sys.executable, str(REPO / "bench" / "paper_replication.py"), "--preset", "gpu", "--dry-run",
                          "--work", str(work), "--methods", "InfoNCE,DCL-eta_LM", "--seeds", "0,1",
                          "--workers", "1", "--threads", "2"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    runs = [x for x in lines if "method" in x]
    assert sorted((r["method"], r["seed"]) for r in runs) == [("DCL-eta_LM", 0), ("DCL-eta_LM", 1), ("InfoNCE", 0),
                                                              ("InfoNCE", 1)]
    claims = [x for x in lines if x.get("claim") == "DCL-eta_LM >= InfoNCE"]
    assert {c["metric"] for c in claims} == {"AUC", "CNR", "mIoU", "Recall"}
    for c in claims:  # two seeds: a paired difference with a finite CI and a verdict read from it
        assert c["ci_low"] <= c["diff"] <= c["ci_high"] and not c["verdict"].startswith("undecided (fewer")
    floors = {x["draw"]: x["value"] for x in lines if x.get("metric") == "batch_loss_floor"}
    losses = {x["draw"]: x["value"] for x in lines if x.get("metric") == "batch_loss_infonce" and x["anchor"] == "text"}
    assert set(floors) == set(losses) == {"sampler", "uniform"}
    assert all(0.0 <= floors[d] <= losses[d] for d in floors)  # no model goes below its batches' floor
    text = (docs / "RESULTS.md").read_text()
    assert "## The claims" in text and "false-negative floor" in text and "## eta_LM against rho_sent" in text
    assert re.search(r"\| DCL-eta_LM >= InfoNCE \| CNR \| .* \[[-+]\d", text)  # a CI, not "[+nan, +nan]"
    assert (docs / "img" / "results_eta_lm.png").stat().st_size > 0
    assert not (docs / "img" / "results_eta_tradeoff.png").exists()  # no constant-eta run, no eta-axis figure
