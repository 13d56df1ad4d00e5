#!/usr/bin/env python3
"""bench/peers: the emulated training loop of `datahelix bench --dataset DIR`, fed by
third-party loaders and by datahelix.DataLoader, side by side (issue 6, point 3).

R ranks (processes in one torch.distributed gloo group on 127.0.0.1) take a batch, sleep
a x tokens + b seconds (the emulated accelerator), then all-reduce a small tensor (the
barrier). The same dataset, the same frames and size (each sample's profile plan), the
same total CPU budget (--workers decode workers, on min(workers, CPUs) cores), and by
default the same conditions for each system:

  in flight  --inflight N (4) batches per rank for every system: torch prefetch_factor x
             workers per rank, Ray's outstanding ActorPool tasks, datahelix prefetch;
             --own-defaults: each system's own (torch 2 x workers per rank, Ray the same
             rule, datahelix its loader's 4)
  pinning    --pin (default): every system's decode workers (torch workers, Ray actors,
             the DataServer's worker threads), numbered across the system, each on one
             CPU of the budget, round robin; --no-pin: none pinned
  tokens     the compute of every system: decoded visual tokens + caption tokens
  CPU        cpu_work_s: each system's own measured decode-worker CPU seconds for the
             samples of the measured window; the ideal bound and the efficiency use it
  decoder    --pyav skip (default): the peers' PyAV skips the non-reference frames not
             sampled, the skipping DataHelix does (the same frames); --pyav plain decodes
             every frame (the model before issue 31)

  torch      rank-local torch.utils.data.DataLoader: DistributedSampler(shuffle, seed),
             max(1, workers // ranks) workers per rank, a Dataset that decodes with PyAV
  ray        one Ray instance (num_cpus = workers), `workers` PyAV decode actors shared by
             every rank, each rank a Ray driver with its own ray.util.ActorPool over them;
             batches copied out of the object store on a prefetch thread per rank (as Ray
             Data's iter_torch_batches(prefetch_batches=...)), not in the step
  datahelix  datahelix.DataLoader against a local DataServer of W worker threads, epoch
             after epoch; imported from the environment, else build/python (skipped, with
             the reason, when neither imports)

Compute (`--compute auto` of datahelix bench, the balanced regime): with cores =
min(workers, CPUs), step = ranks x batch x mean cpu_s_est / cores, b = 0.1 x step,
a = 0.9 x step / (batch x mean tokens_est), both x --compute-scale, whose default is the
--regime's: compute-bound (default) 1, the loop of `make bench-peers` so far; data-bound
0.25, compute small enough that every system's decode bounds it (README.md). A step misses
when its input wait exceeds --deadline-threshold (default 10% of the mean step's compute).
--steps (40) measured steps follow a warm-up at least as deep as the deepest in-flight
depth; --runs (3) runs per system, interleaved, medians reported.

Prints progress on stderr, then a table on stdout (samples/s, input-wait percentiles,
batch request -> ready p95, miss rate, barrier wait, cpu_work_s, efficiency, balance,
ratios against torch and ray) and the datahelix/torch and datahelix/ray ratios; --json FILE
writes {"config":{...},"systems":{"torch":{...},"ray":{...},"datahelix":{...}}} with the
metric names of `datahelix bench --json` (see bench/peers/README.md).
"""
import argparse
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402
from common import BenchError  # noqa: E402

SYSTEMS = {"torch": "torch_peer", "ray": "ray_peer", "datahelix": "datahelix_peer"}
# --regime: the default --compute-scale. compute-bound: the balanced compute of `datahelix
# bench --compute auto` (the mean step's compute = the DataHelix decoder's CPU for it on the
# cores), where the plans' balance bounds every system; data-bound: a quarter of it, so
# that even the slowest rank's compute (about 0.25 / 0.67 = 0.37 of the decode under
# count-based batches) stays well under every system's decode CPU / cores, with room for
# the probe calibration's error, and the per-core decoder and the pipeline show
# (bench/peers/README.md, "Regimes")
REGIMES = {"compute-bound": 1.0, "data-bound": 0.25}


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="run_peers.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python3 bench/peers/run_peers.py --runs 3 --json out/peers/peers.json")
    w = p.add_argument_group("workload")
    w.add_argument("--dataset", metavar="DIR",
                   help="DIR/profiles.jsonl from `datahelix probe` (and DIR/manifest.jsonl); "
                        "default: synthesise and probe --count clips of --mix")
    w.add_argument("--mix", metavar="NAME|FILE.json",
                   help="without --dataset: the mix `datahelix synth` draws from "
                        "(default kinetics-mixed)")
    w.add_argument("--count", type=int, default=48,
                   help="without --dataset: clips to synthesise (48)")
    w.add_argument("--out-dir", metavar="DIR", default=os.path.join(ROOT, "out", "peers"),
                   help="without --dataset: where the data set is made, as "
                        "DIR/MIX-nCOUNT-sSEED, and reused when there (out/peers)")
    w.add_argument("--cli", metavar="PATH", default=os.path.join(ROOT, "build", "datahelix"),
                   help="the datahelix binary for synth and probe (build/datahelix)")
    w.add_argument("--ranks", type=int, default=4, help="ranks (4)")
    w.add_argument("--batch", type=int, default=2, help="samples per rank per step (2)")
    w.add_argument("--steps", type=int, default=40, help="measured steps (40)")
    w.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps, not measured (default: the deepest in-flight depth "
                        "of the systems run, at least 3; never less than that)")
    w.add_argument("--seed", type=int, default=1, help="sampler seed, and synth seed (1)")
    s = p.add_argument_group("systems")
    s.add_argument("--systems", default="torch,ray,datahelix",
                   help="comma-separated, in run order (torch,ray,datahelix)")
    s.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="decode workers in all, every system (default: the CPUs, "
                        f"{os.cpu_count()} here)")
    s.add_argument("--pin", dest="pin", action="store_true", default=True,
                   help="pin every system's decode workers, each on one CPU of the budget, "
                        "round robin (default)")
    s.add_argument("--no-pin", dest="pin", action="store_false",
                   help="pin no system's decode workers")
    s.add_argument("--inflight", type=int, default=4, metavar="N",
                   help="batches in flight per rank, every system (4): torch prefetch_factor "
                        "x workers per rank, Ray outstanding tasks, datahelix prefetch")
    s.add_argument("--own-defaults", action="store_true",
                   help="each system at its own default in-flight depth instead of "
                        "--inflight (torch and Ray 2 x workers per rank, datahelix 4)")
    s.add_argument("--prefetch-max", type=int, default=0, metavar="Q",
                   help="datahelix: DataLoader(prefetch_max=Q), the adaptive prefetch "
                        "(default: fixed; Q counts as its in-flight depth)")
    s.add_argument("--pyav", choices=("skip", "plain"), default="skip",
                   help="torch and Ray: skip (default) the non-reference frames not "
                        "sampled, as DataHelix does (the same frames), or decode every "
                        "frame (plain)")
    s.add_argument("--plan", choices=("balanced", "packing", "count"),
                   help="datahelix: DataLoader(plan=...) (default: the loader's own)")
    c = p.add_argument_group("compute and metrics")
    c.add_argument("--regime", choices=tuple(REGIMES), default="compute-bound",
                   help="compute-bound (default: --compute-scale 1) or data-bound "
                        "(--compute-scale 0.25: decode dominates every system)")
    c.add_argument("--compute-scale", type=float, default=None, metavar="X",
                   help="multiplies a and b (default: the --regime's; below 1 is "
                        "loading-bound, above compute-bound); given, the regime is 'custom'")
    c.add_argument("--deadline-threshold", type=float, default=0.0, metavar="S",
                   help="a step misses when its input wait exceeds S seconds (default: 10%% "
                        "of the mean step's compute)")
    o = p.add_argument_group("runs and output")
    o.add_argument("--runs", type=int, default=3,
                   help="repeat every system N times (interleaved) and report medians (3)")
    o.add_argument("--json", metavar="FILE", help="write the report as JSON")
    o.add_argument("--timeout", type=float, default=600, metavar="S",
                   help="give up on a system run after S seconds (600)")
    o.add_argument("-v", "--verbose", action="store_true",
                   help="show Ray's worker logs, the datahelix runtime's INFO lines and a "
                        "failing rank's traceback")
    args = p.parse_args(argv)
    for name in ("ranks", "batch", "steps", "workers", "runs", "count"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if (args.warmup is not None and args.warmup < 0) or args.prefetch_max < 0:
        p.error("--warmup and --prefetch-max must be >= 0")
    if args.inflight < 1:
        p.error("--inflight must be at least 1")
    if args.prefetch_max and not args.own_defaults and args.prefetch_max != args.inflight:
        p.error("--prefetch-max Q deepens datahelix's in-flight depth past --inflight: give "
                "--inflight Q too (equal depth), or --own-defaults")
    args.regime_name = args.regime if args.compute_scale is None else "custom"
    if args.compute_scale is None:
        args.compute_scale = REGIMES[args.regime]
    if not args.compute_scale > 0 or not args.timeout > 0 or args.deadline_threshold < 0:
        p.error("--compute-scale and --timeout must be > 0, --deadline-threshold >= 0")
    if args.dataset and args.mix:
        p.error("give one of --dataset DIR and --mix NAME (the mix makes a data set)")
    systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    unknown = [x for x in systems if x not in SYSTEMS]
    if unknown or not systems or len(set(systems)) != len(systems):
        p.error(f"--systems: {', '.join(unknown) or args.systems!r}: give distinct names "
                f"among {', '.join(SYSTEMS)}")
    args.system_list = systems
    return args


def make_dataset(args):
    """The data set of --mix: synthesised and probed with the datahelix CLI, once."""
    mix = args.mix or "kinetics-mixed"
    base = os.path.splitext(os.path.basename(mix))[0]
    directory = os.path.join(args.out_dir, f"{base}-n{args.count}-s{args.seed}")
    manifest = os.path.join(directory, "manifest.jsonl")
    profiles = os.path.join(directory, "profiles.jsonl")
    if os.path.exists(profiles) and os.path.exists(manifest):
        return directory
    if not os.access(args.cli, os.X_OK):
        raise BenchError(f"--cli {args.cli}: not an executable (build it with `make build`, "
                         f"or give --dataset DIR)")
    try:
        os.makedirs(args.out_dir, exist_ok=True)  # synth makes only the last level
    except OSError as e:
        raise BenchError(f"--out-dir {args.out_dir}: cannot create it: {e.strerror}") from None
    steps = []
    if not os.path.exists(manifest):
        steps.append([args.cli, "synth", "--out", directory, "--mix", mix, "--count",
                      str(args.count), "--seed", str(args.seed)])
    steps.append([args.cli, "probe", manifest, "-o", profiles])
    for cmd in steps:
        print("peers: " + " ".join(cmd), file=sys.stderr, flush=True)
        r = subprocess.run(cmd, stdout=sys.stderr)
        if r.returncode != 0:
            raise BenchError(f"`{' '.join(cmd)}` failed (exit {r.returncode})")
    return directory


def versions():
    out = {"python": platform.python_version()}
    for name in ("torch", "ray", "av", "numpy", "datahelix"):
        try:
            out[name] = getattr(__import__(name), "__version__", "?")
        except Exception:  # noqa: BLE001 - a version is only informative
            out[name] = None
    return out


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except BenchError as e:
        print(f"run_peers: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("run_peers: interrupted", file=sys.stderr)
        return 130


def run(args):
    if not args.verbose:
        os.environ.setdefault("DH_LOG_LEVEL", "warn")  # the datahelix runtime's INFO lines
    dataset = os.path.abspath(args.dataset) if args.dataset else make_dataset(args)
    samples = common.load_dataset(dataset)
    if len(samples) < args.ranks * args.batch:
        raise BenchError(f"{dataset}: {len(samples)} samples, fewer than one step's "
                         f"{args.ranks} x {args.batch}")
    ncpu = os.cpu_count() or 1
    cores = min(args.workers, ncpu)
    load_start = os.getloadavg()[0]
    model = common.compute_model(samples, args.ranks, args.batch, cores, args.compute_scale,
                                 args.deadline_threshold)
    print(f"peers: {dataset}: {len(samples)} samples (mean {model['mean_cpu_s']:.3f} CPU s, "
          f"{model['mean_tokens']:.0f} tokens); compute {model['a']:.3g} s/token + "
          f"{model['b']:.3g} s: {model['mean_step_compute_s']:.3f} s per mean step; miss "
          f"threshold {model['deadline_threshold_s']:.3f} s ({args.regime_name}, compute "
          f"scale {args.compute_scale:g}); {args.workers} decode workers on {ncpu} CPUs; "
          f"peers' PyAV: {args.pyav}", file=sys.stderr, flush=True)
    cfg = {"dataset": dataset, "samples": samples,
           "cpu_of": {s["id"]: s["cpu_s"] for s in samples},
           "tokens_of": {s["id"]: s["tokens"] for s in samples},
           "sample_of": {s["id"]: s for s in samples},
           "ranks": args.ranks, "batch": args.batch, "steps": args.steps,
           "warmup": 0, "seed": args.seed, "workers": args.workers, "ncpu": ncpu,
           "pin": args.pin, "budget_cpus": common.budget_cpus(cores),
           "inflight": None if args.own_defaults else args.inflight,
           "prefetch_max": args.prefetch_max, "plan": args.plan, "pyav": args.pyav,
           "cores": cores, "a": model["a"], "b": model["b"],
           "deadline_threshold_s": model["deadline_threshold_s"],
           "timeout_s": args.timeout, "verbose": args.verbose}

    skipped, failed, runnable = {}, {}, []
    for name in args.system_list:
        mod = __import__(SYSTEMS[name])
        reason = mod.unavailable()
        if reason:
            skipped[name] = reason
            print(f"peers: {name}: skipped: {reason}", file=sys.stderr, flush=True)
        else:
            runnable.append(name)
    depth = {name: __import__(SYSTEMS[name]).inflight(cfg) for name in runnable}
    deepest = max(depth.values(), default=0)
    warmup = max(3, deepest) if args.warmup is None else args.warmup
    if warmup < deepest:
        print(f"peers: --warmup {warmup} raised to {deepest}, the deepest in-flight depth "
              f"(so the window starts in steady state)", file=sys.stderr, flush=True)
        warmup = deepest
    cfg["warmup"] = warmup
    pinning = ("pinned, one CPU each, round robin over CPUs "
               + ",".join(map(str, cfg["budget_cpus"])) if args.pin else "not pinned")
    print("peers: in flight per rank: " + ", ".join(f"{n} {d}" for n, d in depth.items())
          + f"; decode workers {pinning}; {args.steps} steps after {warmup} of warm-up, "
          f"{args.runs} run(s)", file=sys.stderr, flush=True)
    runs = {name: [] for name in runnable}
    for k in range(args.runs):
        if args.runs > 1:
            print(f"peers: run {k + 1}/{args.runs}", file=sys.stderr, flush=True)
        for name in runnable:
            if name in failed:
                continue
            try:
                runs[name].append(common.run_system(SYSTEMS[name], cfg, samples))
            except BenchError as e:
                failed[name] = str(e)
                print(f"peers: {name}: failed: {e}", file=sys.stderr, flush=True)
    systems = {name: common.median_of_runs(runs[name]) for name in runnable
               if name not in failed}
    report = {
        "config": {
            "mode": "dataset", "source": dataset, "ranks": args.ranks, "batch": args.batch,
            "steps": args.steps, "warmup": warmup, "workers": args.workers,
            "cores": cores, "cpus": ncpu, "a": model["a"], "b": model["b"],
            "compute_scale": args.compute_scale, "regime": args.regime_name,
            "pyav": args.pyav,
            "mean_step_compute_s": model["mean_step_compute_s"],
            "deadline_threshold_s": model["deadline_threshold_s"], "seed": args.seed,
            "rows": len(samples), "systems": ",".join(args.system_list), "runs": args.runs,
            "pin": args.pin, "pinned": args.pin, "budget_cpus": cfg["budget_cpus"],
            "inflight": "own" if args.own_defaults else args.inflight,
            "inflight_per_system": depth, "own_defaults": args.own_defaults,
            "torch_workers_per_rank": max(1, args.workers // args.ranks),
            "prefetch_max": args.prefetch_max or None,
            "plan": args.plan, "versions": versions(),
            "load_avg_1m_start": load_start,
            "load_avg_1m_end": os.getloadavg()[0],
            "skipped": skipped, "failed": failed,
        },
        "systems": systems,
    }
    if systems:
        common.print_table(sys.stdout, report)
    for name, reason in failed.items():
        print(f"{name}: failed: {reason}")
    if args.json:
        common.write_json(args.json, report)
        print(f"peers: wrote {args.json}", file=sys.stderr)
    return 1 if failed or not systems else 0


if __name__ == "__main__":
    sys.exit(main())
