"""The chaos soak (issue 17; docs/operations.md): a multi-rank run over real processes while a
driver, at seeded random times, kill -9s and restarts DataServers (local and sidecars) and the
coordinator, and SIGSTOPs / SIGCONTs them; a share of the samples is corrupt. At the end
every rank's ledger is checked against the tier-1 plan: every sample of every epoch exactly
once, each rank's batches in order with its planned samples, the corrupt samples (and only
they) reported failed; every process exited cleanly and none is left.

    python tests/soak/soak.py --seconds 120 [--seed N]      (make soak: --seconds 1800)

Exit status 0 when all holds; the report goes to standard output (JSON with --json)."""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.path.abspath(os.environ.get("DH_CLI", os.path.join(ROOT, "build", "datahelix")))
RANKS, BATCH = 4, 2
SERVERS = [("local-a", "local", "node-a"), ("local-b", "local", "node-b"),
           ("remote-1", "remote", "cpu-1"), ("remote-2", "remote", "cpu-2")]


def free_port():
    """A free loopback port below the kernel's ephemeral range: the coordinator is restarted
    at it, and a port in that range can be handed to an outgoing connection meanwhile."""
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(500):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port below the ephemeral range")


class Proc:
    def __init__(self, name, argv, logdir):
        self.name, self.argv, self.logdir, self.starts = name, argv, logdir, 0
        self.p = None
        self.stopped = False

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.logdir, f"{self.name}.{self.starts}.log"), "w")
        self.p = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, DH_TEST_TAG=self.logdir))
        self.stopped = False

    def kill9(self):
        if self.p and self.p.poll() is None:
            if self.stopped:
                self.p.send_signal(signal.SIGCONT)
            self.p.kill()
            self.p.wait()

    def stop(self):
        if self.p and self.p.poll() is None and not self.stopped:
            self.p.send_signal(signal.SIGSTOP)
            self.stopped = True

    def cont(self):
        if self.p and self.stopped:
            self.p.send_signal(signal.SIGCONT)
            self.stopped = False


def plan_ids(profiles, steps_per_epoch, epochs, seed):
    sys.path.insert(0, os.environ.get("DH_PYTHON_PATH") or os.path.join(ROOT, "build", "python"))
    import datahelix
    rows = [json.loads(line)["id"] for line in open(profiles)]
    return rows, {(s, r): [rows[i] for i in datahelix.plan(profiles, s, r, RANKS, BATCH,
                                                            seed=seed)]
                  for s in range(steps_per_epoch * epochs) for r in range(RANKS)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120, help="how long the chaos lasts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--corrupt", type=float, default=0.03, help="share of corrupt samples")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="datahelix-soak-")
    profiles = os.path.join(work, "profiles.jsonl")
    subprocess.run([CLI, "gen-profiles", "--mix", "kinetics-mixed", "--count",
                    str(args.samples), "--seed", str(args.seed), "-o", profiles], check=True,
                   capture_output=True)
    rows = [json.loads(line) for line in open(profiles)]
    corrupt = set(rng.sample(range(len(rows)), int(args.corrupt * len(rows))))
    with open(profiles, "w") as f:
        for i, row in enumerate(rows):
            if i in corrupt:
                row["uri"] = "error:" + row["uri"]  # the synthetic pipeline fails it
            f.write(json.dumps(row) + "\n")
    corrupt_ids = {rows[i]["id"] for i in corrupt}
    pipeline = os.path.join(work, "synthetic.json")
    with open(pipeline, "w") as f:
        json.dump({"type": "synthetic", "cost": "sleep", "cpu_scale": 0.02,
                   "bytes_scale": 0.01}, f)
    steps_per_epoch = args.samples // (RANKS * BATCH)
    # epochs enough to outlast the chaos (a step takes 10 ms of compute and more with faults;
    # the chaos ends early if the ranks finish first)
    epochs = max(1, int(args.seconds / (steps_per_epoch * 0.015)) + 1)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    coord = Proc("coordinator", [CLI, "coordinator", "--listen", endpoint, "--dead-after-ms",
                                 "500"], work)
    servers = {name: Proc(name, [CLI, "server", "--coordinator", endpoint, "--role", role,
                                 "--node", node, "--workers", "2", "--pipeline", pipeline,
                                 "--name", name, "--arena-mb", "128", "--heartbeat-ms", "50"],
                          work) for name, role, node in SERVERS}
    coord.start()
    time.sleep(0.3)  # the listening socket (clients and servers retry regardless)
    for s in servers.values():
        s.start()
    ledgers = [os.path.join(work, f"rank-{r}.jsonl") for r in range(RANKS)]
    ranks = []
    for r in range(RANKS):
        p = Proc(f"rank-{r}", [CLI, "consume", "--coordinator", endpoint, "--profiles",
                               profiles, "--rank", str(r), "--ranks", str(RANKS), "--batch",
                               str(BATCH), "--seed", str(args.seed), "--epochs", str(epochs),
                               "--node", "node-a" if r < 2 else "node-b", "--ledger",
                               ledgers[r], "--compute-ms", "10", "--on-error", "skip",
                               "--check-payload", "--timeout-ms", "120000"], work)
        p.start()
        ranks.append(p)
    faults = []
    t_end = time.monotonic() + args.seconds
    while time.monotonic() < t_end and any(r.p.poll() is None for r in ranks):
        time.sleep(rng.uniform(0.5, 2.5))
        if not any(r.p.poll() is None for r in ranks):
            break
        kind = rng.choice(["kill-sidecar", "kill-sidecar", "stop-sidecar", "kill-local",
                           "stop-local", "kill-coordinator"])
        if kind == "kill-coordinator":
            coord.kill9()
            time.sleep(rng.uniform(0.1, 1.5))
            coord.start()
            faults.append(kind)
            continue
        name = rng.choice(["remote-1", "remote-2"] if "sidecar" in kind else
                          ["local-a", "local-b"])
        s = servers[name]
        if kind.startswith("kill"):
            s.kill9()
            time.sleep(rng.uniform(0.1, 2.0))
            s.start()
        else:
            s.stop()
            time.sleep(rng.uniform(0.2, 1.5))
            s.cont()
        faults.append(f"{kind} {name}")
    # the chaos is over: the ranks finish their epochs
    failures = []
    for r, p in enumerate(ranks):
        try:
            rc = p.p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill9()
            rc = "timeout"
        if rc != 0:
            failures.append(f"rank {r}: exit {rc}")
    for s in list(servers.values()) + [coord]:
        s.cont()
        # a process restarted a moment ago may not have its signal handlers yet: SIGTERM
        # once it says it runs (its first log line), as an operator's stop would come
        log = os.path.join(work, f"{s.name}.{s.starts}.log")
        end = time.monotonic() + 10
        while s.p.poll() is None and time.monotonic() < end and \
                os.path.getsize(log) == 0:
            time.sleep(0.02)
        if s.p.poll() is None:
            s.p.send_signal(signal.SIGTERM)
    for name, s in list(servers.items()) + [("coordinator", coord)]:
        try:
            rc = s.p.wait(timeout=20)
            if rc != 0:
                failures.append(f"{name}: exit {rc} after SIGTERM")
        except subprocess.TimeoutExpired:
            s.kill9()
            failures.append(f"{name}: did not stop on SIGTERM")
    # the ledgers
    ids, plan = plan_ids(profiles, steps_per_epoch, epochs, args.seed)
    seen = {}
    reported_failed = set()
    batches = 0
    for r, path in enumerate(ledgers):
        lines = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
        for step, b in enumerate(lines):
            if "index" not in b or b["index"] != step:
                failures.append(f"rank {r}: line {step} is {b}")
                break
            if b["ids"] != plan[(step, r)]:
                failures.append(f"rank {r} step {step}: {b['ids']} != {plan[(step, r)]}")
                break
            for i in b["ids"]:
                seen[(step // steps_per_epoch, i)] = seen.get((step // steps_per_epoch, i), 0) + 1
            for e in b.get("errors") or []:
                reported_failed.add(e.get("id") if isinstance(e, dict) else str(e))
            batches += 1
        if len(lines) != steps_per_epoch * epochs:
            failures.append(f"rank {r}: {len(lines)} batches of {steps_per_epoch * epochs}")
    twice = [k for k, v in seen.items() if v > 1]
    if twice:
        failures.append(f"{len(twice)} samples delivered more than once, e.g. {twice[:3]}")
    want = steps_per_epoch * RANKS * BATCH * epochs
    if len(seen) != want:
        failures.append(f"{len(seen)} (epoch, sample) pairs delivered of {want}")
    drawn_corrupt = {i for (_, i) in seen if i in corrupt_ids}
    missing = [i for i in drawn_corrupt if not any(i in str(x) for x in reported_failed)]
    if missing:
        failures.append(f"corrupt samples not reported failed: {missing[:5]}")
    extra = [x for x in reported_failed if not any(c in str(x) for c in corrupt_ids)]
    if extra:
        failures.append(f"samples reported failed that are not corrupt: {extra[:5]}")
    left = subprocess.run(["pgrep", "-f", f"DH_TEST_TAG={work}"], capture_output=True,
                          text=True).stdout.split()
    ours = []
    for pid in subprocess.run(["pgrep", "-f", CLI], capture_output=True, text=True).stdout.split():
        try:
            if work.encode() in open(f"/proc/{pid}/environ", "rb").read():
                ours.append(pid)
        except OSError:
            pass
    if ours:
        failures.append(f"processes left: {ours}")
    del left
    report = {"seconds": args.seconds, "seed": args.seed, "epochs": epochs,
              "batches": batches, "faults": len(faults),
              "fault_kinds": {k: sum(f.startswith(k) for f in faults) for k in
                              ("kill-sidecar", "stop-sidecar", "kill-local", "stop-local",
                               "kill-coordinator")},
              "corrupt_drawn": len(drawn_corrupt), "failures": failures, "work": work}
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
