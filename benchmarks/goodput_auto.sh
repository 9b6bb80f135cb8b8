#!/usr/bin/env bash
# goodput_auto.sh - issue 31's comparison: `hpcdl train --global-batch auto`
# against fixed AdaScale batches, time to the target accuracy, per seed the
# runs back to back (auto first), on one host or 2 vcluster hosts x 2 ranks.
#
#   benchmarks/goodput_auto.sh host     OUT [SEEDS] [BATCHES]
#   benchmarks/goodput_auto.sh vcluster OUT [SEEDS] [BATCHES]   # root; brings the cluster up and down
#
# SEEDS default "0 1 2", BATCHES default "64 128 256 512 1024 2048 4096" (the
# candidates auto picks from: the base batch 64 doubled up to the ceiling).
# Every run stops at the epoch it reaches the target (--stop-at-target). Every run writes
# OUT/<batch>-s<seed>/summary.json; the table at the end is read from them
# (benchmarks/large-batch.md). Load (uptime) is printed before each run.
set -euo pipefail
layout=${1:?host or vcluster}; out=${2:?output directory}
seeds=${3:-0 1 2}; batches=${4:-64 128 256 512 1024 2048 4096}
hpcdl=${HPCDL:-hpcdl}
common=(--data mnist1d:200000 --model cnn1d --recipe plain --lr-scaling adascale
        --epochs 20 --target-accuracy 0.9816 --stop-at-target)
mkdir -p "$out"; out=$(cd "$out" && pwd)

if [ "$layout" = vcluster ]; then
    $hpcdl vcluster up --hosts 2 --slots 2 --link 1gbit
    trap '$hpcdl vcluster down' EXIT
    launch=($hpcdl vcluster exec node1 -- $hpcdl train -n 4 -H node1:2,node2:2)
else
    launch=($hpcdl train -n 4)
fi

for seed in $seeds; do
    for b in auto $batches; do
        if [ "$b" = auto ]; then size=(--global-batch auto --max-global-batch 4096)
        else size=(--global-batch "$b"); fi
        echo "== seed $seed batch $b  load: $(cut -d' ' -f1-3 /proc/loadavg)"
        "${launch[@]}" "${common[@]}" "${size[@]}" --seed "$seed" --out "$out/$b-s$seed" \
            > "$out/$b-s$seed.log" 2>&1 || { tail -5 "$out/$b-s$seed.log"; exit 1; }
        grep "^to test acc" "$out/$b-s$seed.log" || true
    done
done

python3 - "$out" <<'EOF'
import glob, json, os, sys
rows = {}
for path in glob.glob(os.path.join(sys.argv[1], "*-s*", "summary.json")):
    name = os.path.basename(os.path.dirname(path))
    batch, seed = name.rsplit("-s", 1)
    s = json.load(open(path))
    rows.setdefault(batch, {})[int(seed)] = (s.get("time_to_target_s"), s["steps_to_target"],
                                             s["test_accuracy"], s["nodes"])
print("# batch  seed  s->target  steps->target  final  nodes")
for batch in sorted(rows, key=lambda b: (b != "auto", b.isdigit() and int(b))):
    for seed, (t, steps, acc, nodes) in sorted(rows[batch].items()):
        print("%-7s %4d  %9s  %13s  %.4f  %d" % (batch, seed, "%.2f" % t if t else "-",
                                                steps or "-", acc, nodes))
    ts = [v[0] for v in rows[batch].values() if v[0]]
    if ts:
        print("%-7s mean %9.2f over %d seed(s)" % (batch, sum(ts) / len(ts), len(ts)))
EOF
