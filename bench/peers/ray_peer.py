"""ray: a shared pool of Ray actors decoding with PyAV, feeding every rank.

The launcher starts one local Ray instance, ray.init(num_cpus=workers,
include_dashboard=False), and `workers` decode actors (num_cpus=1 each, named, so the whole
CPU budget is theirs). Each rank is a Ray driver of that instance (ray.init(address=...)):
it looks the actors up by name and drives them through its own ray.util.ActorPool, keeping
--inflight batches in flight (the same N as every system; --own-defaults: 2 x max(1,
workers // ranks), PyTorch's prefetch rule applied to its share of the pool, as the C
harness's `pool`; ActorPool itself has no default). The pool is shared by all ranks: the
actors serve the ranks' requests in the order they arrive.

This is how a training job uses Ray as its input pipeline without Ray Train: the trainer
processes are launched by the job (here, by this harness; in practice by torchrun), join
the cluster as drivers and pull batches from long-lived decode actors, each batch handed
through the object store. Ray Data's streaming_split does the same with more machinery
(and its own scheduler, which on 2 cores costs CPU the decoders need).

Each actor decodes a whole batch (decode.decode_batch: the same PyAV decode and collate as
the torch peer, in --pyav's mode, by default skipping the non-reference frames not
sampled) and returns numpy arrays, with the thread CPU time the decode and collate took
(batch["cpu_s"], time.thread_time); the actor's result is written into the object store.
Each rank fetches its batches on a background prefetch thread, as Ray Data's
iter_torch_batches(prefetch_batches=...) does: in submit order, the thread waits for the
next batch, reads it from the object store (zero-copy, read-only) and copies the frames and
mask into the rank's own memory as torch tensors (the object-store hop), then queues it; the
step takes batches from that queue, so the copy is not charged to the step's compute (it
still costs CPU on the same cores). The depth stays --inflight: the rank submits one task
per batch it takes, so tasks outstanding (with ActorPool's pending ones) + batches fetched
and not yet taken = N. Sample order: DistributedSampler's (the same shards as the torch
peer), epoch after epoch.

--pin: actor i, decode worker i of the system, runs on one CPU of the budget, round robin
(common.worker_cpu, the rule every system follows; all the actor process's threads).

batch_ready: the rank stamps the submit, the actor stamps the end of its collate.
"""
import os
import time

NAME = "ray"
NAMESPACE = "datahelix-peers"


def unavailable():
    try:
        import ray  # noqa: F401
    except ImportError as e:
        return f"cannot import ray: {e} (pip install -r requirements.txt)"
    return None


def cores(cfg):
    return cfg["workers"]


def inflight(cfg):
    n = cfg["inflight"]
    return n if n is not None else 2 * max(1, cfg["workers"] // cfg["ranks"])


class Decoder:
    """The decode actor (created with ray.remote(num_cpus=1)(Decoder))."""

    def __init__(self):
        import decode  # noqa: F401 - fails here, not at the first batch

        os.environ.setdefault("OMP_NUM_THREADS", "1")

    def ready(self, cpus):
        if cpus:
            import common

            common.pin_this_process(cpus)
        return os.getpid()

    def decode(self, items, mode="skip"):
        import decode

        cpu0 = time.thread_time()
        batch = decode.decode_batch(items, mode)
        batch["cpu_s"] = time.thread_time() - cpu0
        batch["ready_t"] = time.time()
        return batch


def _env():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("PYTHONPATH", "")
    if here not in path.split(os.pathsep):
        # the raylet, and so every Ray worker, inherits this: the actors import decode
        os.environ["PYTHONPATH"] = here + (os.pathsep + path if path else "")


def setup(cfg):
    import ray

    _env()
    info = ray.init(num_cpus=cfg["workers"], include_dashboard=False, namespace=NAMESPACE,
                    log_to_driver=cfg["verbose"], configure_logging=True,
                    logging_level="WARNING")
    actor_cls = ray.remote(num_cpus=1)(Decoder)
    names = [f"decoder-{i}" for i in range(cfg["workers"])]
    actors = [actor_cls.options(name=n).remote() for n in names]
    import common

    ray.get([a.ready.remote(common.worker_cpu(cfg, i)) for i, a in enumerate(actors)],
            timeout=cfg["timeout_s"])
    # the launcher holds the handles (the actors live while it does); the ranks get names
    _ACTORS[:] = actors
    return {"address": info.address_info["address"], "names": names}


_ACTORS = []


def teardown(context):
    import ray

    for a in _ACTORS:
        ray.kill(a)
    _ACTORS.clear()
    ray.shutdown()


def _batches(cfg, rank):
    """The sample indices of this rank's batches: DistributedSampler's shards, epoch after
    epoch, cut into batches of --batch."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(len(cfg["samples"])), num_replicas=cfg["ranks"],
                                 rank=rank, shuffle=True, seed=cfg["seed"])
    epoch, current = 0, []
    while True:
        sampler.set_epoch(epoch)
        for i in sampler:
            current.append(i)
            if len(current) == cfg["batch"]:
                yield current
                current = []
        epoch += 1


class _Loader:
    """ActorPool submissions on the rank's thread (one per batch taken, the depth), fetch and
    copy on a prefetch thread: every pool operation under one lock, the wait for the next
    result outside it (ray.wait on that result's ref, which the pool's submit function
    records in submit order, the order get_next returns them in)."""

    def __init__(self, cfg, context, rank):
        import collections
        import queue
        import threading

        import ray
        from ray.util import ActorPool

        _env()
        ray.init(address=context["address"], namespace=NAMESPACE, log_to_driver=False,
                 configure_logging=True, logging_level="WARNING")
        self.pool = ActorPool([ray.get_actor(n) for n in context["names"]])
        self.samples = cfg["samples"]
        self.mode = cfg.get("pyav", "skip")
        self.order = _batches(cfg, rank)
        self.submitted = []  # submit times, in order (ActorPool.get_next is ordered)
        self.refs = collections.deque()  # the refs submitted to an actor, in task order
        self.lock = threading.Condition()
        self.ready = queue.Queue()  # fetched, copied batches (or an exception)
        self.stopped = False
        with self.lock:
            for _ in range(inflight(cfg)):
                self._submit()
        self.thread = threading.Thread(target=self._prefetch, name="peers-ray-prefetch",
                                       daemon=True)
        self.thread.start()

    def _task(self, actor, items):
        ref = actor.decode.remote(items, self.mode)
        self.refs.append(ref)  # called under self.lock (submit, or get_next's pending)
        self.lock.notify_all()
        return ref

    def _submit(self):
        items = [self.samples[i] for i in next(self.order)]
        self.submitted.append(time.time())
        self.pool.submit(self._task, items)

    def _prefetch(self):
        import ray
        import torch

        try:
            while True:
                with self.lock:
                    while not self.refs and not self.stopped:
                        self.lock.wait()
                    if self.stopped:
                        return
                    head = self.refs[0]
                while not ray.wait([head], timeout=1.0)[0]:
                    if self.stopped:
                        return
                with self.lock:
                    batch = self.pool.get_next()  # head's result: ready, no wait
                    self.refs.popleft()
                    batch["requested_t"] = self.submitted.pop(0)
                # the object-store hop: the arrays are read-only views of the store; the
                # trainer's own tensors are copies (made here, off the step)
                batch["frames"] = torch.from_numpy(batch["frames"].copy())
                batch["mask"] = torch.from_numpy(batch["mask"].copy())
                batch["tokens"] = batch["tokens"].copy()  # the store's object is then free
                self.ready.put(batch)
        except BaseException as e:  # noqa: BLE001 - raised on the rank's thread
            if not self.stopped:
                self.ready.put(e)

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.ready.get()
        if isinstance(batch, BaseException):
            raise batch
        with self.lock:
            self._submit()
        return batch

    def close(self):
        with self.lock:
            self.stopped = True
            self.lock.notify_all()
        self.thread.join(timeout=5)


def open_loader(cfg, context, rank):
    return _Loader(cfg, context, rank)


def batch_info(cfg, batch):
    ids = batch["sample_ids"]
    return (ids, [int(t) for t in batch["tokens"]], batch["ready_t"] - batch["requested_t"],
            batch["cpu_s"])


def consume(batch):
    pass  # copied out of the object store on the prefetch thread (_Loader._prefetch)


def close_loader(loader):
    import ray

    loader.close()
    ray.shutdown()
