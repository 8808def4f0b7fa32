#!/usr/bin/env bash
# The checks to run on a lent GPU, in under 8 minutes, from the repository root or anywhere:
#
#   1. the CUDA tests: the triton backend's kernels compiled for the device (tests/backends/test_triton.py, marker
#      triton; no interpreter), then every backend on the device (tests/test_gpu.py, marker gpu), each test's
#      name and outcome logged as it finishes and the failures' tracebacks at the end;
#   2. benchmarks/attention.py on CUDA in bf16 at T = 1024, 4096, 16384 for the variants the triton backend runs
#      (exp with no position, Shaw's and Transformer-XL's terms; the implicit kernels' squared form, ikas), beside
#      SDPA (timed alongside each cell) and dense (up to T = 4096), without the input checks (--no-checks: their
#      host sync would time the check, not the kernels); with FLEX_STEPS=1 also the local window and the Sparse
#      Transformer filters beside FlexAttention (its compilation per form takes minutes: a job of its own);
#   3. benchmarks/lm_throughput.py: a language model's training steps with Transformer-XL's positions at T = 2048
#      in bf16, on triton against dense (tokens/s).
#
# What it writes comes back as two files under $OUT (default /tmp/gpu_out): job.log (all output) and
# gpu_job.tar.gz (tests_triton.log, tests_gpu.log, bench.md, bench_ikas.md, with FLEX_STEPS=1 bench_local.md and
# bench_sparse.md, each table with its .json, lm_xl.txt), packed again after every step, since a lent machine
# returns at most 8 files and a step cut short by its limit must not lose the others.  Each step has its own time
# limit (8 minutes in all), so a slow step leaves the later ones their time; the benchmarks write after every cell.
# The package is read from src/ (PYTHONPATH): nothing is installed, except pytest-xdist where the device lacks it
# and its wheels were carried (the device reaches no package index):
#
#   pip download --no-deps -d .gpu_wheels pytest-xdist execnet     # here; .gpu_wheels is ignored by git
#   then run `OUT=$OUT bash benchmarks/gpu_job.sh` on the device with .gpu_wheels carried
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # compiled kernels on the device
T="1024 4096 16384"
exec > >(tee "$OUT/job.log") 2>&1
pack() { tar czf "$OUT/gpu_job.tar.gz" -C "$WORK" .; }

echo "== $(date -u +%H:%M:%S) machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"

# pytest-xdist, where present, spreads the tests (and the compilation of their kernels) over 8 processes
# (benchmarks/cuda_tests.sh, which names each test as it finishes, so a step cut short still says which failed)
if ! $PY -c "import xdist" 2>/dev/null && [ -d .gpu_wheels ]; then
    $PY -m pip install -q --no-index --no-deps --find-links .gpu_wheels pytest-xdist execnet || true
fi
bash benchmarks/cuda_tests.sh triton "$WORK/tests_triton.log" 160; pack
bash benchmarks/cuda_tests.sh gpu "$WORK/tests_gpu.log" 185; pack

echo "== $(date -u +%H:%M:%S) attention benchmark: exp x none, shaw, xl x full, causal (limit 60 s)"
timeout 60 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --T $T --kernels exp \
    --positions none shaw xl --filters full causal --backends triton dense --no-dense-above 4096 \
    --repeats 3 --no-checks --out "$WORK/bench.md" 2>&1 | tail -n 45; pack

# the implicit kernels in training mode (spectral points drawn per call, no magnitude dropout by default) as
# k / sum k in the squared-form kernels; each call reads the key factor's range back (one host sync)
echo "== $(date -u +%H:%M:%S) attention benchmark: ikas's squared form, full and causal (limit 30 s)"
timeout 30 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --T $T --kernels ikas \
    --positions none --filters full causal --backends triton dense --no-dense-above 4096 \
    --repeats 3 --no-checks --out "$WORK/bench_ikas.md" 2>&1 | tail -n 20; pack

if [ "${FLEX_STEPS:-0}" = 1 ]; then  # the filters beside FlexAttention: its compilation per form takes minutes
echo "== $(date -u +%H:%M:%S) attention benchmark: local window, beside FlexAttention (limit 30 s)"
timeout 30 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --T $T --kernels exp \
    --positions none xl --filters local --backends triton flex dense --no-dense-above 4096 \
    --repeats 3 --no-checks --out "$WORK/bench_local.md" 2>&1 | tail -n 20; pack

echo "== $(date -u +%H:%M:%S) attention benchmark: Sparse Transformer filters, beside FlexAttention (limit 25 s)"
timeout 25 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --T $T --kernels exp \
    --positions none --filters strided:stride=128 fixed:stride=128 --backends triton flex dense \
    --no-dense-above 4096 --repeats 3 --no-checks --out "$WORK/bench_sparse.md" 2>&1 | tail -n 20; pack
fi

echo "== $(date -u +%H:%M:%S) LM training steps, xl, T = 2048, bf16: triton against dense (limit 25 s)"
timeout 25 $PY benchmarks/lm_throughput.py --device cuda --bf16 --position xl --backends triton dense --vocab 32000 \
    --d-model 512 --heads 8 --d-ff 2048 --layers 4 --seq 2048 --batch 4 --steps 3 --repeats 4 \
    > "$WORK/lm_xl.txt" 2>&1
cat "$WORK/lm_xl.txt"; pack

echo "== $(date -u +%H:%M:%S) done"
