"""helix against native and pool on two training nodes of two ranks each and one sidecar
node, every process real, each node a network namespace with its own network stack and a
shaped link (tests/netns/netns.py; docs/multinode.md, "Two nodes, measured"). Needs root.

    sudo .venv/bin/python bench/netns/two_node.py --runs 3 --json out/netns/two_node.json

The workload is the emulated one of `datahelix bench --emulate` (the synthetic pipeline
sleeps each sample's cost: kinetics-mixed, x --cpu-scale; payloads x --bytes-scale), the
loop that of bench/netns/rank.py (next batch, sleep a x tokens + b, all_reduce over gloo).
Every system has the same cores in all (worker threads, sleeping):
  helix   coordinator (deadline placement), a local DataServer per node (--local-workers
          each) and a sidecar on the CPU node (--remote-workers); tier-1 token planning
  pool    the same servers, least-request placement, sample-count batches
  native  rank-local loaders: a DataServer of its own per rank with (2 x local + remote) / 4
          workers, local placement, sample-count batches; the CPU node idle
The compute model is sized as bench's balanced regime over all the cores (a step computes
ranks x batch x the mean cost / cores: b a tenth, a x tokens the rest); a miss is a
rank-step waiting more than a tenth of the mean step. Runs alternate the systems; medians.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "netns"))
import netns  # noqa: E402

CLI = os.environ.get("DH_CLI", os.path.join(ROOT, "build", "datahelix"))
PY = sys.executable


def run_system(net, system, args, work, port, model):
    nodes = ["node-a", "node-b", "cpu-1"]
    coord_ep = f"tcp://{net.addr(0)}:{port}"
    policy = {"helix": "deadline", "pool": "least-request", "native": "local"}[system]
    procs = []
    logs = os.path.join(work, f"{system}-{port}")
    os.makedirs(logs, exist_ok=True)
    coord = net.popen(0, [CLI, "coordinator", "--listen", f"tcp://0.0.0.0:{port}", "--policy",
                          policy], os.path.join(logs, "coordinator.log"))
    procs.append(coord)
    netns.wait_for(lambda: netns.log_has(coord.log, "listening on"), "coordinator")
    common = ["--coordinator", coord_ep, "--pipeline", model["pipeline"], "--arena-mb", "256",
              "--listen", "tcp://0.0.0.0:*"]
    servers = []
    if system == "native":
        per = (2 * args.local_workers + args.remote_workers) // 4
        rank_nodes = [f"{nodes[r // 2]}-r{r}" for r in range(4)]
        for r in range(4):
            servers.append((r // 2, [CLI, "server", "--role", "local", "--node", rank_nodes[r],
                                     "--workers", str(per), "--name", f"local-r{r}"] + common))
    else:
        rank_nodes = [nodes[r // 2] for r in range(4)]
        for i in range(2):
            servers.append((i, [CLI, "server", "--role", "local", "--node", nodes[i],
                                "--workers", str(args.local_workers), "--name",
                                f"local-{i}"] + common))
        servers.append((2, [CLI, "server", "--role", "remote", "--node", nodes[2], "--workers",
                            str(args.remote_workers), "--name", "remote-1"] + common))
    for k, (i, argv) in enumerate(servers):
        procs.append(net.popen(i, argv, os.path.join(logs, f"server-{k}.log")))
    netns.wait_for(lambda: netns.log_has(coord.log, "registered", len(servers)), "servers",
                   log=coord.log)
    out = os.path.join(logs, "result.json")
    ranks = []
    for r in range(4):
        ranks.append(net.popen(r // 2, [
            PY, os.path.join(HERE, "rank.py"), "--source", model["dir"], "--coordinator",
            coord_ep, "--master", f"tcp://{net.addr(0)}:{port + 1}", "--rank", str(r),
            "--world", "4", "--node", rank_nodes[r], "--batch", str(args.batch), "--plan",
            "balanced" if system == "helix" else "count", "--a", str(model["a"]), "--b",
            str(model["b"]), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--threshold", str(model["threshold"]), "--out", out],
            os.path.join(logs, f"rank-{r}.log")))
    deadline = time.monotonic() + 300
    while any(p.poll() is None for p in ranks):  # one failed rank would leave the others
        failed = [r for r, p in enumerate(ranks) if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            r = failed[0] if failed else 0
            raise SystemExit(f"{system}: rank {r} {'failed' if failed else 'timed out'}:\n" +
                             open(ranks[r].log).read()[-3000:])
        time.sleep(0.1)
    for r, p in enumerate(ranks):
        if p.returncode != 0:
            raise SystemExit(f"{system}: rank {r} failed:\n" + open(p.log).read()[-3000:])
    for p in procs:
        p.send_signal(2)
    for p in procs:
        p.wait(timeout=30)
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--local-workers", type=int, default=2)
    ap.add_argument("--remote-workers", type=int, default=4)
    ap.add_argument("--mbit", type=int, default=1000, help="each node's link, Mbit/s")
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--cpu-scale", type=float, default=0.05)
    ap.add_argument("--bytes-scale", type=float, default=0.01)
    ap.add_argument("--systems", default="native,pool,helix")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    why = netns.unavailable()
    if why:
        raise SystemExit(f"two_node.py: {why}")
    work = tempfile.mkdtemp(prefix="datahelix-two-node-")
    profiles = os.path.join(work, "profiles.jsonl")
    subprocess.run([CLI, "gen-profiles", "--mix", "kinetics-mixed", "--count",
                    str(args.samples), "--seed", "1", "-o", profiles], check=True,
                   capture_output=True)
    pipeline = os.path.join(work, "synthetic.json")
    with open(pipeline, "w") as f:
        json.dump({"type": "synthetic", "cost": "sleep", "cpu_scale": args.cpu_scale,
                   "bytes_scale": args.bytes_scale}, f)
    rows = [json.loads(line) for line in open(profiles) if line.strip()]
    cores = 2 * args.local_workers + args.remote_workers
    mean_cpu = statistics.mean(r["cpu_s_est"] for r in rows) * args.cpu_scale
    mean_tok = statistics.mean(r["tokens_est"] for r in rows)
    step = 4 * args.batch * mean_cpu / cores
    model = {"dir": work, "pipeline": pipeline, "a": 0.9 * step / (args.batch * mean_tok),
             "b": 0.1 * step, "threshold": 0.1 * step, "cores": cores}
    print(f"2 nodes x 2 ranks + 1 sidecar node, links {args.mbit} Mbit/s, {cores} cores per "
          f"system; step {step * 1e3:.1f} ms mean (a {model['a']:.3g} s/token, b "
          f"{model['b']:.3g} s)", flush=True)
    systems = args.systems.split(",")
    results = {s: [] for s in systems}
    net = netns.Net(3, mbit=args.mbit)
    try:
        port = 6000
        for run in range(args.runs):
            for system in systems:
                port += 2
                r = run_system(net, system, args, work, port, model)
                results[system].append(r)
                print(f"run {run}: {system:7s} {r['samples_per_s']:7.1f} samples/s, misses "
                      f"{100 * r['miss_rate']:4.1f}%, wait p95 {r['wait_p95_s']:.3f} s",
                      flush=True)
    finally:
        net.close()
    med = {s: {k: statistics.median(r[k] for r in results[s])
               for k in ("samples_per_s", "miss_rate", "wait_p95_s")} for s in systems}
    print(f"{'system':8s} {'cores':>5s} {'samples/s':>10s} {'misses':>7s} {'wait p95':>9s}")
    for s in systems:
        print(f"{s:8s} {cores:5d} {med[s]['samples_per_s']:10.1f} "
              f"{100 * med[s]['miss_rate']:6.1f}% {med[s]['wait_p95_s']:9.3f}")
    for s in systems:
        if s != "helix" and "helix" in med:
            print(f"helix ({cores} cores) / {s} ({cores} cores): "
                  f"{med['helix']['samples_per_s'] / med[s]['samples_per_s']:.2f}x")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "cores": cores, "model": model, "runs": results,
                       "median": med}, f, indent=1)


if __name__ == "__main__":
    main()
