#!/usr/bin/env bash
# gpu-first-run.sh - what a session with a GPU runs first (issue #21): builds the
# CUDA core, runs its GPU tests, measures the all-reduce of CUDA tensors and a
# synthetic training step, and writes a summary for benchmarks/gpu.md.
#
#   scripts/gpu-first-run.sh            # from the repository root; ~5-10 minutes
#   NP=4 scripts/gpu-first-run.sh       # ranks (default: one per GPU, at least 2)
#   HVD_TEST_FILE=test_torch.py scripts/gpu-first-run.sh   # also Horovod's suite
#
# First run: 2026-11-25 on one H100, results in benchmarks/gpu.md.
#
# Every step logs to $OUT (default gpu-first-run/); a failed step is recorded
# and the script goes on, so one run answers as much as it can.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-first-run}
mkdir -p "$OUT"
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 )}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
NP=${NP:-$(( NGPU > 2 ? NGPU : 2 ))}
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none -n $NP"
status=()

step() { # step NAME TIMEOUT CMD...: runs CMD, logs to $OUT/NAME.log, records pass/fail
    local name=$1 limit=$2; shift 2
    echo "== $name: $*"
    if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then status+=("| $name | ok |")
    else status+=("| $name | FAILED (exit $?; $OUT/$name.log) |"); tail -20 "$OUT/$name.log"; fi
}

{ nvidia-smi; nvcc --version; mpirun --version; ompi_info 2>/dev/null | grep -i cuda; } \
    > "$OUT/machine.log" 2>&1
step build-core 600 make -C src_c
step check-cuda 900 make -C src_c check-cuda            # test_cuda + test_cuda_paths, real GPU
step check-fake 300 make -C src_c check-fake            # the same logic on the fake runtime
step build-python 900 env HPCDL_WITH_CUDA=1 "$PY" setup.py build_ext --inplace
step cuda-context 120 $MPIRUN "$PY" -c "
import numpy as np, subprocess, os
from hpcdl import comm
comm.init(); a = np.ones(1 << 20, np.float32); comm.allreduce(a)
# a CPU-only job must not have made a CUDA context: nvidia-smi lists no process of ours
out = subprocess.run(['nvidia-smi', '--query-compute-apps=pid', '--format=csv,noheader'],
                     capture_output=True, text=True).stdout.split()
assert str(os.getpid()) not in out, 'rank %d made a CUDA context for host buffers' % comm.rank()
print('no CUDA context for host buffers, rank', comm.rank())"
step bench-staged 900 $MPIRUN "$PY" scripts/gpu_allreduce_bench.py --out "$OUT/bench.md"
HPCDL_CUDA_STAGE_BYTES=33554432 step bench-stage32m 900 $MPIRUN "$PY" \
    scripts/gpu_allreduce_bench.py --min-bytes 1048576 --out "$OUT/bench-stage32m.md"
step bench-cli 900 "$PY" -m hpcdl bench allreduce -n "$NP" --device cuda --min-bytes 4K \
    --max-bytes 256M --time-budget 0.5
step torch-cuda 600 "$PY" -m pytest -q tests/test_cuda_torch.py tests/test_bench.py -k cuda
step resnet50 600 $MPIRUN "$PY" examples/pytorch_synthetic_benchmark.py --model resnet50 \
    --image-size 224 --batch-size 32 --num-iters 4 --num-batches-per-iter 5
step resnet50-fp16 600 $MPIRUN "$PY" examples/pytorch_synthetic_benchmark.py --model resnet50 \
    --image-size 224 --batch-size 32 --num-iters 4 --num-batches-per-iter 5 --fp16-allreduce
# Horovod's own suite with its GPU variants, given its test_torch.py (HVD_TEST_FILE);
# local size 1 gives every rank local_rank 0 when ranks share one GPU
[ -n "${HVD_TEST_FILE:-}" ] && HPCDL_LOCAL_SIZE=$(( NGPU > 1 ? NGPU : 1 )) step horovod-suite 1800 \
    "$PY" tests/horovod_suite/run.py --test-file "$HVD_TEST_FILE" -n "$NP" -j 8 --timeout 120

{
    echo
    echo "## First GPU run, $(date -u +%Y-%m-%d) ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $NP ranks)"
    echo
    echo "\`scripts/gpu-first-run.sh\` (issue #21). Steps:"
    echo
    echo "| step | result |"; echo "|---|---|"
    printf '%s\n' "${status[@]}"
    for f in bench bench-stage32m; do
        [ -f "$OUT/$f.md" ] && { echo; echo "### $f"; echo; cat "$OUT/$f.md"; }
    done
} > "$OUT/summary.md"
echo "summary in $OUT/summary.md (for benchmarks/gpu.md and BENCHMARKS.md's headline); logs in $OUT/"
printf '%s\n' "${status[@]}"
! printf '%s\n' "${status[@]}" | grep -q FAILED
