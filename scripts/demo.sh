#!/usr/bin/env bash
# The demo behind `make demo`: generates synthetic profile sets, runs the tier-1 planner on
# them against the paper's greedy, and benchmarks deadline placement. Later issues grow it
# into the full data-plane demo (real decoding, native vs pool vs helix).
#   usage: scripts/demo.sh CLI OUT_DIR
set -euo pipefail
cli=${1:?usage: demo.sh CLI OUT_DIR}
out=${2:?usage: demo.sh CLI OUT_DIR}
mkdir -p "$out"

step() { printf '\n== %s\n' "$*"; }

step "1/4 Generating synthetic profile sets (docs/profiles.md)"
"$cli" gen-profiles --mix kinetics-mixed --count 10000 --seed 1 -o "$out/kinetics-mixed.jsonl"
"$cli" gen-profiles --mix openvid-mixed --count 10000 --seed 1 -o "$out/openvid-mixed.jsonl"

step "2/4 Tier-1 planning, kinetics-mixed, 8 ranks (docs/planner.md)"
for batch in 2 4 8; do
    "$cli" plan --profiles "$out/kinetics-mixed.jsonl" --ranks 8 --batch "$batch" --steps 200 --seed 1
done

step "3/4 Tier-1 planning, openvid-mixed, 8 ranks, batch 4"
"$cli" plan --profiles "$out/openvid-mixed.jsonl" --ranks 8 --batch 4 --steps 200 --seed 1

step "4/4 Deadline placement on one core (docs/scheduler.md)"
"$cli" place-bench --servers 8,128,1024 --decisions 100000

printf '\nDemo outputs are in %s\n' "$out"
