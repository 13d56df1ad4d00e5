#!/usr/bin/env python3
"""The simulator's validation (docs/simulator.md, "Validation against bench --emulate"):
runs `datahelix bench --emulate` and `datahelix simulate` on the same configuration and
seed (the paper layout by default; extra arguments go to both) and prints, per system,
throughput, miss rate and input-wait p95 side by side with the simulator's relative
difference. bench creates its clients one after another, each prefetching from its
creation; it reports the mean creation time per system (client_start_s), and each system
is simulated with its own (--client-start-ms), then the reports are merged into
OUT_DIR/simulate.json. It exits 1, naming the system and the figure, where the two
disagree by more than the tolerances of docs/simulator.md ("Validation"): throughput within
10%, the miss rate within 10% or 2.5 points, the wait p95 within 10% or the miss threshold
(at least 1 ms). A benchmark on the wall clock: run it on an idle machine (a loaded one
makes bench's sleeps and wake-ups late, which the model cannot know).
Usage: sim_validate.py CLI OUT_DIR [options for both commands...]"""
import json
import os
import subprocess
import sys


def run(cli, command, json_path, args):
    cmd = [cli, command] + (["--emulate"] if command == "bench" else []) + args + ["--json", json_path]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(json_path) as f:
        return json.load(f)


def without_systems(args):
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--systems":
            skip = True
        elif not a.startswith("--systems="):
            out.append(a)
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cli, out = sys.argv[1], sys.argv[2]
    args = sys.argv[3:] or ["--mix", "kinetics-mixed", "--systems", "native,pool,helix"]
    os.makedirs(out, exist_ok=True)
    bench_report = run(cli, "bench", os.path.join(out, "bench.json"), args)
    bench = bench_report["systems"]
    sim_report = None
    for name, b in bench.items():
        ms = f"{1e3 * b['client_start_s']:.6g}"
        one = run(cli, "simulate", os.path.join(out, f"simulate-{name}.json"),
                  without_systems(args) + ["--systems", name, "--client-start-ms", ms])
        if sim_report is None:
            sim_report = one
            sim_report["config"]["systems"] = ",".join(bench)
        else:
            sim_report["systems"][name] = one["systems"][name]
    with open(os.path.join(out, "simulate.json"), "w") as f:
        json.dump(sim_report, f)
    sim = sim_report["systems"]
    print("| system | client start | samples/s: bench / simulate | miss: bench / simulate | wait p95: bench / simulate |")
    print("|---|---|---|---|---|")

    def rel(x, y):
        return f"{100 * (y - x) / x:+.1f}%" if x else "n/a"

    threshold = bench_report["config"]["deadline_threshold_s"]
    failed = []
    for name, b in bench.items():
        s = sim[name]
        failed += disagreements(name, b, s, threshold)
        print(f"| {name} | {1e3 * b['client_start_s']:.1f} ms "
              f"| {b['throughput_sps']:.1f} / {s['throughput_sps']:.1f} "
              f"({rel(b['throughput_sps'], s['throughput_sps'])}) "
              f"| {100 * b['ddl_miss_rate']:.2f}% / {100 * s['ddl_miss_rate']:.2f}% "
              f"| {b['input_wait_p95_s']:.4f} / {s['input_wait_p95_s']:.4f} s "
              f"({rel(b['input_wait_p95_s'], s['input_wait_p95_s'])}) |")
    for line in failed:
        print("sim_validate: " + line, file=sys.stderr)
    if failed:
        sys.exit(1)


def disagreements(name, b, s, threshold):
    """The figures of one system outside the tolerances, each named with both values."""
    checks = [
        ("throughput_sps", 0.10 * b["throughput_sps"]),
        ("ddl_miss_rate", max(0.10 * b["ddl_miss_rate"], 0.025)),
        # a wait below the miss threshold is the machine's jitter, which the model has not
        ("input_wait_p95_s", max(0.10 * b["input_wait_p95_s"], threshold, 0.001)),
    ]
    return [f"{name}: {key}: bench {b[key]:.6g}, simulate {s[key]:.6g}, off by more than {tol:.6g}"
            for key, tol in checks if abs(s[key] - b[key]) > tol]


if __name__ == "__main__":
    main()
