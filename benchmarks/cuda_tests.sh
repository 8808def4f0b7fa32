#!/usr/bin/env bash
# One step of the CUDA tests on a lent GPU, compiled kernels (no interpreter), each test's name and outcome logged
# as it finishes and the failures' tracebacks at the end; prints the failures and the summary line:
#
#   bash benchmarks/cuda_tests.sh triton|gpu LOG LIMIT [PROCS]
#
# triton: tests/backends/test_triton.py marked triton (the triton backend's kernels compiled for the device); gpu:
# every test marked gpu (every backend on the device).  LIMIT seconds at most; PROCS pytest-xdist processes where it
# is installed (default 8), one process otherwise.  Called by benchmarks/gpu_job.sh and scripts/study_on_gpu.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: cuda_tests.sh triton|gpu LOG LIMIT [PROCS]}; log=${2:?LOG}; limit=${3:?LIMIT}; procs=${4:-8}
PY=${PYTHON:-python3}
case $step in
    triton) paths=tests/backends/test_triton.py ;;
    gpu) paths= ;;
    *) echo "cuda_tests.sh: step $step: expected triton or gpu" >&2; exit 2 ;;
esac
XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n $procs" || true)
echo "== $(date -u +%H:%M:%S) CUDA tests marked $step (limit $limit s, ${XDIST:-one process})"
env -u TRITON_INTERPRET PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout "$limit" \
    $PY -m pytest -v -rfE --tb=short -p no:cacheprovider $XDIST -m "$step" $paths > "$log" 2>&1
grep -E "FAILED|ERROR|[0-9]+ (passed|failed|skipped)" "$log" | tail -n 30
