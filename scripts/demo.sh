#!/usr/bin/env bash
# The demo behind `make demo`: generates synthetic profile sets, runs the tier-1 planner on
# them against the paper's greedy, benchmarks deadline placement, makes a small real H.264
# data set, probes it with the calibrated cost model and compares decoding per core with
# the ffmpeg CLI and PyAV, runs the data plane as real processes over that data set (a
# coordinator, a local DataServer and a remote sidecar, two ranks) and measures the
# transport, then runs the training loop: native vs pool vs helix with real decoding on this
# machine's cores, and at the paper's emulated scale (docs/benchmarks.md).
# The Python steps (decode-bench's PyAV side, the plots) run $DH_PYTHON_EXE: `make demo`
# sets it to the project's .venv; by hand it defaults to .venv/bin/python when there is one.
#   usage: scripts/demo.sh CLI OUT_DIR
set -euo pipefail
cli=${1:?usage: demo.sh CLI OUT_DIR}
out=${2:?usage: demo.sh CLI OUT_DIR}
mkdir -p "$out"
venv_python="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python"
if [ -z "${DH_PYTHON_EXE:-}" ] && [ -x "$venv_python" ]; then
    export DH_PYTHON_EXE="$venv_python"
fi

step() { printf '\n== %s\n' "$*"; }

step "1/10 Generating synthetic profile sets (docs/profiles.md)"
"$cli" gen-profiles --mix kinetics-mixed --count 10000 --seed 1 -o "$out/kinetics-mixed.jsonl"
"$cli" gen-profiles --mix openvid-mixed --count 10000 --seed 1 -o "$out/openvid-mixed.jsonl"

step "2/10 Tier-1 planning, kinetics-mixed, 8 ranks (docs/planner.md)"
for batch in 2 4 8; do
    "$cli" plan --profiles "$out/kinetics-mixed.jsonl" --ranks 8 --batch "$batch" --steps 200 --seed 1
done

step "3/10 Tier-1 planning, openvid-mixed, 8 ranks, batch 4"
"$cli" plan --profiles "$out/openvid-mixed.jsonl" --ranks 8 --batch 4 --steps 200 --seed 1

step "4/10 Deadline placement on one core (docs/scheduler.md)"
"$cli" place-bench --servers 8,128,1024 --decisions 100000

step "5/10 A real video data set: 48 kinetics-mixed H.264 clips, probed (docs/pipeline.md)"
rm -rf "$out/video"
"$cli" synth --out "$out/video" --mix kinetics-mixed --count 48 --seed 1
DH_CALIBRATION_CACHE="$out/calibration.json" \
    "$cli" probe "$out/video/manifest.jsonl" -o "$out/video/profiles.jsonl" --check 24
"$cli" plan --profiles "$out/video/profiles.jsonl" --ranks 4 --batch 2 --steps 6 --seed 1

step "6/10 Decoding per core: DataHelix vs the ffmpeg CLI vs PyAV (kinetics-mixed)"
"$cli" decode-bench --mix kinetics-mixed --clips 12 --runs 3 --dir "$out/decode-bench"

step "7/10 The data plane as processes: coordinator, local DataServer, sidecar, 2 ranks (docs/runtime.md)"
rt="$out/runtime"
rm -rf "$rt" && mkdir -p "$rt"
coord="ipc://$rt/coordinator.sock"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
"$cli" coordinator --listen "$coord" --policy deadline --telemetry "$rt/telemetry.jsonl" \
    2> "$rt/coordinator.log" &
pids+=($!)
"$cli" server --coordinator "$coord" --role local --node node-a --workers 1 --name local-a \
    2> "$rt/local-a.log" &
pids+=($!)
"$cli" server --coordinator "$coord" --role remote --node spare --workers 1 --name sidecar-1 \
    2> "$rt/sidecar-1.log" &
pids+=($!)
for r in 0 1; do
    "$cli" consume --coordinator "$coord" --profiles "$out/video/profiles.jsonl" --rank "$r" \
        --ranks 2 --batch 2 --node node-a --seed 1 --compute-ms 20 \
        --ledger "$rt/rank-$r.jsonl" > "$rt/rank-$r.json" 2> "$rt/rank-$r.log" &
    ranks[$r]=$!
done
wait "${ranks[0]}" "${ranks[1]}"
for r in 0 1; do printf 'rank %s: %s\n' "$r" "$(cat "$rt/rank-$r.json")"; done
cleanup
pids=()
grep -h "stopping" "$rt"/local-a.log "$rt"/sidecar-1.log | sed 's/^.*INFO //'
printf 'placement decisions: %s (telemetry in %s)\n' "$(wc -l < "$rt/telemetry.jsonl")" \
    "$rt/telemetry.jsonl"

step "8/10 Transport: local delivery overhead and remote forwarding vs raw TCP"
"$cli" transport-bench --batches 20 --runs 3

step "9/10 The training loop, real decode: native vs pool vs helix, 4 ranks on these 2 cores (docs/benchmarks.md)"
"$cli" bench --dataset "$out/video" --ranks 4 --batch 2 --steps 12 --warmup 3 \
    --local-servers 1 --remote-servers 0 --cores-per-server 4 --systems native,pool,helix \
    --json "$out/bench-real.json"

step "10/10 The training loop, emulated paper scale: 8 ranks, helix and pool on 8 local + 16 remote DataServers x 4 virtual cores, native on 4 per rank"
"$cli" bench --emulate --mix kinetics-mixed --steps 60 --warmup 10 \
    --systems native,pool,helix,native-96 --trace "$out/bench-trace.json" --plot "$out/plots"

printf '\nDemo outputs are in %s (trace: %s, plots: %s)\n' "$out" "$out/bench-trace.json" "$out/plots"
