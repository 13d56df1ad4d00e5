#!/usr/bin/env python3
"""Markdown tables of an rd sweep (docs/simulator.md, "The rd sweep") from the JSON reports
of `datahelix simulate` (or `bench`): sim_rd_table.py rd0.json rd8.json ..."""
import json
import sys


def main(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        runs.append((report["config"]["remote_servers"], report["systems"]))
    runs.sort(key=lambda r: r[0])
    names = list(runs[0][1])
    print("| rd | " + " | ".join(f"{n}: cores, samples/s" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for rd, systems in runs:
        cells = [f"{systems[n]['cores']}, {systems[n]['throughput_sps']:.1f}" for n in names]
        print(f"| {rd} | " + " | ".join(cells) + " |")
    print()
    print("| rd | system | miss | wait p95 | balance | efficiency | ready p95 | x-node GB "
          "| tier 2: rounds applied / moved samples | prefetch reached |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rd, systems in runs:
        for n in names:
            s = systems[n]
            if n.startswith("native"):
                continue
            t2 = (f"{s['rebalance_applied']} / {s['rebalance_moved_samples']}"
                  if s["rebalance"] else "")
            print(f"| {rd} | {n} | {100 * s['ddl_miss_rate']:.1f}% | {s['input_wait_p95_s']:.3f} s "
                  f"| {s['balance']:.3f} | {s['efficiency']:.2f} | {s['batch_ready_p95_s']:.2f} s "
                  f"| {s['cross_node_bytes'] / 1e9:.1f} | {t2} | {s['prefetch_reached']} |")


if __name__ == "__main__":
    main(sys.argv[1:])
