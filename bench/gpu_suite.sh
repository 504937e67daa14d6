#!/usr/bin/env bash
# The issue-18 benchmarks in one run: JSON lines on stdout, progress and logs on stderr.
#
#   bash bench/gpu_suite.sh > suite.jsonl          # GPU machine (pip install 'medclr[gpu]'); under 10 min on an H100
#   nice -n 19 bash bench/gpu_suite.sh --cpu       # small sizes on a CPU: checks that the suite itself runs
#
# Environment: PYTHON (default python), WORK (scratch folder, default a new temp dir), MANIFEST (a
# manifest whose training sentences fit the LM; default: a CXR-Phantom of the demo's 3,000 studies at
# 64 px, made here). Each bench runs under a time limit; one that fails or runs out prints a
# {"bench": "suite", "metric": "exit_status", ...} line and the suite goes on. Benches that cannot run on
# the GPU yet (no --device option) are skipped in GPU mode with a "skipped" line, not run on the CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
MODE=gpu
[[ ${1:-} == --cpu ]] && MODE=cpu
WORK=${WORK:-$(mktemp -d -t medclr_suite.XXXXXX)}
mkdir -p "$WORK"
export OMP_WAIT_POLICY=PASSIVE

line() {  # line METRIC VALUE [JSON-OBJECT-OF-EXTRAS]
    "$PY" -c 'import json, sys; print(json.dumps({"bench": "suite", "metric": sys.argv[1], "value": sys.argv[2], **json.loads(sys.argv[3])}))' \
        "$1" "$2" "${3:-{\}}"
}

run() {  # run LIMIT_S SCRIPT ARGS...: one bench, its JSON lines through, its exit status and time after
    local limit=$1 script=$2 t0=$SECONDS rc
    shift 2
    echo "== $script $*" >&2
    timeout "$limit" "$PY" "bench/$script" "$@"
    rc=$?
    line exit_status "$rc" "{\"script\": \"$script\", \"seconds\": $((SECONDS - t0)), \"limit_s\": $limit}"
}

has_option() {  # has_option SCRIPT OPTION: the bench takes that option (benches gain --device over time)
    "$PY" "bench/$1" --help 2>/dev/null | grep -q -- "$2"
}

"$PY" - "$MODE" <<'EOF'
import json, os, sys, torch
info = {"bench": "suite", "metric": "machine", "value": sys.argv[1], "cpus": os.cpu_count(), "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
try:
    import faiss
    info["faiss"], info["faiss_gpus"] = faiss.__version__, getattr(faiss, "get_num_gpus", lambda: 0)()
except ImportError:
    info["faiss"] = None
print(json.dumps(info), flush=True)
EOF

if [[ $MODE == gpu ]]; then
    "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
        || { echo "gpu_suite: no CUDA device visible; use --cpu for the CPU sizes" >&2; exit 1; }
    STUDIES=3000; LIMIT=240
else
    STUDIES=300; LIMIT=600
fi

if [[ -z ${MANIFEST:-} ]]; then
    MANIFEST=$WORK/manifest.parquet
    t0=$SECONDS
    "$PY" -m medclr phantom --out "$WORK/phantom" --n "$STUDIES" --size 64 --eval-per-class 0 --split 0.9,0.05,0.05 --quiet >&2 &&
        "$PY" -m medclr prepare --mimic "$WORK/phantom" --views all --out "$MANIFEST" >&2
    line corpus_ready $? "{\"studies\": $STUDIES, \"seconds\": $((SECONDS - t0))}"
fi

if [[ $MODE == gpu ]]; then
    run "$LIMIT" bench_lm.py --manifest "$MANIFEST" --device cuda --steps 300 --warmup 20 --rounds 3
    run "$LIMIT" bench_losses.py --device cuda --batch 4096 --dim 128 --reps 20
    if has_option bench_train_step.py --device; then
        run "$LIMIT" bench_train_step.py --device cuda --arch resnet50 --size 480 --batch 64 --channels-last \
            --steps 10 --warmup 3
    else
        line skipped bench_train_step.py '{"reason": "no --device option: it would run on the CPU"}'
    fi
    if has_option bench_train.py --device; then
        run "$LIMIT" bench_train.py --device cuda --steps 30 --warmup 5
    else
        line skipped bench_train.py '{"reason": "no --device option: it would run on the CPU"}'
    fi
    run "$LIMIT" bench_score.py --models small biovil --n 512 --batch-size 64 --workers "$(( $(nproc) - 1 ))" \
        --workdir "$WORK/score"
    # flat and IVF on the GPU; the kind `medclr index build` picks at 1e6 (HNSW) builds and searches on the CPU
    run 420 bench_index.py --sizes 1000000 --kinds flat ivf auto --gpu auto --queries 1000 --ef --nprobe 64
else
    run "$LIMIT" bench_lm.py --manifest "$MANIFEST" --device cpu --steps 4 --warmup 1 --rounds 1 --threads 1
    run "$LIMIT" bench_losses.py --batch 256 --dim 128 --reps 3 --threads 1
    run "$LIMIT" bench_train_step.py --batch 8 --size 64 --steps 1 --warmup 1 --losses infonce,nuclr --threads 1
    run "$LIMIT" bench_train.py --steps 2 --warmup 1 --batch 8 --images 32 --threads 1
    run "$LIMIT" bench_score.py --models small --n 4 --batch-size 4 --workers 1 --workdir "$WORK/score"
    run "$LIMIT" bench_index.py --sizes 20000 --kinds auto ivf --queries 200 --ef --nprobe
fi
line total_seconds "$SECONDS" "{\"mode\": \"$MODE\", \"work\": \"$WORK\"}"
