#!/usr/bin/env bash
# Converged study cells on a GPU machine, many at once, for a set time (LIMIT, under 8 minutes by default):
#
#   OUT=/tmp/out [PROCS=4] [LIMIT=420] [SCALE=converged] [SEEDS=N] [IMPORT=1] [TESTS=0] \
#       bash scripts/study_on_gpu.sh [STUDY[:ONLY][@N] ...]
#   default: dissection-positions:t1-sp@5 dissection-kernels:t2-sp@6
#
# The default sets are SP columns, whose cells finish inside a window when about eleven share the GPU.  An NMT
# cell did not: its evaluations decode the validation split greedily, and on an H100 shared that way it made about
# a third of its 6,000 updates in a window (measured before decoding read the device once a step rather than once
# a sentence, 117ba68); the TD tables' NMT columns also train on from the last.pt of a shorter step limit kept on
# the CPU machine (study/extend.py), which a window does not have.  docs/benchmarks.md gives the measured cost of each.
#
# Each STUDY[:ONLY] gets N processes (default PROCS, 4) of `kernel-attention study STUDY --scale SCALE --only ONLY`
# into a studies folder (the runner's cell locks keep them off each other's cells); at LIMIT seconds (default 420)
# they are stopped, and each study is collected (--collect-only: runs.csv, table.md, figures).  SEEDS, when set, is
# their --seeds.  The cells of a published set (docs/results/<study>-<scale>/runs.csv) are carried in first, so they
# are not trained again; IMPORT=0 leaves them out, to train published cells again (a result since found stale).
#
# TESTS=1 also runs the CUDA tests beside the cells (benchmarks/cuda_tests.sh, 200 s a step, 6 processes:
# tests/backends/test_triton.py marked triton, then those marked gpu; logs tests_triton.log and tests_gpu.log under
# $OUT), so that one lease both checks the code on the device and trains; the cells then take longer.
#
# Two files (four with TESTS=1) come back under $OUT: study.log and studies.tar.gz, the studies folder with each
# process's log and without checkpoints (*.pt), so a cell stopped before it finished starts again next window, and a
# finished one is complete in its result.json and metrics.jsonl.  `bash scripts/import_cells.sh
# PATH/studies.tar.gz` here brings the finished cells into the studies folder the CPU runs use and collects their
# studies.
#
# The machine has only the repository: the data root is .data/ in it when there is one (git-ignored; copy
# ../shared/data/multi30k-de-en and wikitext-2 there and carry it), else $KERNEL_ATTENTION_DATA or ../shared/data.
# The package is read from src/ (PYTHONPATH); its dependencies must be importable on the machine (torch, sacrebleu,
# tokenizers, PyYAML, ...): where they are not, carry a folder wheels/ made here with `pip download -d wheels
# sacrebleu tokenizers ...` and it is installed from there first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
PROCS=${PROCS:-4}
LIMIT=${LIMIT:-420}
SCALE=${SCALE:-converged}
IMPORT=${IMPORT:-1}
PY=${PYTHON:-python3}
ROOT=$PWD
[[ $PY == */* && $PY != /* ]] && PY=$ROOT/$PY   # a relative path must survive the cd below
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ -d .data ] && export KERNEL_ATTENTION_DATA="$ROOT/.data"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/study.log") 2>&1
[ -d wheels ] && $PY -m pip install -q --no-index --find-links wheels wheels/*.whl
# the processes run in a scratch folder as `--out studies`, so that the command each result records is the
# one that reproduces it on any machine
cd "$(mktemp -d)"
STUDIES=studies
mkdir -p "$STUDIES/logs"
CLI=(-c 'import sys; from kernel_attention.cli import main; sys.exit(main())')
SETS=("$@")
[ ${#SETS[@]} -eq 0 ] && SETS=(dissection-positions:t1-sp@5 dissection-kernels:t2-sp@6)
echo "== $(date -u +%H:%M:%S) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo no GPU)," \
     "data ${KERNEL_ATTENTION_DATA:-../shared/data}"
pids=()
for set in "${SETS[@]}"; do
    procs=${set##*@}; [ "$procs" = "$set" ] && procs=$PROCS; set=${set%@*}
    name=${set%%:*}; only=${set#*:}; [ "$only" = "$set" ] && only=""
    # the cells published so far are carried in, not trained again
    published=$ROOT/docs/results/$name-$SCALE/runs.csv
    [ "$IMPORT" = 1 ] && [ -f "$published" ] && $PY "${CLI[@]}" study "$name" --scale "$SCALE" --out "$STUDIES" \
        --import-runs "$published" --collect-only --no-figures | tail -n 1
    for i in $(seq "$procs"); do
        timeout -k 20 -s TERM "$LIMIT" $PY "${CLI[@]}" study "$name" --scale "$SCALE" ${only:+--only "$only"} \
            ${SEEDS:+--seeds "$SEEDS"} \
            --out "$STUDIES" --no-figures > "$STUDIES/logs/$name.$i.log" 2>&1 &
        pids+=($!)
    done
done
if [ "${TESTS:-0}" = 1 ]; then
    for step in triton gpu; do
        PYTHON=$PY bash "$ROOT/benchmarks/cuda_tests.sh" $step "$OUT/tests_$step.log" 200 6
    done
fi
wait "${pids[@]}"
for set in "${SETS[@]}"; do
    name=${set%@*}; name=${name%%:*}
    $PY "${CLI[@]}" study "$name" --scale "$SCALE" ${SEEDS:+--seeds "$SEEDS"} --out "$STUDIES" --collect-only | tail -n 3
done
find "$STUDIES" -name '*.pt' -delete
echo "== $(date -u +%H:%M:%S) finished cells: $(find "$STUDIES" -name result.json | wc -l)"
tar czf "$OUT/studies.tar.gz" studies
