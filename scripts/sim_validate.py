#!/usr/bin/env python3
"""The simulator's validation (docs/simulator.md, "Validation against bench --emulate"):
runs `datahelix bench --emulate` and `datahelix simulate` on the same configuration and
seed (the paper layout by default; extra arguments go to both) and prints, per system,
throughput, miss rate and input-wait p95 side by side with the simulator's relative
difference. Usage: sim_validate.py CLI OUT_DIR [options for both commands...]"""
import json
import os
import subprocess
import sys


def run(cli, command, json_path, args):
    cmd = [cli, command] + (["--emulate"] if command == "bench" else []) + args + ["--json", json_path]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(json_path) as f:
        return json.load(f)["systems"]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cli, out = sys.argv[1], sys.argv[2]
    args = sys.argv[3:] or ["--mix", "kinetics-mixed", "--systems", "native,pool,helix"]
    os.makedirs(out, exist_ok=True)
    bench = run(cli, "bench", os.path.join(out, "bench.json"), args)
    sim = run(cli, "simulate", os.path.join(out, "simulate.json"), args)
    print("| system | samples/s: bench / simulate | miss: bench / simulate | wait p95: bench / simulate |")
    print("|---|---|---|---|")

    def rel(x, y):
        return f"{100 * (y - x) / x:+.1f}%" if x else "n/a"

    for name, b in bench.items():
        s = sim[name]
        print(f"| {name} | {b['throughput_sps']:.1f} / {s['throughput_sps']:.1f} "
              f"({rel(b['throughput_sps'], s['throughput_sps'])}) "
              f"| {100 * b['ddl_miss_rate']:.2f}% / {100 * s['ddl_miss_rate']:.2f}% "
              f"| {b['input_wait_p95_s']:.4f} / {s['input_wait_p95_s']:.4f} s "
              f"({rel(b['input_wait_p95_s'], s['input_wait_p95_s'])}) |")


if __name__ == "__main__":
    main()
