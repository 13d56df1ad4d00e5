#!/usr/bin/env bash
# The demo behind `make demo`: generates synthetic profile sets, runs the tier-1 planner on
# them against the paper's greedy, benchmarks deadline placement, makes a small real H.264
# data set, probes it with the calibrated cost model and compares decoding per core with
# the ffmpeg CLI and PyAV. Later issues grow it into the full data-plane demo (native vs
# pool vs helix training loops).
#   usage: scripts/demo.sh CLI OUT_DIR
set -euo pipefail
cli=${1:?usage: demo.sh CLI OUT_DIR}
out=${2:?usage: demo.sh CLI OUT_DIR}
mkdir -p "$out"

step() { printf '\n== %s\n' "$*"; }

step "1/6 Generating synthetic profile sets (docs/profiles.md)"
"$cli" gen-profiles --mix kinetics-mixed --count 10000 --seed 1 -o "$out/kinetics-mixed.jsonl"
"$cli" gen-profiles --mix openvid-mixed --count 10000 --seed 1 -o "$out/openvid-mixed.jsonl"

step "2/6 Tier-1 planning, kinetics-mixed, 8 ranks (docs/planner.md)"
for batch in 2 4 8; do
    "$cli" plan --profiles "$out/kinetics-mixed.jsonl" --ranks 8 --batch "$batch" --steps 200 --seed 1
done

step "3/6 Tier-1 planning, openvid-mixed, 8 ranks, batch 4"
"$cli" plan --profiles "$out/openvid-mixed.jsonl" --ranks 8 --batch 4 --steps 200 --seed 1

step "4/6 Deadline placement on one core (docs/scheduler.md)"
"$cli" place-bench --servers 8,128,1024 --decisions 100000

step "5/6 A real video data set: 48 kinetics-mixed H.264 clips, probed (docs/pipeline.md)"
rm -rf "$out/video"
"$cli" synth --out "$out/video" --mix kinetics-mixed --count 48 --seed 1
DH_CALIBRATION_CACHE="$out/calibration.json" \
    "$cli" probe "$out/video/manifest.jsonl" -o "$out/video/profiles.jsonl" --check 24
"$cli" plan --profiles "$out/video/profiles.jsonl" --ranks 4 --batch 2 --steps 6 --seed 1

step "6/6 Decoding per core: DataHelix vs the ffmpeg CLI vs PyAV (kinetics-mixed)"
"$cli" decode-bench --mix kinetics-mixed --clips 12 --runs 3 --dir "$out/decode-bench"

printf '\nDemo outputs are in %s\n' "$out"
