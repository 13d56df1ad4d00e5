"""The memory soak (issue 33; docs/operations.md, "Memory over time"): many epochs of a
training process that reads two jobs at once, a video data set decoded natively by
DataServers and a Python Dataset run by a sidecar's worker processes, with the memory of
every process of the run recorded after each epoch, and growth after the warm-up bounded.

Processes (each found by its pid: the ones this script starts, and the children of each
DataServer, which are its Python worker processes; no name matching):
  trainer          this process: two datahelix.DataLoaders (rank 0 of 1, node n1), read
                   in turn, every batch touched (a reduction over its arrays)
  coord-video      `datahelix coordinator` of the video job
  video-local      `datahelix server --role local --node n1 --workers 1 --pipeline ...`
  video-sidecar    `datahelix server --role remote --node n2 --workers 1 --pipeline ...`
  coord-py         `datahelix coordinator` of the Python-dataset job
  py-local         `datahelix server --role local --node n1 --workers 0` (delivers)
  py-sidecar       `datahelix server --role remote --node n2 --workers 2 --dataset
                   memsoak_data:make` (its outputs are forwarded through py-local)
  py-sidecar/wK    its K-th Python worker process (`python -m datahelix._worker`)

The video set is `datahelix synth` clips (two sizes, so batches pad) probed with `datahelix
probe`, one clip truncated after probing (its decode fails: the error path every epoch);
the Python Dataset (tests/soak/memsoak_data.py) returns arrays of varying lengths, a str and
an int, and raises for every 37th index. Both loaders run with on_error="skip".

Measured per process after each epoch (both loaders' passes done, gc.collect() and
malloc_trim(0) in the trainer first, see trim()): VmRSS, RssAnon and RssShmem (/proc/PID/status) and Pss (/proc/PID/
smaps_rollup). A table row per epoch goes to standard output as the run goes.

The check, per process: the growth of its private RSS (VmRSS less RssShmem) from the
first epochs after the warm-up to the last epochs is below --bound-mib (16 MiB). Warm-up:
--warmup epochs (2) are left out: epoch 1 maps the arenas, fills the allocators' pools,
imports torch's lazy modules and learns costs, and epoch 2 still grows a little. The
comparison is of floors, the least private RSS over a window of epochs (a tenth of the
epochs after the warm-up, at least 3) at each end, not of two single samples: a steady
DataServer moves by 3-10 MiB from one epoch to the next (glibc's free lists, a decoder's
mmapped frames) and back, while a leak raises the floor. The
arenas' shared pages (RssShmem) are left out of that growth because they are bounded by
construction: a DataServer's arena (--arena-mb 64) is first touched page by page as its
allocator reaches new offsets, which goes on for hundreds of epochs, so its RSS rises
towards the arena's size without any leak; instead every process's RssShmem must stay within
the two arenas it can map plus 16 MiB (SHMEM_BOUND_MIB). 16 MiB is several times that
noise, and a leak of 16 MiB over the 30-minute form's ~50,000 batches is ~330 bytes a batch
(over the short form's ~700 batches, ~23 KiB a batch: a lost batch buffer or per-epoch
client state shows). The table and the report give RSS and PSS as measured (the
arenas included), and RSS from the end of the warm-up to the last epoch. Also checked:
every epoch yields every batch of both loaders and only the planted samples fail; no Python
worker process was replaced; every process stops cleanly on SIGTERM and none is left.

    python tests/soak/memsoak.py --seconds 40                  (make test: tests/soak/test_soak.py)
    python tests/soak/memsoak.py --seconds 1800 --json out/memsoak.json    (make soak)

Exit status 0 when all holds; a JSON report (per process: pid and per-epoch samples) with
--json. The work folder (the data set, every process's log) is removed after a run that
passed (--keep keeps it) and kept after one that failed."""
import argparse
import array
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from soak import CLI, ROOT, Proc, free_port  # noqa: E402

# two clip sizes (frames, height x width) so batches pad and slabs vary
MIX = [{"frames": 8, "height": 96, "width": 128, "duration_s": 2.0, "fps": 25, "weight": 2},
       {"frames": 16, "height": 144, "width": 176, "duration_s": 3.0, "fps": 25, "weight": 1}]
VIDEO_SPEC = {"dtype": "uint8", "layout": "THWC"}
VIDEO_BATCH, PY_BATCH = 4, 8
ARENA_MB = 64  # each DataServer's --arena-mb
# RssShmem a process may hold: the trainer maps both local DataServers' arenas; a sidecar
# has its scratch buffer besides
SHMEM_BOUND_MIB = 2 * ARENA_MB + 16


def children(pid):
    """The live children of pid, from /proc (ppid), sorted."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(name))
    return sorted(out)


def memory(pid):
    """{"rss", "anon", "shmem", "pss"} in KiB (pss None when smaps_rollup is unreadable), or
    None when the process is gone."""
    m = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssShmem"):
                    m[{"VmRSS": "rss", "RssAnon": "anon", "RssShmem": "shmem"}[key]] = \
                        int(rest.split()[0])
    except OSError:
        return None
    if "rss" not in m:  # a zombie has no memory lines
        return None
    m["pss"] = None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    m["pss"] = int(line.split()[1])
                    break
    except OSError:
        pass
    return m


def make_video_set(work, count, seed):
    """synth (MIX) + probe; then the last clip is truncated, so its decode fails."""
    out = os.path.join(work, "video")
    mix = os.path.join(work, "mix.json")
    with open(mix, "w") as f:
        json.dump(MIX, f)
    env = dict(os.environ, DH_CALIBRATION_CACHE=os.path.join(work, "calib.json"))
    subprocess.run([CLI, "synth", "--out", out, "--mix", mix, "--count", str(count), "--seed",
                    str(seed), "--jobs", "2"], check=True, capture_output=True, env=env)
    subprocess.run([CLI, "probe", os.path.join(out, "manifest.jsonl"), "-o",
                    os.path.join(out, "profiles.jsonl")], check=True, capture_output=True,
                   env=env)
    with open(os.path.join(out, "manifest.jsonl")) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    bad = entries[-1]
    path = os.path.join(out, bad["path"])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 3)
        f.write(b"\0" * (size - size // 3))
    return out, bad["id"]


def wait_registered(coord, names, timeout=30):
    log = os.path.join(coord.logdir, f"{coord.name}.{coord.starts}.log")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = open(log).read()
        if all(f"DataServer '{n}' registered" in text for n in names):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{names} did not register with {coord.name}: {open(log).read()}")


def trim():
    """malloc_trim(0) in the trainer before it is measured: glibc keeps freed memory in its
    arenas (one per thread that allocates: the client's fetcher, torch's), so the trainer's
    RSS otherwise jumps by ~10 MiB steps between 150 and 200 MiB from one epoch to the next
    depending on which arena's top was free, which no window of a short run smooths out.
    After the trim its RSS is what it holds. (The DataServers and coordinators are measured
    as they are: C processes whose swings are a few MiB.)"""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def touch(batch):
    """The trainer's 'compute': a reduction over every tensor of the batch."""
    total = 0.0
    for v in batch.values():
        if hasattr(v, "dtype") and hasattr(v, "sum"):
            total += float(v.sum())
    return total


class Record:
    """The samples of a run: per process, one flat array of int32 (epoch, rss, pss, anon,
    shmem in KiB; pss -1 for None), 20 bytes per process and epoch. The trainer measures
    itself, so what it keeps of the run is part of what it measures: a list of (epoch,
    dict) pairs took ~390 bytes per process and epoch (a dict, four ints, a tuple, in
    pymalloc's arenas), ~3.5 KiB per epoch for the 9 processes, which was the trainer's
    whole 'linear growth' in the first 30-minute run (docs/operations.md, "Memory over
    time"). As arrays: 180 bytes an epoch, ~0.4 MiB over that run's 2,233 epochs."""

    FIELDS = ("rss", "pss", "anon", "shmem")

    def __init__(self):
        self._rows = {}

    def add(self, name, epoch, m):
        a = self._rows.setdefault(name, array.array("i"))
        a.extend([epoch] + [-1 if m[k] is None else m[k] for k in self.FIELDS])

    def epochs(self, name):
        return len(self._rows.get(name, ())) // (1 + len(self.FIELDS))

    def rows(self):
        """{name: [(epoch, mem dict)]}, made at the end of the run (after the last sample)."""
        w = 1 + len(self.FIELDS)
        out = {}
        for name, a in self._rows.items():
            out[name] = [(a[i], {k: (None if k == "pss" and a[i + 1 + j] < 0 else a[i + 1 + j])
                                 for j, k in enumerate(self.FIELDS)})
                         for i in range(0, len(a), w)]
        return out


def mib(kib):
    return "-" if kib is None else f"{kib / 1024:.1f}"


def run(args, datahelix, memsoak_data, procs, servers, loaders, tracked, samples, failures,
        work, video_dir, bad_clip, ep_video, ep_py, t0):
    """Starts the processes and runs the epochs, measuring after each."""
    coord_v, coord_p = procs[0], procs[3]
    coord_v.start()
    coord_p.start()
    time.sleep(0.3)  # the listening sockets (servers retry regardless)
    for s in servers:
        s.start()
    wait_registered(coord_v, ["video-local", "video-sidecar"])
    wait_registered(coord_p, ["py-local", "py-sidecar"])
    common = dict(coordinator=None, rank=0, world_size=1, node="n1", timeout=120,
                  on_error="skip", seed=args.seed, log_level="warn")
    lv = datahelix.DataLoader(video_dir, batch_size=VIDEO_BATCH,
                              **dict(common, coordinator=ep_video))
    loaders.append(lv)
    ds = memsoak_data.Frames()
    lp = datahelix.DataLoader(dataset=ds, batch_size=PY_BATCH,
                              **dict(common, coordinator=ep_py))
    loaders.append(lp)
    py_failing = {i for i in range(len(ds)) if i % memsoak_data.FAIL_EVERY == 5}
    print(f"memsoak: set up in {time.monotonic() - t0:.1f} s (work {work}); "
          f"{len(lv)} video batches of {VIDEO_BATCH} and {len(lp)} Python-dataset "
          f"batches of {PY_BATCH} an epoch; each cell: RSS/PSS MiB after the epoch",
          flush=True)
    tracked.update({p.name: p.p.pid for p in procs})
    header = None
    run_start = time.monotonic()
    epoch = 0
    while epoch < args.min_epochs or time.monotonic() - run_start < args.seconds:
        epoch += 1
        e0 = time.monotonic()
        its = {"video": iter(lv), "py": iter(lp)}
        got = {"video": 0, "py": 0}
        errors = {"video": set(), "py": set()}
        while its:
            for kind in list(its):
                try:
                    b = next(its[kind])
                except StopIteration:
                    del its[kind]
                    continue
                got[kind] += 1
                touch(b)
                for sid, err in zip(b["sample_ids"], b["errors"]):
                    if err:
                        errors[kind].add(sid)
                del b
        if got["video"] != len(lv) or got["py"] != len(lp):
            failures.append(f"epoch {epoch}: {got} batches, not video {len(lv)} / "
                            f"py {len(lp)}")
        if errors["video"] - {bad_clip}:
            failures.append(f"epoch {epoch}: video samples failed that are sound: "
                            f"{sorted(errors['video'] - {bad_clip})}")
        wrong = {e for e in errors["py"] if int(e) not in py_failing}
        if wrong:
            failures.append(f"epoch {epoch}: Python samples failed that are sound: "
                            f"{sorted(wrong)}")
        gc.collect()
        trim()
        for s in servers:  # the DataServers' children: their Python worker processes
            for k, pid in enumerate(children(s.p.pid)):
                name = f"{s.name}/w{k}"
                if name in tracked and tracked[name] != pid:
                    failures.append(f"epoch {epoch}: {name} is a new process (pid "
                                    f"{tracked[name]} -> {pid})")
                tracked[name] = pid
        row = {}
        for name, pid in tracked.items():
            m = memory(pid)
            if m is None:
                failures.append(f"epoch {epoch}: {name} (pid {pid}) is gone")
                continue
            samples.add(name, epoch, m)
            row[name] = m
        if header is None:
            header = list(tracked)
            print("epoch     s  " + "  ".join(f"{n:>15}" for n in header), flush=True)
            print("              " + "  ".join(f"{'pid ' + str(tracked[n]):>15}"
                                               for n in header), flush=True)
        print(f"{epoch:5d} {time.monotonic() - e0:5.1f}  " +
              "  ".join(f"{mib(row[n]['rss']) + '/' + mib(row[n]['pss']):>15}"
                        if n in row else f"{'?':>15}" for n in header), flush=True)
        if failures:
            break


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40,
                    help="run epochs until this much time has passed (at least --min-epochs)")
    ap.add_argument("--min-epochs", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2,
                    help="epochs left out of the check: growth is measured from the end of "
                         "this epoch to the end of the last")
    ap.add_argument("--bound-mib", type=float, default=16.0,
                    help="the most private RSS (VmRSS less RssShmem) a process may gain "
                         "after the warm-up (the floors of the first and the last epochs)")
    ap.add_argument("--clips", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep", action="store_true",
                    help="keep the work folder (data set, logs) after a run that passed; "
                         "one that failed keeps it always")
    args = ap.parse_args()
    if args.min_epochs < args.warmup + 6:
        ap.error("--min-epochs must be at least --warmup + 6 (two windows of 3 epochs)")
    pypath = os.environ.get("DH_PYTHON_PATH") or os.path.join(ROOT, "build", "python")
    sys.path.insert(0, pypath)
    import datahelix
    import memsoak_data
    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="datahelix-memsoak-")
    video_dir, bad_clip = make_video_set(work, args.clips, args.seed)
    pipeline = os.path.join(work, "video.json")
    with open(pipeline, "w") as f:
        json.dump(VIDEO_SPEC, f)
    # the sidecar's worker processes run this interpreter and import memsoak_data by name
    os.environ["DH_PYTHON_EXE"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [HERE, pypath] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    ep_video, ep_py = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    coord_v = Proc("coord-video", [CLI, "coordinator", "--listen", ep_video], work)
    coord_p = Proc("coord-py", [CLI, "coordinator", "--listen", ep_py], work)

    def server(name, endpoint, role, node, workers, extra):
        return Proc(name, [CLI, "server", "--coordinator", endpoint, "--role", role, "--node",
                           node, "--workers", str(workers), "--name", name, "--arena-mb",
                           str(ARENA_MB)]
                    + extra, work)

    servers = [server("video-local", ep_video, "local", "n1", 1, ["--pipeline", pipeline]),
               server("video-sidecar", ep_video, "remote", "n2", 1, ["--pipeline", pipeline]),
               server("py-local", ep_py, "local", "n1", 0, []),
               server("py-sidecar", ep_py, "remote", "n2", 2,
                      ["--dataset", "memsoak_data:make"])]
    procs = [coord_v] + servers[:2] + [coord_p] + servers[2:]
    failures = []
    loaders = []
    tracked = {"trainer": os.getpid()}
    samples = Record()  # every process's memory per epoch (compact: the trainer is measured)
    try:
        run(args, datahelix, memsoak_data, procs, servers, loaders, tracked, samples, failures,
            work, video_dir, bad_clip, ep_video, ep_py, t0)
    except Exception as e:  # a hang or an error: recorded with what was measured so far
        failures.append(f"after epoch {samples.epochs('trainer')}: "
                        f"{type(e).__name__}: {e}")
    finally:
        for dl in loaders:
            dl.close()
        for p in procs:
            if p.p and p.p.poll() is None:
                p.p.send_signal(signal.SIGTERM)
        for p in procs:
            if p.p is None:
                continue
            try:
                rc = p.p.wait(timeout=30)
                if rc != 0:
                    failures.append(f"{p.name}: exit {rc} after SIGTERM")
            except subprocess.TimeoutExpired:
                p.kill9()
                failures.append(f"{p.name}: did not stop on SIGTERM")
    samples = samples.rows()  # name -> [(epoch, mem dict)]
    epoch = max((e for rows in samples.values() for e, _ in rows), default=0)
    left = [n for n, pid in tracked.items() if n != "trainer" and memory(pid) is not None]
    if left:
        failures.append(f"processes left: {left}")
    # the check, per process: the floor of its private RSS (VmRSS less RssShmem, the
    # arenas' shared pages) over the last epochs against the floor over the first epochs
    # after the warm-up; and its shared pages within the arenas it can map
    growth = {}
    window = max(3, (epoch - args.warmup) // 10)
    for name, rows in samples.items():
        by_epoch = dict(rows)
        first = [by_epoch[e] for e in range(args.warmup + 1, args.warmup + 1 + window)
                 if e in by_epoch]
        last = [by_epoch[e] for e in range(epoch - window + 1, epoch + 1) if e in by_epoch]
        if not first or not last or args.warmup not in by_epoch or epoch not in by_epoch:
            continue
        base, end = by_epoch[args.warmup], by_epoch[epoch]
        floor0 = min(m["rss"] - m["shmem"] for m in first)
        floor1 = min(m["rss"] - m["shmem"] for m in last)
        g = (floor1 - floor0) / 1024
        growth[name] = {"private_floor_mib": round(g, 1),
                        "rss_mib": round((end["rss"] - base["rss"]) / 1024, 1),
                        "anon_mib": round((end["anon"] - base["anon"]) / 1024, 1),
                        "shmem_mib": round((end["shmem"] - base["shmem"]) / 1024, 1),
                        "pss_mib": None if base["pss"] is None or end["pss"] is None
                        else round((end["pss"] - base["pss"]) / 1024, 1)}
        if g >= args.bound_mib:
            failures.append(
                f"{name} (pid {tracked[name]}): private RSS grew {g:.1f} MiB (floor of "
                f"epochs {args.warmup + 1}-{args.warmup + window}: {mib(floor0)} MiB, of "
                f"epochs {epoch - window + 1}-{epoch}: {mib(floor1)} MiB; bound "
                f"{args.bound_mib:g} MiB); RSS at epoch {args.warmup} {mib(base['rss'])}, "
                f"at epoch {epoch} {mib(end['rss'])} MiB (anon {mib(base['anon'])} -> "
                f"{mib(end['anon'])})")
        top = max(m["shmem"] for _, m in rows) / 1024
        if top > SHMEM_BOUND_MIB:
            failures.append(f"{name} (pid {tracked[name]}): {top:.1f} MiB of shared pages "
                            f"(RssShmem), more than the {SHMEM_BOUND_MIB} MiB of the two "
                            f"arenas and a scratch buffer")
    mid = max(args.warmup, (epoch + 1) // 2)
    summary = {name: {f"epoch {e}": mib(dict(rows).get(e, {}).get("rss"))
                      for e in sorted({1, args.warmup, mid, epoch})} for name, rows in
               samples.items()}
    print(f"memsoak: {epoch} epochs in {time.monotonic() - t0:.0f} s; growth (MiB) of the "
          f"private RSS floor (epochs {args.warmup + 1}-{args.warmup + window} against "
          f"{epoch - window + 1}-{epoch}; bound {args.bound_mib:g}), and from epoch "
          f"{args.warmup} to {epoch}:", flush=True)
    for name, g in growth.items():
        print(f"  {name:>15} (pid {tracked[name]}): private floor "
              f"{g['private_floor_mib']:+.1f}; RSS {g['rss_mib']:+.1f}, anon "
              f"{g['anon_mib']:+.1f}, shmem {g['shmem_mib']:+.1f}, PSS "
              f"{'-' if g['pss_mib'] is None else format(g['pss_mib'], '+.1f')}", flush=True)
    report = {"seconds": args.seconds, "epochs": epoch, "warmup": args.warmup,
              "bound_mib": args.bound_mib, "elapsed_s": round(time.monotonic() - t0, 1),
              "window": window, "pids": tracked, "growth": growth, "summary": summary, "failures": failures,
              "samples": {n: [[e, m["rss"], m["pss"], m["anon"], m["shmem"]] for e, m in rows]
                          for n, rows in samples.items()},
              "columns": ["epoch", "rss_kib", "pss_kib", "anon_kib", "shmem_kib"],
              "work": work}
    print(json.dumps({k: report[k] for k in ("epochs", "elapsed_s", "growth", "failures")},
                     indent=1), flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if not failures and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
