#!/usr/bin/env bash
# sim_check.sh - issue #20's check of `hpcdl sim step` against `hpcdl bench
# train` across `hpcdl vcluster` hosts: per layout (H hosts x 1 rank) one
# calibration, per model one profile, per (layout, model, fusion size) one
# measured run, then the prediction two ways (compute from the profile; compute
# scaled to the run's own no-comm step) and one table (docs/sim.md).
#
#   sudo -E bash benchmarks/sim_check.sh          (repository root, venv active)
#
# A file already in $OUT is kept (a run cut short resumes): delete $OUT to measure again.
# Every vcluster use holds /tmp/hpcdl-vcluster.lock, one block per (layout,
# model), and brings the hosts down inside it. Needs root (network namespaces).
set -euo pipefail

# ---- what to run (override from the environment)
OUT=${OUT:-build/simchk}                 # under the repository: hosts have a private /tmp
LINK=${LINK:-1gbit}
LAYOUTS=${LAYOUTS:-"2 3"}                # hosts, 1 rank each
MODELS=${MODELS:-"mlp resnet18"}
FUSIONS=${FUSIONS:-"1 4 25"}             # hpcdl's fusion buckets, MiB
BATCH_mlp=${BATCH_mlp:-32}
BATCH_resnet18=${BATCH_resnet18:-4}     # ~1 s of compute on one thread: comm matters
STEPS=${STEPS:-5}
REPEATS=${REPEATS:-2}
THREADS=${THREADS:-1}                    # torch threads per rank, run and profile alike
LOCK=/tmp/hpcdl-vcluster.lock
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
hostlist() { local h s=""; for h in $(seq 1 "$1"); do s+="node$h:1,"; done; echo "${s%,}"; }
load() { echo "# $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) ($1)"; }

# ---- profiles: one process, no vcluster needed
for m in $MODELS; do
    b=BATCH_$m
    [ -s "$OUT/prof_$m.json" ] && continue
    load "profile $m"
    timeout 300 hpcdl sim profile --model "$m" --batch "${!b}" --threads "$THREADS" \
        --json "$OUT/prof_$m.json" | sed -n 1,2p
done

# ---- measurements: one locked block per (layout, model)
for H in $LAYOUTS; do
    for m in $MODELS; do
        b=BATCH_$m
        flock "$LOCK" bash -c "
            set -e
            trap 'hpcdl vcluster down >/dev/null 2>&1 || true' EXIT
            hpcdl vcluster up --hosts $H --link $LINK >/dev/null
            if [ ! -s '$OUT/cal_$H.json' ]; then
                echo \"# \$(date -u +%H:%M:%S) load \$(cut -d' ' -f1-3 /proc/loadavg) (calibrate $H hosts)\"
                timeout 300 hpcdl vcluster exec node1 -- hpcdl bench calibrate -n $H \
                    -H $(hostlist "$H") --allreduce --json '$OUT/cal_$H.json' | tail -6
            fi
            for f in $FUSIONS; do
                [ -s '$OUT/train_${m}_${H}_'\$f.json ] && continue
                echo \"# \$(date -u +%H:%M:%S) load \$(cut -d' ' -f1-3 /proc/loadavg) (train $m $H hosts fusion \$f)\"
                timeout 300 hpcdl vcluster exec node1 -- hpcdl bench train -n $H \
                    -H $(hostlist "$H") --model $m --batch ${!b} --steps $STEPS --warmup 2 \
                    --repeats $REPEATS --threads $THREADS --fusion-mb \$f \
                    --json '$OUT/train_${m}_${H}_'\$f.json | grep -E '^ +(hpcdl|no-comm)'
            done"
    done
done

# ---- predictions and the table
for H in $LAYOUTS; do
    for m in $MODELS; do
        for f in $FUSIONS; do
            base=(--profile "$OUT/prof_$m.json" --calibration "$OUT/cal_$H.json" --gpus "$H"
                  --gpus-per-node 1 --algorithm ring --fusion-mb "$f"
                  --measured "$OUT/train_${m}_${H}_$f.json")
            hpcdl sim step "${base[@]}" --json "$OUT/step_${m}_${H}_${f}_profile.json" >/dev/null
            hpcdl sim step "${base[@]}" --compute-from-measured \
                --terms buckets,shared,compression,stragglers,overheads,cpu,allreduce \
                --json "$OUT/step_${m}_${H}_${f}_run.json" >/dev/null
        done
    done
done
python -m hpcdl.sim.check_table "$OUT"
