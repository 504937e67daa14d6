#!/usr/bin/env bash
# A `medclr eval` report on CXR-Phantom for a longer-trained run, beside untrained checkpoints:
#   phantom -> manifest (+ MS-CXR boxes) -> domain LM -> eta_LM -> train DCL-eta_LM (cpu_small preset)
#   -> untrained checkpoints of the same architecture (5 seeds) -> medclr eval on all.
# The trained run's report.md compares with the paper's Table 1, with the untrained runs as rows.
# Steps whose output exists are skipped, so a crashed run resumes. CPU: tens of minutes (training
# dominates); eval itself takes minutes for the 1,400-study evaluation sets.
#
#   bench/eval_phantom.sh                       # WORK=/tmp/medclr_eval_phantom, N=4000 pool studies
#   N=10000 PHANTOM_ARGS="--eval-per-class 500" WORK=/data/ph OUT=/data/ph/report bench/eval_phantom.sh
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/medclr_eval_phantom}
N=${N:-4000}
PHANTOM_ARGS=${PHANTOM_ARGS:-}   # default: the test split is the evaluation sets (1,400 studies, 250 per CheX5 class)
SEED=${SEED:-0}
OUT=${OUT:-$WORK/report}   # docs/eval/ holds the report of `medclr demo`'s model
CONFIG=${CONFIG:-dcl_lm}
TRAIN_ARGS=${TRAIN_ARGS:-"train.max_minutes=30 train.max_steps=null"}  # the preset's 200 steps are a demo, not a model
MEDCLR=${MEDCLR:-medclr}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$WORK"
step() { echo "== $*" >&2; }

[ -f "$WORK/phantom/mimic-cxr-2.0.0-metadata.csv.gz" ] || { step phantom; $MEDCLR phantom --out "$WORK/phantom" --n "$N" --seed "$SEED" --source both $PHANTOM_ARGS; }
[ -f "$WORK/manifest.parquet" ] || { step prepare; $MEDCLR prepare --mimic "$WORK/phantom" --views all \
    --mscxr "$WORK/phantom/MS_CXR_Local_Alignment_v1.1.0.csv" --out "$WORK/manifest.parquet"; }
[ -f "$WORK/lm/config.json" ] || { step lm fit; $MEDCLR lm fit --manifest "$WORK/manifest.parquet" --out "$WORK/lm"; }
[ -f "$WORK/eta.parquet" ] || { step lm score; $MEDCLR lm score --manifest "$WORK/manifest.parquet" --model "$WORK/lm" --out "$WORK/eta.parquet"; }
[ -f "$WORK/checkpoint/model.safetensors" ] || { step train "$CONFIG"; $MEDCLR train --config "$CONFIG" \
    "data.manifest=$WORK/manifest.parquet" "data.eta=$WORK/eta.parquet" "out=$WORK/checkpoint" "seed=$SEED" $TRAIN_ARGS; }

# Untrained checkpoints: the trained one's architecture and preprocessing, random weights (several seeds:
# "chance" is a statement about the expectation over initialisations, see docs/evaluation.md section 7.3).
RANDOM_SEEDS=${RANDOM_SEEDS:-1 2 3 4 5}
COMPARE=()
for s in $RANDOM_SEEDS; do
  if [ ! -f "$WORK/random_s$s/model.safetensors" ]; then
    step "untrained checkpoint, seed $s"
    python - "$WORK/checkpoint" "$WORK/random_s$s" "$s" <<'PY'
import json, shutil, sys
from pathlib import Path
import torch
from medclr.models.dual import DualEncoder
src, dst, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
trained = DualEncoder.from_pretrained(src)
torch.manual_seed(seed)
model = DualEncoder.from_config(json.loads((src / "config.json").read_text()), tokenizer=trained.tokenizer,
                                load_image_weights=False)
model.save_pretrained(dst)
for name in ("checkpoint_meta.json", "preprocess.json", "train_config.yaml"):
    if (src / name).is_file():
        shutil.copy(src / name, dst / name)
PY
  fi
  if [ ! -f "$WORK/eval_random_s$s/metrics.json" ]; then
    step "eval: untrained checkpoint, seed $s"
    $MEDCLR eval --checkpoint "$WORK/random_s$s" --data "$WORK/manifest.parquet" --out "$WORK/eval_random_s$s" \
        --seed "$SEED" --tasks zeroshot,grounding,retrieval --no-figures
  fi
  COMPARE+=(--compare "untrained, seed $s=$WORK/eval_random_s$s/metrics.json")
done
python - "$WORK" $RANDOM_SEEDS <<'PY'
import json, sys
from pathlib import Path
import numpy as np
work, seeds = Path(sys.argv[1]), sys.argv[2:]
runs = [json.loads((work / f"eval_random_s{s}" / "metrics.json").read_text())["summary"] for s in seeds]
mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0] if all(isinstance(r[k], (int, float)) for r in runs)}
sd = {k: float(np.std([r[k] for r in runs], ddof=1)) if len(runs) > 1 else None for k in mean}
(work / "eval_random_mean").mkdir(exist_ok=True)
(work / "eval_random_mean" / "metrics.json").write_text(json.dumps({"summary": mean, "sd": sd, "seeds": seeds}, indent=2))
print("untrained checkpoints:", {k: f"{mean[k]:.3f} ± {sd[k]:.3f}" for k in mean if sd[k] is not None})
PY
COMPARE+=(--compare "untrained, mean of $(echo $RANDOM_SEEDS | wc -w) seeds=$WORK/eval_random_mean/metrics.json")

step "eval: trained checkpoint -> $OUT"
rm -rf "$OUT/figures" "$OUT/untrained" "$OUT/report.md" "$OUT/metrics.json" "$OUT/phrases.csv"
$MEDCLR eval --checkpoint "$WORK/checkpoint" --data "$WORK/manifest.parquet" --out "$OUT" --seed "$SEED" "${COMPARE[@]}"
mkdir -p "$OUT/untrained"
for s in $RANDOM_SEEDS; do cp "$WORK/eval_random_s$s/metrics.json" "$OUT/untrained/metrics_seed$s.json"; done
cp "$WORK/eval_random_mean/metrics.json" "$OUT/untrained/summary_mean.json"
python - "$OUT" <<'PY'
import sys
from pathlib import Path
big = [p for p in Path(sys.argv[1]).rglob("*.png") if p.stat().st_size >= 1_000_000]
assert not big, f"PNG over 1 MB: {big}"
PY
echo "{\"bench\": \"eval_phantom\", \"metric\": \"report\", \"value\": \"$OUT/report.md\", \"unit\": \"path\", \"vs\": \"paper Table 1\"}"
