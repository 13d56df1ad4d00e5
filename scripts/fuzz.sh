#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (docs/testing.md, "Fuzzing"), built in BUILD_DIR
# by `make fuzz-build`: each on a fresh copy of its checked-in seed corpus
# (tests/fuzz/corpus/<target>/, never written to), for a number of executions (`make
# test-fuzz`: 100,000 each) or of seconds (`make fuzz`: FUZZ_SECONDS each), one target at a
# time. Under ASan + UBSan (leak checking on), every finding stops the run: libFuzzer writes
# the input to BUILD_DIR/fuzz-work/<target>/artifacts/ and the script prints the report.
#
#   scripts/fuzz.sh BUILD_DIR --runs N [TARGET...]
#   scripts/fuzz.sh BUILD_DIR --seconds S [TARGET...]
#
# TARGET: wire, manifest, profiles, pipeline, mix, pyworker, manifest_csv, manifest_tar, s3,
# metrics_http (default: all). One line per target:
# executions, seconds, coverage (cov: edges, ft: features), corpus size; exit status 1 when
# a target found something, 2 on a usage error. Full logs: BUILD_DIR/fuzz-work/<target>.log.
# New inputs a run found stay in BUILD_DIR/fuzz-work/<target>/corpus/; to keep the useful
# ones, minimise them into the seeds by hand:
#   fuzz_<target> -merge=1 tests/fuzz/corpus/<target> BUILD_DIR/fuzz-work/<target>/corpus
set -euo pipefail

usage() { echo "usage: scripts/fuzz.sh BUILD_DIR (--runs N | --seconds S) [TARGET...]" >&2; exit 2; }
[ $# -ge 3 ] || usage
root=$(cd "$(dirname "$0")/.." && pwd)
build=$1
case "$2" in
    --runs) limit="-runs=$3" ;;
    --seconds) limit="-max_total_time=$3" ;;
    *) usage ;;
esac
shift 3
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(wire manifest profiles pipeline mix pyworker manifest_csv manifest_tar s3 metrics_http)

# Leaks are reported by libFuzzer itself (-detect_leaks, on by default under ASan); UBSan
# aborts on the first report (-fno-sanitize-recover=all in the build).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

status=0
for t in "${targets[@]}"; do
    exe=$build/tests/fuzz/fuzz_$t
    seeds=$root/tests/fuzz/corpus/$t
    if [ ! -x "$exe" ] || [ ! -d "$seeds" ]; then
        echo "fuzz: no target '$t' ($exe, $seeds); run 'make fuzz-build'" >&2
        exit 2
    fi
    work=$build/fuzz-work/$t
    log=$build/fuzz-work/$t.log
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/artifacts"
    cp "$seeds"/* "$work/corpus/"
    start=$(date +%s.%N)
    rc=0
    # -timeout: one input taking over 25 s is a finding (a hang), not a slow machine.
    "$exe" "$limit" -timeout=25 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
        "$work/corpus" >"$log" 2>&1 || rc=$?
    end=$(date +%s.%N)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*' || true)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    if [ "$rc" = 0 ]; then
        echo "fuzz_$t: ${runs:-?} runs in $secs s, $last, no finding"
    else
        status=1
        echo "fuzz_$t: FOUND SOMETHING after ${runs:-?} runs ($secs s, exit $rc); input(s):" \
             "$(ls "$work/artifacts" | sed "s|^|$work/artifacts/|" | tr '\n' ' ')"
        grep -E 'ERROR|SUMMARY|runtime error|fuzz check failed|^ *#[0-9]+ 0x' "$log" | head -40
        echo "fuzz_$t: full log: $log; reproduce with: $exe <input>"
    fi
done
exit "$status"
