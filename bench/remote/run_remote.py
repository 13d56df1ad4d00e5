"""One epoch over WebDataset shards served by nginx across a shaped link, against the same
epoch from local disk (issue 34's targets; docs/remote.md, "Benchmark"). Needs root (a network
namespace), nginx and tc.

    sudo .venv/bin/python bench/remote/run_remote.py --runs 3 --json out/remote.json

The data set: `datahelix synth` clips tarred into shards, `manifest --from-tar`, `probe`. The
server: nginx in a network namespace whose veth link is shaped with `tc tbf` to --mbit each
way. The latency: this kernel has no netem, so a userspace TCP proxy in this script (the same
file, --proxy) holds every chunk it relays for --delay-ms each way (a delay line: the bytes keep
their order and pace; RTT = 2 x delay). Each epoch is a coordinator, one DataServer (--workers,
with or without --cache-dir, read-ahead on or off by DH_READAHEAD_BYTES) and `datahelix consume`
(one rank), all real processes; samples/s is the clip count over consume's wall time. The
DataServer's last log line gives the bytes fetched and the bytes the demuxers read. Runs of the
configurations alternate; medians of --runs.
"""
import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CLI = os.environ.get("DH_CLI", os.path.join(ROOT, "build", "datahelix"))


# ---- the delay proxy (run as a subprocess: --proxy LISTEN_PORT TARGET_HOST TARGET_PORT MS) ---

async def _pipe(reader, writer, delay):
    q = asyncio.Queue()

    async def sender():
        while True:
            due, data = await q.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if data is None:
                break
            writer.write(data)
            await writer.drain()
        try:
            writer.write_eof()
        except OSError:
            pass

    task = asyncio.ensure_future(sender())
    try:
        while True:
            data = await reader.read(1 << 16)
            q.put_nowait((time.monotonic() + delay, data if data else None))
            if not data:
                break
    except OSError:
        q.put_nowait((0, None))
    await task


def proxy_main(listen_port, host, port, delay_ms):
    delay = delay_ms / 1000.0

    async def handle(cr, cw):
        try:
            sr, sw = await asyncio.open_connection(host, port)
        except OSError:
            cw.close()
            return
        await asyncio.gather(_pipe(cr, sw, delay), _pipe(sr, cw, delay), return_exceptions=True)
        cw.close()
        sw.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# ---- set-up ---------------------------------------------------------------------------------

def run(*argv, **kw):
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, **kw)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(host, port, what, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} ({host}:{port}) not up after {timeout} s")


def make_dataset(work, clips, per_shard):
    ds = os.path.join(work, "ds")
    run(CLI, "synth", "--out", ds, "--mix", "kinetics-s", "--count", str(clips), "--seed", "1",
        "--jobs", "2")
    www = os.path.join(work, "www")
    os.makedirs(www, exist_ok=True)
    rows = [json.loads(line) for line in open(os.path.join(ds, "manifest.jsonl"))]
    n_shards = (len(rows) + per_shard - 1) // per_shard
    for s in range(n_shards):
        with tarfile.open(os.path.join(www, f"shard-{s:03d}.tar"), "w") as t:
            for r in rows[s * per_shard:(s + 1) * per_shard]:
                p = r["path"] if os.path.isabs(r["path"]) else os.path.join(ds, r["path"])
                t.add(p, arcname=f"{r['id']}.mp4")
    local = os.path.join(work, "local.jsonl")
    run(CLI, "manifest", "--from-tar", os.path.join(www, f"shard-{{000..{n_shards - 1:03d}}}.tar"),
        "-o", local)
    prof = os.path.join(work, "profiles-local.jsonl")
    run(CLI, "probe", local, "-o", prof, "--jobs", "2", "--calibration",
        os.path.join(work, "calibration.json"))
    return www, prof


class Link:
    """nginx in a namespace behind a veth shaped with tbf both ways."""

    def __init__(self, work, www, mbit):
        self.ns = f"dhrm{os.getpid() % 100000}"
        self.host_if = f"{self.ns}a"
        b = random.randint(1, 250)
        self.host_ip, self.ns_ip = f"10.79.{b}.1", f"10.79.{b}.2"
        run("ip", "netns", "add", self.ns)
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "eth0", "netns",
            self.ns)
        run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        run("ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/24", "dev", "eth0")
        run("ip", "-n", self.ns, "link", "set", "eth0", "up")
        run("ip", "-n", self.ns, "link", "set", "lo", "up")
        burst = max(128, int(mbit * 1000 / 8 / 100))  # ~10 ms of the rate, >= 128 KiB (GSO)
        for where in (["qdisc", "replace", "dev", self.host_if],
                      ["-n", self.ns, "qdisc", "replace", "dev", "eth0"]):
            run("tc", *where, "root", "tbf", "rate", f"{mbit}mbit", "burst", f"{burst}kb",
                "latency", "500ms")
        nd = os.path.join(work, "nginx")
        os.makedirs(nd, exist_ok=True)
        conf = os.path.join(nd, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"daemon off;\nmaster_process off;\nworker_processes 1;\npid {nd}/nginx.pid;\n"
                    f"error_log {nd}/error.log;\nevents {{ worker_connections 256; }}\n"
                    f"http {{ access_log {nd}/access.log; keepalive_requests 100000;\n"
                    f"  client_body_temp_path {nd}/t1; proxy_temp_path {nd}/t2;\n"
                    f"  fastcgi_temp_path {nd}/t3; uwsgi_temp_path {nd}/t4; scgi_temp_path {nd}/t5;\n"
                    f"  server {{ listen {self.ns_ip}:8080; root {www}; }} }}\n")
        self.nginx = subprocess.Popen(STORAGE_CPU + ["ip", "netns", "exec", self.ns, "nginx", "-p",
                                                     nd, "-c", conf, "-e", f"{nd}/error.log"],
                                      start_new_session=True)
        wait_port(self.ns_ip, 8080, "nginx")

    def close(self):
        os.killpg(self.nginx.pid, signal.SIGKILL)
        self.nginx.wait()
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)


STATS = re.compile(r"remote reads: (.*)$", re.M)
#: --pin: the data plane (coordinator, DataServer, consume) on CPU 0, the storage side (nginx,
#: the delay proxy) on CPU 1, so the storage's CPU, which a real object store spends on its own
#: machines, is not taken from the decoders; [] unpinned
DATA_CPU, STORAGE_CPU = [], []


def cpu_seconds(pid):
    """user + system CPU seconds of a live process so far (/proc/PID/stat), 0 if gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def epoch(work, profiles, n, workers, cache_dir, readahead, tag, storage_pids=()):
    logs = os.path.join(work, "logs", tag)
    os.makedirs(logs, exist_ok=True)
    port = free_port()
    ep = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ)
    env["DH_READAHEAD_BYTES"] = str(64 << 20) if readahead else "0"
    procs = []
    try:
        clog = open(os.path.join(logs, "coordinator.log"), "w")
        coord = subprocess.Popen(DATA_CPU + [CLI, "coordinator", "--listen", ep], stderr=subprocess.STDOUT,
                                 stdout=clog, start_new_session=True)
        procs.append(coord)
        wait_port("127.0.0.1", port, "coordinator")
        sargs = DATA_CPU + [CLI, "server", "--coordinator", ep, "--role", "local", "--node", "n0",
                 "--workers", str(workers), "--arena-mb", "512", "--name", "ds0"]
        if cache_dir:
            sargs += ["--cache-dir", cache_dir, "--cache-bytes", "4G"]
        slog_path = os.path.join(logs, "server.log")
        slog = open(slog_path, "w")
        server = subprocess.Popen(sargs, stderr=subprocess.STDOUT, stdout=slog, env=env,
                                  start_new_session=True)
        procs.append(server)
        storage0 = sum(cpu_seconds(p) for p in storage_pids)
        t0 = time.monotonic()
        r = subprocess.run(DATA_CPU + [CLI, "consume", "--coordinator", ep, "--profiles", profiles,
                            "--rank", "0", "--ranks", "1", "--batch", "4", "--node", "n0",
                            "--prefetch", "8", "--no-shuffle"], capture_output=True, text=True)
        wall = time.monotonic() - t0
        storage_s = sum(cpu_seconds(p) for p in storage_pids) - storage0
        if r.returncode != 0:
            raise RuntimeError(f"consume failed ({tag}): {r.stderr[-2000:]}")
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
        slog.close()
        text = open(slog_path).read()
        m = STATS.findall(text)
        stats = dict(kv.split("=") for kv in m[-1].split()) if m else {}
        return {"wall_s": wall, "samples_per_s": n / wall, "storage_cpu_s": storage_s,
                **{k: int(v) for k, v in stats.items()}}
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--proxy":
        proxy_main(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clips", type=int, default=48)
    ap.add_argument("--per-shard", type=int, default=12)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mbit", type=int, default=1000)
    ap.add_argument("--delay-ms", type=float, default=25.0, help="each way (RTT = 2x)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--configs", default=None,
                    help="comma-separated epochs to run (default: all; 'local' always runs)")
    ap.add_argument("--pin", action="store_true",
                    help="data plane on CPU 0, nginx and the delay proxy on CPU 1 (local too)")
    ap.add_argument("--ra-threads", type=int, default=None,
                    help="read-ahead threads (DH_READAHEAD_THREADS; default: the DataServer's)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (a network namespace)")
    if args.pin:
        global DATA_CPU, STORAGE_CPU
        DATA_CPU, STORAGE_CPU = ["taskset", "-c", "0"], ["taskset", "-c", "1"]
    work = tempfile.mkdtemp(prefix="datahelix-remote-bench-")
    link = proxy = None
    try:
        www, prof_local = make_dataset(work, args.clips, args.per_shard)
        n = sum(1 for _ in open(prof_local))
        link = Link(work, www, args.mbit)
        pport = free_port()
        proxy = subprocess.Popen(STORAGE_CPU + [sys.executable, os.path.abspath(__file__), "--proxy", str(pport),
                                  link.ns_ip, "8080", str(args.delay_ms)], start_new_session=True)
        wait_port("127.0.0.1", pport, "delay proxy")
        prof_remote = os.path.join(work, "profiles-remote.jsonl")
        with open(prof_local) as f, open(prof_remote, "w") as g:
            g.write(f.read().replace(www + "/", f"http://127.0.0.1:{pport}/"))
        configs = [("local", prof_local, None, False), ("remote-nocache", prof_remote, None, False),
                   ("remote-cold-ra-off", prof_remote, "cold", False),
                   ("remote-cold-ra-on", prof_remote, "cold", True),
                   ("remote-warm-ra-off", prof_remote, "warm", False),
                   ("remote-warm-ra-on", prof_remote, "warm", True)]
        if args.configs:
            keep = set(args.configs.split(",")) | {"local"}
            unknown = keep - {c[0] for c in configs}
            if unknown:
                sys.exit(f"--configs: no epoch named {sorted(unknown)}; the epochs are "
                         f"{[c[0] for c in configs]}")
            configs = [c for c in configs if c[0] in keep]
        if args.ra_threads is not None:
            os.environ["DH_READAHEAD_THREADS"] = str(args.ra_threads)
        results = {c[0]: [] for c in configs}
        for run_i in range(args.runs):
            warm_dir = os.path.join(work, f"cache-warm-{run_i}")
            for name, prof, cache, ra in configs:
                cdir = None
                if cache == "cold":
                    cdir = os.path.join(work, f"cache-{name}-{run_i}")
                    shutil.rmtree(cdir, ignore_errors=True)
                elif cache == "warm":
                    cdir = warm_dir
                    if not os.path.exists(cdir):  # filled by a first epoch, not counted
                        epoch(work, prof, n, args.workers, cdir, True, f"fill-{run_i}")
                res = epoch(work, prof, n, args.workers, cdir, ra, f"{name}-{run_i}",
                            (link.nginx.pid, proxy.pid))
                results[name].append(res)
                print(f"run {run_i} {name}: {res['samples_per_s']:.2f} samples/s, storage "
                      f"{res['storage_cpu_s']:.2f} CPU s", flush=True)
        local = statistics.median(r["samples_per_s"] for r in results["local"])
        summary = {"clips": n, "mbit": args.mbit, "rtt_ms": 2 * args.delay_ms,
                   "workers": args.workers, "ra_threads": args.ra_threads, "pin": args.pin, "loadavg": os.getloadavg(), "configs": {}}
        for name, rs in results.items():
            sps = statistics.median(r["samples_per_s"] for r in rs)
            row = {"samples_per_s": sps, "ratio_to_local": sps / local,
                   "runs": [round(r["samples_per_s"], 3) for r in rs],
                   "storage_cpu_s": statistics.median(r["storage_cpu_s"] for r in rs)}
            fetched = [r.get("bytes_fetched", 0) for r in rs]
            read = [r.get("bytes_read", 0) for r in rs]
            if any(read):
                row["bytes_fetched_per_sample"] = statistics.median(fetched) / n
                row["bytes_read_per_sample"] = statistics.median(read) / n
                row["fetched_over_read"] = statistics.median(
                    f / r for f, r in zip(fetched, read) if r)
                row["requests"] = statistics.median(r.get("requests", 0) for r in rs)
                row["cache_hits"] = statistics.median(r.get("cache_hits", 0) for r in rs)
                row["ra_done"] = statistics.median(r.get("ra_done", 0) for r in rs)
            summary["configs"][name] = row
        print(json.dumps(summary, indent=1))
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)
    finally:
        if proxy:
            os.killpg(proxy.pid, signal.SIGKILL)
            proxy.wait()
        if link:
            link.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("kept", work)


if __name__ == "__main__":
    main()
