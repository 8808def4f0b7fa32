#!/usr/bin/env bash
# The checks to run on a lent GPU, in under 8 minutes, from the repository root or anywhere:
#
#   1. the CUDA tests: the backends against dense on the device (tests/test_gpu.py, marker gpu) and the triton
#      backend's kernels compiled for it (tests/backends/test_triton.py, marker triton; no interpreter);
#   2. benchmarks/attention.py on CUDA in bf16 at T = 1024, 4096, 16384 for the variants the triton backend runs
#      (the implicit kernels' squared form included: ikas, full and causal), beside SDPA (timed alongside each
#      cell), dense (up to T = 4096) and FlexAttention (local window), without the input checks (--no-checks:
#      their host sync would time the check, not the kernels);
#      and the direct kernels (poly, linear: float32 inside) on linear and dense at T = 1024, 4096;
#   3. benchmarks/txl_reference.py: Transformer-XL's own formulation (AC + rel-shifted BD, materialised) beside
#      attention(..., position xl) on triton and dense, and SDPA.
#
# Everything goes under $OUT (default /tmp/gpu_out), 14 files: job.log (all output, the tests' included),
# bench.md, bench_rbf.md, bench_local.md, bench_ikas.md, bench_sparse.md, bench_direct.md (each with its .json)
# and txl.md.  Each
# step has its own time limit (about 7.9 minutes in all), so a slow step leaves the later ones their time; the
# benchmarks write after every cell.  The package is read from src/ (PYTHONPATH): nothing is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # compiled kernels on the device
T="1024 4096 16384"
exec > >(tee "$OUT/job.log") 2>&1

echo "== $(date -u +%H:%M:%S) machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"

# pytest-xdist, where present, spreads the tests (and the compilation of their kernels) over 8 processes
XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 8" || true)

echo "== $(date -u +%H:%M:%S) CUDA tests: the triton backend compiled (limit 100 s)"
timeout 100 $PY -m pytest -q $XDIST -m triton -p no:cacheprovider tests/backends/test_triton.py

echo "== $(date -u +%H:%M:%S) CUDA tests: every backend on the device (limit 90 s)"
timeout 90 $PY -m pytest -q $XDIST -m gpu -p no:cacheprovider

echo "== $(date -u +%H:%M:%S) attention benchmark: exp x none, shaw, xl x full, causal (limit 95 s)"
timeout 95 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --T $T --kernels exp \
    --positions none shaw xl --filters full causal --backends triton dense --no-dense-above 4096 \
    --repeats 3 --no-checks --out "$OUT/bench.md" 2>&1 | tail -n 45

echo "== $(date -u +%H:%M:%S) attention benchmark: rbf's key bias, product's features (limit 35 s)"
timeout 35 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --T $T --kernels rbf \
    --positions none product --filters causal --backends triton dense --no-dense-above 4096 \
    --repeats 3 --no-checks --out "$OUT/bench_rbf.md" 2>&1 | tail -n 20

echo "== $(date -u +%H:%M:%S) attention benchmark: local window, beside FlexAttention (limit 40 s)"
timeout 40 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --T $T --kernels exp \
    --positions none xl --filters local --backends triton flex dense --no-dense-above 4096 \
    --repeats 3 --no-checks --out "$OUT/bench_local.md" 2>&1 | tail -n 20

# the implicit kernels in training mode (spectral points drawn per call, no magnitude dropout by default) as
# k / sum k in the squared-form kernels; each call reads the key factor's range back (one host sync)
echo "== $(date -u +%H:%M:%S) attention benchmark: ikas's squared form, full and causal (limit 35 s)"
timeout 35 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --T $T --kernels ikas \
    --positions none --filters full causal --backends triton dense --no-dense-above 4096 \
    --repeats 3 --no-checks --out "$OUT/bench_ikas.md" 2>&1 | tail -n 20

echo "== $(date -u +%H:%M:%S) attention benchmark: Sparse Transformer filters, beside FlexAttention (limit 25 s)"
timeout 25 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --T $T --kernels exp \
    --positions none --filters strided:stride=128 fixed:stride=128 --backends triton flex dense \
    --no-dense-above 4096 --repeats 3 --no-checks --out "$OUT/bench_sparse.md" 2>&1 | tail -n 20

# direct kernels compute in float32 under bf16 inputs: their cost against SDPA in bf16
echo "== $(date -u +%H:%M:%S) attention benchmark: poly and linear, float32 inside (limit 20 s)"
timeout 20 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --T 1024 4096 --kernels poly linear \
    --positions none --filters full causal --backends linear dense --repeats 3 --no-checks \
    --out "$OUT/bench_direct.md" 2>&1 | tail -n 12

echo "== $(date -u +%H:%M:%S) Transformer-XL's formulation (limit 35 s)"
timeout 35 $PY benchmarks/txl_reference.py --device cuda --dtype bfloat16 --T $T --backends triton dense \
    --materialised-above 4096 --repeats 3 --out "$OUT/txl.md"

echo "== $(date -u +%H:%M:%S) done"
