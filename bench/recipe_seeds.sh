#!/usr/bin/env bash
# One arm of a seeds comparison: the demo's data (built once), three training seeds of DCL-eta_LM
# run side by side, one pooled `medclr eval` (mean ± sd, t CI over seeds). Compare two arms with
# bench/paired_runs.py. Made for one GPU (three runs share it); on 2 CPU cores run SEEDS one at a time.
#
#   bench/recipe_seeds.sh base 2500                                   # the preset as it is
#   bench/recipe_seeds.sh recipe 2500 data.sentence_sampling=findings model.lse_gamma=20 hard_negatives.weight=1
#   python bench/paired_runs.py $WORK/recipe_eval/metrics.json $WORK/base_eval/metrics.json
#
# docs/experiments/2026-11-23-negation-aware-text.md reports these arms at 1,000 and 2,500 steps on one H100.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1; steps=$2; shift 2
WORK=${WORK:-/tmp/medclr_recipe}
SEEDS=${SEEDS:-"0 1 2"}
PARALLEL=${PARALLEL:-1}     # 1: the seeds train at once (GPU); 0: one after another (CPU)
MEDCLR=${MEDCLR:-"python3 -m medclr"}
D=$WORK/data; mkdir -p "$D"
step() { echo "== $*" >&2; }

[ -f "$D/phantom/mimic-cxr-2.0.0-metadata.csv.gz" ] || { step phantom; $MEDCLR phantom --out "$D/phantom" --n 3000 --seed 0 \
    --source both --eval-per-class 250 --workers "$(nproc)" --quiet; }
[ -f "$D/manifest.parquet" ] || { step prepare; $MEDCLR prepare --mimic "$D/phantom" --views all \
    --mscxr "$D/phantom/MS_CXR_Local_Alignment_v1.1.0.csv" --out "$D/manifest.parquet"; }
[ -f "$D/lm/config.json" ] || { step lm fit; $MEDCLR lm fit --manifest "$D/manifest.parquet" --out "$D/lm"; }
[ -f "$D/eta.parquet" ] || { step lm score; $MEDCLR lm score --manifest "$D/manifest.parquet" --model "$D/lm" --out "$D/eta.parquet"; }

t0=$(date +%s)
checkpoints=()
for s in $SEEDS; do
  run=$WORK/${name}_s$s; checkpoints+=(--checkpoint "$run")
  [ -f "$run/model.safetensors" ] && continue
  step "train $name seed $s ($steps steps)"
  cmd=($MEDCLR train --config dcl_lm "data.manifest=$D/manifest.parquet" "data.eta=$D/eta.parquet" "seed=$s" "out=$run"
       log.progress=false "train.max_steps=$steps" "ckpt.every=$steps" "$@")
  if [ "$PARALLEL" = 1 ]; then "${cmd[@]}" >"$run.log" 2>&1 & else "${cmd[@]}" >"$run.log" 2>&1; fi
done
wait
echo "{\"arm\": \"$name\", \"steps\": $steps, \"train_s\": $(( $(date +%s) - t0 ))}"
step "eval $name"
$MEDCLR eval "${checkpoints[@]}" --data "$D/manifest.parquet" --out "$WORK/${name}_eval" \
    --tasks zeroshot,grounding,retrieval --no-figures >"$WORK/${name}_eval.log" 2>&1
echo "{\"arm\": \"$name\", \"metrics\": \"$WORK/${name}_eval/metrics.json\", \"total_s\": $(( $(date +%s) - t0 ))}"
