"""datahelix: the `datahelix` Python extension's DataLoader, fed by one local cluster.

The launcher starts a coordinator (datahelix._C.Coordinator on tcp://127.0.0.1:PORT) and
then datahelix.start_cluster(DIR, workers=W, coordinator=ENDPOINT): a local DataServer of
W decode worker threads in the launcher process (the same CPU budget as the peers). Each
rank opens datahelix.DataLoader(DIR, batch_size=B, shuffle=True, seed=S,
coordinator=ENDPOINT, rank=r, world_size=R, prefetch=N) and iterates it: N = --inflight,
the same batches in flight per rank as every system (--own-defaults: the loader's own
default, 4). A batch is a dict {"frames": B x T x 3 x H x W uint8, "mask": B x T,
"tokens": int64 B, "sample_ids", "captions", "info"}; its size may vary (the token packing
plan), so the step's compute uses the batch's own samples. Each sample's tokens: the
server's decoded visual tokens (batch["tokens"], dh_tokens_visual of the decoded clip) plus
its caption tokens (the profile's text_len), common.sample_tokens, as the peers count.
batch_ready_p95_s comes from info's requested_ns -> ready_ns (the C harness's request sent
-> batch ready), when there.

The DataServer's worker threads: the launcher names its own thread "dh-peers-ds" while it
starts the DataServer, so the threads the DataServer creates inherit that name (ZeroMQ's
rename themselves ZMQbg/..., and no other thread of the launcher, Ray's after a Ray run,
can carry it); in creation (TID) order they are its W workers, then its loop thread
(dh_dataserver_new creates the workers, dh_dataserver_start the loop). setup() checks that
count. --pin: worker thread i, decode worker i of the system, runs on one CPU of the budget,
round robin (common.worker_cpu, os.sched_setaffinity on its TID). CPU: the batch does not
carry its decode CPU, so cpu_probe() reads those threads' CPU clocks
(/proc/self/task/TID/schedstat) and the server's decoded-sample counter (stats()["samples"]);
common.py turns the window's CPU per decoded sample into cpu_work_s.

The loader runs with epochs=0 (no end) and a huge max_steps, so one pass runs epoch after
epoch with prefetch crossing the boundaries, as the peers' samplers do.

`datahelix` is imported from the environment, else from build/python (what `make build`
makes); if that fails too, the system is skipped and the report says why.
"""
import os
import sys
import threading
import time

NAME = "datahelix"
_BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "build", "python")


def unavailable():
    try:
        import datahelix
    except ImportError as first:
        if not os.path.exists(os.path.join(_BUILD, "datahelix", "__init__.py")):
            return (f"cannot import datahelix: {first} (build the Python extension with "
                    f"`make build`, or put it on PYTHONPATH)")
        sys.path.insert(0, _BUILD)  # the ranks inherit sys.path (spawn)
        try:
            import datahelix
        except ImportError as e:
            return f"cannot import datahelix from {_BUILD}: {e}"
    missing = [n for n in ("DataLoader", "start_cluster") if not hasattr(datahelix, n)]
    if missing:
        return f"the datahelix module has no {', '.join(missing)}"
    return None


DEFAULT_PREFETCH = 4  # datahelix.DataLoader(prefetch=4)


def cores(cfg):
    return cfg["workers"]


def inflight(cfg):
    if cfg.get("prefetch_max"):
        return cfg["prefetch_max"]
    return cfg["inflight"] if cfg["inflight"] is not None else DEFAULT_PREFETCH


_CLUSTER = []


_MARK = "dh-peers-ds"  # 15 characters at most (the kernel's comm)


def _threads():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = f.read().strip()
        except OSError:
            pass  # a thread that ended meanwhile
    return out


def _set_own_name(name):
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write(name)


def setup(cfg):
    import datahelix

    import common

    coord = datahelix._C.Coordinator(f"tcp://127.0.0.1:{common.free_port()}",
                                     policy="deadline")
    # A new thread inherits its creator's name: the threads the DataServer creates from
    # this one carry the mark (ZeroMQ's rename themselves ZMQbg/...), and no other thread of
    # the launcher (Ray's, after a Ray run) can.
    own = _threads()[threading.get_native_id()]
    before = set(_threads())
    _set_own_name(_MARK)
    try:
        cluster = datahelix.start_cluster(cfg["dataset"], workers=cfg["workers"],
                                          coordinator=coord.endpoint)
    except BaseException:
        coord.close()
        raise
    finally:
        _set_own_name(own)
    _CLUSTER.append((cluster, coord))
    # ZeroMQ's threads rename themselves once they run: wait for that (5 s at most)
    for _ in range(100):
        new = sorted(t for t, name in _threads().items() if t not in before and name == _MARK)
        if len(new) == cfg["workers"] + 1:
            break
        time.sleep(0.05)
    if len(new) != cfg["workers"] + 1:
        raise common.BenchError(
            f"datahelix: cannot tell the DataServer's worker threads: {len(new)} new threads, "
            f"expected {cfg['workers']} workers + 1 loop")
    workers = new[:cfg["workers"]]
    for i, tid in enumerate(workers):
        cpus = common.worker_cpu(cfg, i)
        if cpus:
            os.sched_setaffinity(tid, cpus)
    return {"endpoint": coord.endpoint, "worker_tids": workers}


def cpu_probe(context):
    import common

    server = _CLUSTER[-1][0].server
    tids = context["worker_tids"]

    def probe():
        return sum(common.thread_cpu_s(t) for t in tids), server.stats()["samples"]

    return probe


def teardown(context):
    while _CLUSTER:
        cluster, coord = _CLUSTER.pop()
        cluster.close()
        coord.close()


class _Epochs:
    """The loader, pass after pass (each pass is many epochs back to back: epochs=0 with
    max_steps, so prefetch runs on across epoch boundaries as the peers' samplers do)."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        epoch = 0
        while True:
            self.loader.set_epoch(epoch)
            got = False
            for batch in self.loader:
                got = True
                yield batch
            if not got:
                raise RuntimeError(f"datahelix.DataLoader: epoch {epoch} yielded no batch")
            epoch += 1

    def close(self):
        self.loader.close()


def open_loader(cfg, context, rank):
    import datahelix

    extra = {"prefetch": cfg["inflight"]} if cfg["inflight"] is not None else {}
    if cfg.get("prefetch_max"):
        extra["prefetch_max"] = cfg["prefetch_max"]
    if cfg.get("plan"):
        extra["plan"] = cfg["plan"]
    return _Epochs(datahelix.DataLoader(cfg["dataset"], batch_size=cfg["batch"], shuffle=True,
                                        seed=cfg["seed"], coordinator=context["endpoint"],
                                        rank=rank, world_size=cfg["ranks"], epochs=0,
                                        max_steps=1 << 40, **extra))


def batch_info(cfg, batch):
    import common

    ids = list(batch["sample_ids"])
    info = batch.get("info") or {}
    req, ready = info.get("requested_ns") or 0, info.get("ready_ns") or 0
    ready_s = (ready - req) / 1e9 if req and ready > req else None
    samples = cfg["sample_of"]
    tokens = [common.sample_tokens(int(t), samples[i]) for i, t in zip(ids, batch["tokens"])]
    return ids, tokens, ready_s, None


def consume(batch):
    pass  # zero-copy delivery


def close_loader(loader):
    close = getattr(loader, "close", None)
    if close:
        close()
