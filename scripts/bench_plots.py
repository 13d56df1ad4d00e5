#!/usr/bin/env python3
"""Plots of a `datahelix bench` report (docs/benchmarks.md).

usage: bench_plots.py REPORT.json OUT_DIR

Writes OUT_DIR/step_time_p95.png (each rank's step-time p95 per system, the paper's
Fig. 2: a data plane that keeps ranks even keeps these bars level and low) and
OUT_DIR/systems.png (throughput, input-wait p95 and deadline-miss rate per system).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main(argv):
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr if len(argv) != 2 else sys.stdout)
        return 0 if len(argv) == 2 else 2
    path, out = argv[1], argv[2]
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        print(f"bench_plots: cannot read {path}: {e}", file=sys.stderr)
        return 1
    systems = report.get("systems") or {}
    if not systems:
        print(f"bench_plots: {path}: no systems", file=sys.stderr)
        return 1
    os.makedirs(out, exist_ok=True)
    names = list(systems)
    cfg = report.get("config", {})
    title = f"{cfg.get('source', '?')}, {cfg.get('ranks', '?')} ranks x batch {cfg.get('batch', '?')}"

    # Per-rank step-time p95 (wait + compute per step), grouped by rank.
    fig, ax = plt.subplots(figsize=(8, 4))
    ranks = len(systems[names[0]].get("rank_step_s", []))
    width = 0.8 / max(len(names), 1)
    for k, name in enumerate(names):
        steps = systems[name].get("rank_step_s", [])
        p95 = [float(np.percentile(r, 95)) if r else 0.0 for r in steps]
        ax.bar(np.arange(len(p95)) + k * width, p95, width, label=name)
    ax.set_xticks(np.arange(ranks) + width * (len(names) - 1) / 2)
    ax.set_xticklabels([str(r) for r in range(ranks)])
    ax.set_xlabel("rank")
    ax.set_ylabel("step time p95 (s)")
    ax.set_title(f"Per-rank step time p95 - {title}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "step_time_p95.png"), dpi=100)
    plt.close(fig)

    # Throughput, input-wait p95 and miss rate per system.
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    metrics = [("throughput_sps", "samples/s"), ("input_wait_p95_s", "input wait p95 (s)"),
               ("ddl_miss_rate", "deadline-miss rate")]
    for ax, (key, label) in zip(axes, metrics):
        values = [float(systems[n].get(key, 0)) for n in names]
        ax.bar(names, values, color=[f"C{i}" for i in range(len(names))])
        ax.set_ylabel(label)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "systems.png"), dpi=100)
    plt.close(fig)
    print(f"plots: {os.path.join(out, 'step_time_p95.png')}, {os.path.join(out, 'systems.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
