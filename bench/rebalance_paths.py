"""Tier 2's two paths for moves across nodes, side by side on the same data (issue 14,
point 4): DataServer to DataServer over ZeroMQ (the default) and one all_to_all per round
over a torch.distributed gloo group (rebalance={"process_group": pg}).

    python3 bench/rebalance_paths.py [--dataset DIR] [--ranks 2] [--runs 3] [--json OUT]

Each rank is a process with a node of its own (node-<rank>, one DataServer each, threads of
this process), and sort_fn gives every part to the next rank, so every move crosses nodes.
Per rank and path the loader's stats give the bytes that came from other nodes
(rebalance_bytes_remote) and the time they took (rebalance_transfer_s_total: the
all_to_all call, or from the decision applied to the last forwarded part in). Reported per
path: MB moved, transfer seconds, MB/s, per-round milliseconds; medians over --runs runs,
the two paths alternating which goes first. Without --dataset it synthesises and probes 48
kinetics-mixed clips into out/rebalance-paths/ with build/datahelix (--cli).
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "build", "python"))


def worker(src, endpoint, port, rank, ranks, batch, path, out):
    import torch.distributed as dist
    import datahelix
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks, timeout=datetime.timedelta(seconds=300))
    spec = {"groups": [list(range(ranks))], "buffer_size": ranks * batch, "late_ms": 60000,
            "sort_fn": lambda rnd, args: [(p["rank"] + 1) % ranks for p in rnd["parts"]]}
    if path == "all_to_all":
        spec["process_group"] = dist.new_group(list(range(ranks)), backend="gloo",
                                               timeout=datetime.timedelta(seconds=120))
    loader = datahelix.DataLoader(src, batch_size=batch, seed=1, prefetch=2,
                                  coordinator=endpoint, rank=rank, world_size=ranks,
                                  node=f"node-{rank}", rebalance=spec)
    t0 = time.monotonic()
    samples = sum(len(b["sample_ids"]) for b in loader)
    wall = time.monotonic() - t0
    with open(out, "w") as f:
        json.dump({"samples": samples, "wall_s": wall, "stats": loader.stats()}, f)
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(src, ranks, batch, path, tmp):
    import datahelix
    clusters = [datahelix.start_cluster(src, workers=1, node="node-0", arena_bytes=512 << 20)]
    try:
        for r in range(1, ranks):
            clusters.append(datahelix.start_cluster(src, workers=1, node=f"node-{r}",
                                                    coordinator=clusters[0].endpoint,
                                                    arena_bytes=512 << 20))
        port = free_port()
        outs = [os.path.join(tmp, f"{path}-rank{r}.json") for r in range(ranks)]
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", src,
                                   clusters[0].endpoint, str(port), str(r), str(ranks),
                                   str(batch), path, outs[r]],
                                  env=dict(os.environ, OMP_NUM_THREADS="1"))
                 for r in range(ranks)]
        for p in procs:
            if p.wait(timeout=600):
                raise SystemExit(f"rebalance_paths: a {path} rank failed (exit {p.returncode})")
        forwarded = sum(c.stats()["server"]["rebalance_sent"] for c in clusters)
    finally:
        for c in clusters:
            c.close()
    res = [json.load(open(o)) for o in outs]
    moved = sum(x["stats"]["rebalance_bytes_remote"] for x in res)
    secs = sum(x["stats"]["rebalance_transfer_s_total"] for x in res)
    rounds = sum(x["stats"]["rebalance_applied"] for x in res)
    return {"path": path, "mb": moved / 1e6, "transfer_s": secs,
            "mb_per_s": moved / 1e6 / secs if secs else 0.0,
            "ms_per_round": 1e3 * secs / rounds if rounds else 0.0,
            "rounds": rounds // ranks, "exchanges": res[0]["stats"]["rebalance_exchanges"],
            "parts_forwarded_by_dataservers": forwarded,
            "samples": sum(x["samples"] for x in res)}


def dataset(args):
    if args.dataset:
        return args.dataset
    out = os.path.join(ROOT, "out", "rebalance-paths")
    if not os.path.exists(os.path.join(out, "profiles.jsonl")):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        print(f"rebalance_paths: synthesising 48 kinetics-mixed clips into {out}",
              file=sys.stderr)
        subprocess.run([args.cli, "synth", "--out", out, "--mix", "kinetics-mixed", "--count",
                        "48", "--seed", "1"], check=True)
        subprocess.run([args.cli, "probe", os.path.join(out, "manifest.jsonl"), "-o",
                        os.path.join(out, "profiles.jsonl")], check=True)
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        worker(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), a[6], a[7])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", help="a synth+probe directory (profiles.jsonl)")
    p.add_argument("--cli", default=os.path.join(ROOT, "build", "datahelix"))
    p.add_argument("--ranks", type=int, default=2, help="ranks, one node each (2)")
    p.add_argument("--batch", type=int, default=2, help="samples per rank per step (2)")
    p.add_argument("--runs", type=int, default=3, help="runs per path; medians (3)")
    p.add_argument("--json", help="write the runs and medians here")
    args = p.parse_args()
    src = dataset(args)
    tmp = os.path.join(ROOT, "out", "rebalance-paths-runs")
    os.makedirs(tmp, exist_ok=True)
    runs = {"forward": [], "all_to_all": []}
    for i in range(args.runs):
        order = ["forward", "all_to_all"] if i % 2 == 0 else ["all_to_all", "forward"]
        for path in order:
            r = one_run(src, args.ranks, args.batch, path, tmp)
            runs[path].append(r)
            print(f"run {i + 1} {path}: {r['mb']:.1f} MB in {r['transfer_s']:.3f} s "
                  f"({r['mb_per_s']:.0f} MB/s, {r['ms_per_round']:.1f} ms a round, "
                  f"{r['rounds']} rounds, {r['exchanges']} all_to_all, "
                  f"{r['parts_forwarded_by_dataservers']} parts forwarded)", flush=True)
    med = {path: {k: statistics.median(r[k] for r in rs)
                  for k in ("mb", "transfer_s", "mb_per_s", "ms_per_round")}
           for path, rs in runs.items()}
    for path, m in med.items():
        print(f"median {path}: {m['mb']:.1f} MB, {m['transfer_s']:.3f} s, "
              f"{m['mb_per_s']:.0f} MB/s, {m['ms_per_round']:.1f} ms a round")
    if med["forward"]["mb_per_s"]:
        print(f"all_to_all / forward throughput: "
              f"{med['all_to_all']['mb_per_s'] / med['forward']['mb_per_s']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "dataset": src, "runs": runs, "medians": med},
                      f, indent=1)


if __name__ == "__main__":
    main()
