"""The emulated training loop of `datahelix bench --dataset DIR`, its metrics and its report,
for the peers of bench/peers/ (README.md there).

The loop (src/bench/train_bench.c, rank_main): R ranks, here processes joined by a
torch.distributed gloo group on 127.0.0.1. Each rank, each step:

1. asks its loader for the next batch: the time it blocks is the input wait;
2. "computes" a x tokens + b seconds (a sleep: the emulated accelerator, which leaves the
   CPU to the loaders), tokens being, for every system, the decoded samples' visual tokens
   (visual_tokens() of the decoded T x H x W; datahelix: the server's per-sample tokens,
   the same formula) plus their caption tokens (the profile's text_len): sample_tokens();
   consume(batch) runs inside that time, and is a no-op for every system now: Ray's copy
   out of the object store is made by the rank's prefetch thread, off the step, as Ray
   Data's iter_torch_batches(prefetch_batches=...) does (ray_peer.py);
3. all-reduces a small tensor (the gradient all-reduce, here the barrier): the barrier wait.

`--warmup` steps run first and are not measured; the measured window runs from the
all-reduce that ends the warm-up to the last one, timed on rank 0. Loaders keep requesting
past the last measured step (the samplers never end), so the pipeline does not drain inside
the window.

A system module (torch_peer, ray_peer, datahelix_peer) provides:
    NAME, unavailable() -> None or the reason it cannot run,
    setup(cfg) -> picklable context for the ranks (in the launcher),
    teardown(context),
    open_loader(cfg, context, rank) -> an iterator of batches (in each rank),
    batch_info(cfg, batch) -> (sample_ids, per-sample tokens, ready_s or None,
        cpu_s or None: the decode workers' measured CPU seconds for this batch),
    consume(batch) (work charged to step 2's compute; none does any), close_loader(loader),
    cores(cfg) -> the decode workers it runs (the CPU budget, for the report),
    inflight(cfg) -> batches in flight per rank it runs with (cfg["inflight"], or with
        cfg["inflight"] None its own default),
    and, when batch_info has no per-batch CPU, cpu_probe(context) -> a function returning
    (CPU seconds, samples decoded) of its decode workers so far (cumulative), which the
    launcher samples through the run (cpu_work_s below).

cpu_work_s, each system's own CPU: the CPU seconds its decode workers spent on the samples
consumed in the measured window, from the kernel's per-thread CPU clock. torch and ray:
each batch carries the thread CPU time its worker spent decoding and collating it
(time.thread_time around the work); the window's batches are summed. datahelix: the batch
does not carry it (the DataServer measures the same per task, but keeps it), so the
launcher samples the CPU time of the DataServer's decode-worker threads
(/proc/self/task/TID/schedstat) and its decoded-sample counter through the run:
cpu_work_s = samples consumed in the window x (worker CPU / samples decoded) over the
window (over the whole run when fewer than one step's samples were decoded inside it).
The ideal bound is samples / max(cpu_work_s / cores, the window's compute).
"""
import datetime
import importlib
import json
import multiprocessing
import os
import queue as queue_mod
import re
import socket
import sys
import time
import traceback

import numpy as np


class BenchError(Exception):
    """An error with a message for the user (no traceback)."""


# ---- the dataset ----------------------------------------------------------------------


def _read_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError as e:
                        raise BenchError(f"{path}:{n}: not JSON: {e}") from None
    except OSError as e:
        raise BenchError(f"cannot read {path}: {e.strerror}") from None
    return rows


def load_dataset(directory):
    """Samples of DIR (profiles.jsonl from `datahelix probe`; manifest.jsonl, if there, for
    the paths relative to DIR and the captions), in profile order: dicts with id, path,
    caption, frames, height, width, tokens, cpu_s."""
    if not os.path.isdir(directory):
        raise BenchError(f"--dataset {directory}: not a directory")
    profiles_path = os.path.join(directory, "profiles.jsonl")
    if not os.path.exists(profiles_path):
        raise BenchError(f"{profiles_path}: no such file (make it with `datahelix probe "
                         f"{os.path.join(directory, 'manifest.jsonl')} -o {profiles_path}`)")
    profiles = _read_jsonl(profiles_path)
    manifest_path = os.path.join(directory, "manifest.jsonl")
    manifest = {}
    if os.path.exists(manifest_path):
        for row in _read_jsonl(manifest_path):
            if "id" in row:
                manifest[str(row["id"])] = row
    samples = []
    for n, p in enumerate(profiles, 1):
        missing = [k for k in ("id", "frames", "height", "width", "tokens_est", "cpu_s_est")
                   if k not in p]
        if missing:
            raise BenchError(f"{profiles_path}:{n}: no {', '.join(missing)}")
        sid = str(p["id"])
        m = manifest.get(sid, {})
        candidates = []
        if m.get("path"):
            candidates.append(m["path"] if os.path.isabs(m["path"])
                              else os.path.join(directory, m["path"]))
        if p.get("uri"):
            candidates += [p["uri"], os.path.join(directory, p["uri"])]
        path = next((c for c in candidates if os.path.exists(c)), None)
        if path is None:
            tried = ", ".join(candidates) or "nothing: no uri in the profile, no manifest line"
            raise BenchError(f"{profiles_path}:{n}: sample {sid}: its video is not there "
                             f"(tried {tried})")
        samples.append({"id": sid, "path": os.path.abspath(path),
                        "caption": m.get("caption", ""), "frames": int(p["frames"]),
                        "height": int(p["height"]), "width": int(p["width"]),
                        "tokens": max(int(p["tokens_est"]), 0),
                        "text_len": max(int(p.get("text_len", 0)), 0),
                        "cpu_s": max(float(p["cpu_s_est"]), 0.0)})
    if not samples:
        raise BenchError(f"{profiles_path}: no samples")
    return samples


# ---- tokens: one source for every system ---------------------------------------------------


def visual_tokens(frames, height, width):
    """Visual tokens of a decoded T x H x W clip: dh_tokens_visual (src/model/mix.c): 2-frame
    tubelets of 14 x 14 patches, merged 2 x 2."""
    return ((frames + 1) // 2) * ((height + 13) // 14) * ((width + 13) // 14) // 4


def sample_tokens(visual, sample):
    """What the emulated accelerator computes on for one sample, in every system: its
    decoded visual tokens plus its caption's tokens (the profile's text_len), the sum the
    profile's tokens_est estimates."""
    return int(visual) + int(sample.get("text_len", 0))


# ---- the compute model ------------------------------------------------------------------


def compute_model(samples, ranks, batch, cores, scale, threshold=None):
    """The balanced regime of `datahelix bench --compute auto`: per step the mean rank
    computes ranks x batch x mean CPU / cores; b is a tenth of it, a x tokens the rest; both
    x scale. Returns a, b, the mean step's compute and the miss threshold (default 10% of
    it)."""
    mean_cpu = sum(s["cpu_s"] for s in samples) / len(samples)
    mean_tok = sum(s["tokens"] for s in samples) / len(samples)
    step = ranks * batch * mean_cpu / cores
    b = 0.1 * step * scale
    a = (0.9 * step / (batch * mean_tok) if mean_tok > 0 else 0.0) * scale
    mean_step = a * batch * mean_tok + b
    return {"a": a, "b": b, "mean_cpu_s": mean_cpu, "mean_tokens": mean_tok,
            "mean_step_compute_s": mean_step,
            "deadline_threshold_s": threshold if threshold and threshold > 0
            else 0.1 * mean_step}


# ---- pinning: the same rule for every system's decode workers ----------------------------


def budget_cpus(cores):
    """The CPUs of the decode budget: the first `cores` this process may use."""
    return sorted(os.sched_getaffinity(0))[:cores]


def worker_cpu(cfg, index):
    """--pin: decode worker `index` (numbered across the whole system: torch rank r's
    worker w is r x workers-per-rank + w, Ray's actor i, the DataServer's worker thread i)
    runs on one CPU of the budget, round robin. None with --no-pin."""
    if not cfg["pin"]:
        return None
    cpus = cfg["budget_cpus"]
    return {cpus[index % len(cpus)]}


def pin_this_process(cpus):
    """Every thread of this process (a torch worker, a Ray actor) onto `cpus` (os.
    sched_setaffinity(0) would move only the calling thread)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, ValueError):
            pass  # a thread that ended meanwhile


def thread_cpu_s(tid):
    """CPU seconds thread `tid` of this process has run (schedstat: nanoseconds on CPU;
    else utime + stime in clock ticks)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


# ---- one rank ---------------------------------------------------------------------------


def _progress(line):
    print(f"peers: {line}", file=sys.stderr, flush=True)


def rank_entry(system, cfg, context, rank, port, results):
    """A rank process: joins the gloo group, runs the loop, puts its records on `results`."""
    try:
        _rank_main(system, cfg, context, rank, port, results)
    except BaseException as e:  # noqa: BLE001 - reported to the launcher
        # the root cause is the last line (a worker's or an actor's error comes wrapped,
        # with its traceback, in the message)
        text = re.sub(r"\x1b\[[0-9;]*m", "", "".join(
            traceback.format_exception_only(type(e), e)))
        lines = [ln for ln in text.splitlines() if ln.strip()]
        short = lines[-1].strip() if lines else type(e).__name__
        if cfg.get("verbose") and not isinstance(e, BenchError):
            print(f"peers: rank {rank}:\n{traceback.format_exc()}", file=sys.stderr,
                  flush=True)
        results.put(("error", rank, short))
        raise SystemExit(1)


def _rank_main(system, cfg, context, rank, port, results):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    mod = importlib.import_module(system)
    ranks, a, b = cfg["ranks"], cfg["a"], cfg["b"]
    total = cfg["warmup"] + cfg["steps"]
    cpu_of, tokens_of = cfg["cpu_of"], cfg["tokens_of"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks,
                            timeout=datetime.timedelta(seconds=cfg["timeout_s"]))
    t_open = time.perf_counter()
    loader = mod.open_loader(cfg, context, rank)
    token = torch.zeros(4)
    steps = []
    try:
        it = iter(loader)
        dist.all_reduce(token)  # every rank's loader is open
        t_begin = time.perf_counter() if cfg["warmup"] == 0 else None
        t_end = None
        every = cfg["steps"] // 5 if cfg["steps"] >= 10 else 1
        for s in range(total):
            t0 = time.perf_counter()
            batch = next(it)
            t1 = time.perf_counter()
            ids, per_sample, ready_s, cpu_s = mod.batch_info(cfg, batch)
            n, tokens = len(ids), sum(per_sample)
            compute = a * tokens + b
            c0 = time.perf_counter()
            mod.consume(batch)
            del batch
            rest = compute - (time.perf_counter() - c0)
            if rest > 0:
                time.sleep(rest)
            t2 = time.perf_counter()
            dist.all_reduce(token)
            t3 = time.perf_counter()
            steps.append({"wait_s": t1 - t0, "compute_s": compute, "barrier_s": t3 - t2,
                          "samples": n, "tokens": tokens, "cpu_s": cpu_s,
                          "cpu_est_s": sum(cpu_of.get(i, 0.0) for i in ids),
                          # samples whose tokens differ from the profile's tokens_est
                          # (visual + caption): 0 when every system counts the same way
                          "token_mismatch": sum(t != tokens_of.get(i) for i, t in
                                                zip(ids, per_sample)),
                          "ready_s": ready_s})
            if rank == 0:
                if s + 1 == cfg["warmup"]:
                    t_begin = t3
                if s + 1 == total:
                    t_end = t3
                done = s + 1 - cfg["warmup"]
                if done > 0 and done % every == 0:
                    el = t3 - t_begin
                    sps = done * ranks * cfg["batch"] / el if el > 0 else 0
                    _progress(f"{mod.NAME}: step {done}/{cfg['steps']}, {sps:.1f} samples/s")
    finally:
        mod.close_loader(loader)
    results.put(("ok", rank, {"steps": steps, "t_begin": t_begin, "t_end": t_end,
                              "t_open": t_open}))
    dist.destroy_process_group()


# ---- the launcher -----------------------------------------------------------------------


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_system(system, cfg, samples):
    """Runs one system once: setup, R rank processes, teardown. Returns its metrics."""
    mod = importlib.import_module(system)
    _progress(f"{mod.NAME}: starting")
    started = time.perf_counter()
    mp = multiprocessing.get_context("spawn")
    results = mp.Queue()
    procs = []
    records = {}
    errors = []
    context = None
    sampler = None
    try:
        context = mod.setup(cfg)
        if hasattr(mod, "cpu_probe"):
            sampler = _CpuSampler(mod.cpu_probe(context))
        port = free_port()
        for r in range(cfg["ranks"]):
            p = mp.Process(target=rank_entry, args=(system, cfg, context, r, port, results),
                           name=f"peers-{mod.NAME}-rank{r}")
            p.start()
            procs.append(p)
        deadline = time.monotonic() + cfg["timeout_s"]
        while len(records) + len(errors) < cfg["ranks"]:
            try:
                kind, rank, payload = results.get(timeout=1)
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and not errors:
                    # a rank died without a word (killed, crashed in C): give it a moment
                    # to flush, then name it
                    time.sleep(1)
                    if results.empty():
                        errors.append(f"rank {procs.index(dead[0])} exited with code "
                                      f"{dead[0].exitcode}")
                if errors or time.monotonic() > deadline:
                    if not errors:
                        errors.append(f"no result in {cfg['timeout_s']} s (--timeout)")
                    break
                continue
            if kind == "ok":
                records[rank] = payload
            else:
                errors.append(f"rank {rank}: {payload}")
                break
        for p in procs:
            p.join(timeout=30 if not errors else 2)
    finally:
        if sampler is not None:
            sampler.stop()
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        mod.teardown(context)
    if errors:
        raise BenchError(errors[0])
    result = metrics(cfg, [records[r] for r in range(cfg["ranks"])], mod.cores(cfg),
                     sampler.series if sampler is not None else None)
    result["inflight"] = mod.inflight(cfg)
    result["pinned"] = bool(cfg["pin"])
    result["setup_s"] = time.perf_counter() - started - result["wall_s"]
    _progress(f"{mod.NAME}: {result['throughput_sps']:.1f} samples/s (ideal "
              f"{result['ideal_sps']:.1f}, efficiency {result['efficiency']:.2f}, balance "
              f"{result['balance']:.2f}), input wait p95 {result['input_wait_p95_s']:.3f} s, "
              f"misses {100 * result['ddl_miss_rate']:.0f}%")
    return result


class _CpuSampler:
    """Samples probe() -> (CPU s, samples decoded) every 0.1 s on a thread of the launcher:
    series of (perf_counter, cpu_s, decoded). perf_counter is CLOCK_MONOTONIC, the clock the
    ranks stamp the window with."""

    def __init__(self, probe):
        import threading

        self.probe = probe
        self.series = []
        self._stop = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="peers-cpu", daemon=True)
        self._thread.start()

    def _sample(self):
        cpu, decoded = self.probe()
        self.series.append((time.perf_counter(), cpu, decoded))

    def _run(self):
        while not self._stop.wait(0.1):
            self._sample()

    def stop(self):
        self._stop.set()
        self._thread.join()
        self._sample()


def _window_cpu(series, t0, t1, consumed, per_step):
    """cpu_work_s from a probe's series: consumed x (CPU / decoded) over [t0, t1], or over
    the whole series when fewer than `per_step` samples were decoded in the window."""
    t = [x[0] for x in series]
    cpu = [x[1] for x in series]
    dec = [x[2] for x in series]
    c = float(np.interp(t1, t, cpu) - np.interp(t0, t, cpu))
    d = float(np.interp(t1, t, dec) - np.interp(t0, t, dec))
    method = "window"
    if d < per_step:
        c, d, method = cpu[-1] - cpu[0], dec[-1] - dec[0], "run"
    return (consumed * c / d if d > 0 else 0.0), method


def metrics(cfg, ranks, cores, cpu_series=None):
    """The metrics of `datahelix bench` over the measured steps of every rank."""
    warmup, steps, n_ranks = cfg["warmup"], cfg["steps"], cfg["ranks"]
    threshold = cfg["deadline_threshold_s"]
    waits, readies = [], []
    samples = misses = barrier = mean_sum = max_sum = cpu = cpu_est = 0.0
    mismatch = 0
    per_batch_cpu = True
    rank_step_s = [[0.0] * steps for _ in range(n_ranks)]
    for s in range(warmup, warmup + steps):
        mx = tot = 0.0
        for r in range(n_ranks):
            st = ranks[r]["steps"][s]
            waits.append(st["wait_s"])
            if st["ready_s"] is not None:
                readies.append(st["ready_s"])
            rank_step_s[r][s - warmup] = st["wait_s"] + st["compute_s"]
            samples += st["samples"]
            misses += st["wait_s"] > threshold
            barrier += st["barrier_s"]
            if st["cpu_s"] is None:
                per_batch_cpu = False
            else:
                cpu += st["cpu_s"]
            cpu_est += st["cpu_est_s"]
            mismatch += st["token_mismatch"]
            tot += st["compute_s"]
            mx = max(mx, st["compute_s"])
        mean_sum += tot / n_ranks
        max_sum += mx
    n = n_ranks * steps
    wall = ranks[0]["t_end"] - ranks[0]["t_begin"]
    throughput = samples / wall if wall > 0 else 0.0
    if per_batch_cpu:
        cpu_method = "per-batch"
    elif cpu_series:
        cpu, how = _window_cpu(cpu_series, ranks[0]["t_begin"], ranks[0]["t_end"], samples,
                               n_ranks * cfg["batch"])
        cpu_method = f"worker-threads-{how}"
    else:
        raise BenchError("no CPU measurement: batch_info gave no CPU and there is no "
                         "cpu_probe")
    cores_eff = min(cfg["cores"], cores) if cores else cfg["cores"]
    bound = max(cpu / cores_eff, max_sum)
    ideal = samples / bound if bound > 0 else 0.0
    return {
        "throughput_sps": throughput,
        "input_wait_p50_s": float(np.percentile(waits, 50)),
        "input_wait_p95_s": float(np.percentile(waits, 95)),
        "input_wait_p99_s": float(np.percentile(waits, 99)),
        "batch_ready_p95_s": float(np.percentile(readies, 95)) if readies else None,
        "ddl_miss_rate": misses / n,
        "barrier_wait_mean_s": barrier / n,
        "cross_node_bytes": 0,  # one node
        "copy_bytes": None,  # real copies cost their real time here; not counted
        "sched_us_per_decision": None,
        "ideal_sps": ideal,
        "efficiency": throughput / ideal if ideal > 0 else 0.0,
        "balance": mean_sum / max_sum if max_sum > 0 else 0.0,
        "cores": cores,
        "wall_s": wall,
        "samples": int(samples),
        "cpu_work_s": cpu,
        "cpu_est_s": cpu_est,
        "cpu_work_method": cpu_method,
        "token_mismatch": mismatch,
        "rank_step_s": [[round(x, 5) for x in row] for row in rank_step_s],
    }


METRIC_KEYS = ("throughput_sps", "input_wait_p50_s", "input_wait_p95_s", "input_wait_p99_s",
               "batch_ready_p95_s", "ddl_miss_rate", "barrier_wait_mean_s", "cross_node_bytes",
               "sched_us_per_decision", "ideal_sps", "efficiency", "balance", "cores",
               "wall_s", "samples", "cpu_work_s", "cpu_est_s", "setup_s")


def median_of_runs(runs):
    """Per metric, the median over runs (None stays None); rank_step_s of the run with the
    median throughput; every run's metrics under "runs"."""
    out = {}
    for k in METRIC_KEYS:
        vals = [r[k] for r in runs if r.get(k) is not None]
        out[k] = float(np.median(vals)) if vals else None
    for k in ("cores", "inflight", "pinned", "cpu_work_method"):
        out[k] = runs[0][k]
    out["token_mismatch"] = sum(r["token_mismatch"] for r in runs)
    out["cross_node_bytes"] = 0
    out["copy_bytes"] = None
    order = sorted(range(len(runs)), key=lambda i: runs[i]["throughput_sps"])
    out["rank_step_s"] = runs[order[(len(runs) - 1) // 2]]["rank_step_s"]
    out["runs"] = [{k: r.get(k) for k in METRIC_KEYS + ("cpu_work_method",)} for r in runs]
    return out


# ---- the report -------------------------------------------------------------------------


def _ratio(x, y):
    return f"{x / y:.2f}x" if y else "-"


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def print_table(f, report):
    systems = report["systems"]
    torch_r, ray_r = systems.get("torch"), systems.get("ray")
    head = (f"{'system':<10} {'cores':>5} {'depth':>5} {'pin':>3} {'samples/s':>9} "
            f"{'wait p50':>8} {'wait p95':>8} {'wait p99':>8} {'ready95':>7} {'miss':>5} "
            f"{'barrier':>8} {'cpu s':>7} {'eff':>5} {'bal':>5} {'x torch':>8} {'x ray':>8}")
    print(head, file=f)
    for name, s in systems.items():
        print(f"{name:<10} {s['cores']:>5} {s['inflight']:>5} "
              f"{'yes' if s['pinned'] else 'no':>3} {s['throughput_sps']:>9.1f} "
              f"{s['input_wait_p50_s']:>8.3f} {s['input_wait_p95_s']:>8.3f} "
              f"{s['input_wait_p99_s']:>8.3f} {_f(s['batch_ready_p95_s'], '7.3f'):>7} "
              f"{100 * s['ddl_miss_rate']:>4.0f}% {s['barrier_wait_mean_s']:>8.3f} "
              f"{s['cpu_work_s']:>7.2f} {s['efficiency']:>5.2f} {s['balance']:>5.2f} "
              f"{_ratio(s['throughput_sps'], torch_r['throughput_sps']) if torch_r else '-':>8} "
              f"{_ratio(s['throughput_sps'], ray_r['throughput_sps']) if ray_r else '-':>8}",
              file=f)
    print("(depth: batches in flight per rank; cpu s: cpu_work_s, the system's own decode "
          "CPU for the window's samples; eff: throughput / (samples / max(cpu s / cores, "
          "compute)))", file=f)
    runs = report["config"]["runs"]
    if runs > 1:
        print(f"(medians of {runs} runs; samples/s per run: " + "; ".join(
            f"{n} " + ", ".join(f"{r['throughput_sps']:.1f}" for r in s["runs"])
            for n, s in systems.items()) + ")", file=f)
    for name, reason in report["config"].get("skipped", {}).items():
        print(f"{name}: skipped: {reason}", file=f)
    dh = systems.get("datahelix")
    if dh:
        parts = []
        for peer_name in ("torch", "ray"):
            peer = systems.get(peer_name)
            if not peer:
                continue
            miss = (f"{dh['ddl_miss_rate'] / peer['ddl_miss_rate']:.2f}x"
                    if peer["ddl_miss_rate"] > 0 else
                    f"- ({peer_name} 0%, datahelix {100 * dh['ddl_miss_rate']:.0f}%)")
            parts.append(f"datahelix/{peer_name}: throughput "
                         f"{_ratio(dh['throughput_sps'], peer['throughput_sps'])}, input-wait "
                         f"p95 {_ratio(dh['input_wait_p95_s'], peer['input_wait_p95_s'])}, "
                         f"miss rate {miss}")
        for p in parts:
            print(p, file=f)
    for name, s in systems.items():
        if s.get("token_mismatch"):
            print(f"note: {name}: {s['token_mismatch']} samples' tokens differ from the "
                  f"profile's tokens_est (visual + caption)", file=f)
        if s["efficiency"] > 1.02:
            print(f"note: {name} ran above its ideal bound (efficiency {s['efficiency']:.2f}):"
                  f" the measured steps drew on batches prefetched before them; use more "
                  f"--steps / --warmup for a steady-state figure", file=f)


def write_json(path, report):
    try:
        with open(path, "w") as f:
            json.dump(report, f, indent=None, separators=(",", ":"))
            f.write("\n")
    except OSError as e:
        raise BenchError(f"cannot write --json {path}: {e.strerror}") from None
