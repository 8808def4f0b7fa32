#!/usr/bin/env bash
# Converged study cells on a GPU machine, many at once, for a set time (LIMIT, under 8 minutes by default):
#
#   OUT=/tmp/out [PROCS=4] [LIMIT=420] [SCALE=converged] bash scripts/study_on_gpu.sh [STUDY[:ONLY] ...]
#   default: ika-translation dissection-positions:t1-sp dissection-kernels:t2-sp
#
# The default leaves out the TD tables' NMT columns: their cells train on from the last.pt of a shorter step limit
# kept on the CPU machine (study/extend.py), which a window does not have; there they would start again.
#
# Each STUDY[:ONLY] gets PROCS processes (default 4) of `kernel-attention study STUDY --scale SCALE --only ONLY`
# into $OUT/studies (the runner's cell locks keep them off each other's cells); at LIMIT seconds (default 420) they
# are stopped, and each study is collected (--collect-only: runs.csv, table.md, figures).  The cells of a published
# set (docs/results/<study>-<scale>/runs.csv) are carried in first, so they are not trained again.  What comes back
# is small: the checkpoints (*.pt) are removed, so a cell stopped before it finished starts again next window, and a
# finished one is complete in its result.json and metrics.jsonl.  Copy the cells that trained there (the folders of
# $OUT/studies/<study>-converged/cells/ with a metrics.jsonl) into the studies folder the CPU runs use, and collect
# there.  The package is read from src/ (PYTHONPATH); its dependencies must be importable on the machine (torch,
# sacrebleu, tokenizers, PyYAML, ...): where they are not, carry a folder wheels/ made here with `pip download -d
# wheels sacrebleu tokenizers ...` and it is installed from there first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
PROCS=${PROCS:-4}
LIMIT=${LIMIT:-420}
SCALE=${SCALE:-converged}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT/studies"
exec > >(tee "$OUT/study.log") 2>&1
[ -d wheels ] && $PY -m pip install -q --no-index --find-links wheels wheels/*.whl
CLI=(-c 'import sys; from kernel_attention.cli import main; sys.exit(main())')
SETS=("$@")
[ ${#SETS[@]} -eq 0 ] && SETS=(ika-translation dissection-positions:t1-sp dissection-kernels:t2-sp)
echo "== $(date -u +%H:%M:%S) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo no GPU)"
pids=()
for set in "${SETS[@]}"; do
    name=${set%%:*}; only=${set#*:}; [ "$only" = "$set" ] && only=""
    # the cells published so far are carried in, not trained again
    published=docs/results/$name-$SCALE/runs.csv
    [ -f "$published" ] && $PY "${CLI[@]}" study "$name" --scale "$SCALE" --out "$OUT/studies" \
        --import-runs "$published" --collect-only --no-figures | tail -n 1
    for i in $(seq "$PROCS"); do
        timeout -s INT "$LIMIT" $PY "${CLI[@]}" study "$name" --scale "$SCALE" ${only:+--only "$only"} \
            --out "$OUT/studies" --checkpoint-minutes 1 --no-figures > "$OUT/$name.$i.log" 2>&1 &
        pids+=($!)
    done
done
wait "${pids[@]}"
for set in "${SETS[@]}"; do
    name=${set%%:*}
    $PY "${CLI[@]}" study "$name" --scale "$SCALE" --out "$OUT/studies" --collect-only | tail -n 3
done
find "$OUT/studies" -name '*.pt' -delete
echo "== $(date -u +%H:%M:%S) finished cells:"
find "$OUT/studies" -name result.json | wc -l
