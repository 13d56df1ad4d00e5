"""torch: rank-local torch.utils.data.DataLoader, the way a PyTorch DDP job loads video.

Each rank has its own DataLoader over a map-style Dataset that decodes with PyAV
(decode.py, in --pyav's mode: by default skipping the non-reference frames not sampled, as
DataHelix does; "plain" decodes every frame): num_workers = max(1, workers // ranks)
worker processes, batch_size = --batch, DistributedSampler(shuffle=True, seed=--seed),
samples fixed-count per batch. The sampler runs epoch after epoch (set_epoch(e), as a
training script does) in one never-ending iterator, so the loader does not drain at an
epoch boundary of the small benchmark dataset (the C harness's clients do the same).

In flight per rank: prefetch_factor x num_workers batches (torch keeps that many
outstanding). --inflight N (the harness default, the same N for every system):
prefetch_factor = ceil(N / num_workers); --own-defaults: PyTorch's prefetch_factor 2.

--pin (the rule of common.worker_cpu, the same for every system): rank r's worker w, decode
worker r x num_workers + w of the system, runs on one CPU of the budget, round robin (all
the worker process's threads). With R > workers that is more worker processes than cores
(4 ranks x 1 worker on 2 CPUs), but never more CPUs. --no-pin: the kernel places them.

CPU: each sample's decode and each batch's collate are timed with the worker's thread CPU
clock (time.thread_time), and the batch carries the sum (batch["cpu_s"]).

batch_ready: the sampler stamps each index when the DataLoader dispatches it to a worker
(that is when the main process pulls indices from the sampler); the worker stamps the batch
after the collate: ready - request, as the C harness's request sent -> batch ready.
"""
import time

NAME = "torch"


def unavailable():
    try:
        import torch.utils.data  # noqa: F401
    except ImportError as e:
        return f"cannot import torch: {e}"
    return None


def workers_per_rank(cfg):
    return max(1, cfg["workers"] // cfg["ranks"])


def cores(cfg):
    return workers_per_rank(cfg) * cfg["ranks"]


def prefetch_factor(cfg):
    n = cfg["inflight"]
    if n is None:
        return 2  # PyTorch's default
    w = workers_per_rank(cfg)
    return max(1, (n + w - 1) // w)


def inflight(cfg):
    return prefetch_factor(cfg) * workers_per_rank(cfg)


def setup(cfg):
    return None


def teardown(context):
    pass


class VideoDataset:
    """Map-style dataset: item i is sample i decoded with PyAV (T x 3 x H x W uint8).

    Accepts an index or (index, request time) from _StampedSampler."""

    def __init__(self, samples, mode="skip"):
        self.samples = samples
        self.mode = mode  # decode.MODES: --pyav

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, key):
        import decode

        index, requested = key if isinstance(key, tuple) else (key, None)
        s = self.samples[index]
        cpu0 = time.thread_time()
        data = decode.decode_sample(s["path"], s["frames"], s["height"], s["width"],
                                    self.mode)
        return dict(s, frames_data=data, requested=requested,
                    cpu_s=time.thread_time() - cpu0)


class _StampedSampler:
    """DistributedSampler, epoch after epoch, each index with the time it was dispatched."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        epoch = 0
        while True:
            self.sampler.set_epoch(epoch)
            for i in self.sampler:
                yield (i, time.time())
            epoch += 1


def _shared(shape, dtype):
    """A tensor in shared memory, as torch's default_collate allocates in a worker."""
    import numpy as np
    import torch

    tdtype = {np.dtype(np.uint8): torch.uint8, np.dtype(np.bool_): torch.bool,
              np.dtype(np.int64): torch.int64}[np.dtype(dtype)]
    elem = torch.empty(0, dtype=tdtype)
    numel = 1
    for d in shape:
        numel *= d
    if torch.utils.data.get_worker_info() is not None:
        out = elem.new(elem._typed_storage()._new_shared(numel)).view(*shape)
    else:
        out = torch.empty(shape, dtype=tdtype)
    return out, out.numpy()


def collate(samples):
    import decode

    cpu0 = time.thread_time()
    batch = decode.collate(samples, alloc=_shared)
    batch["cpu_s"] = sum(s["cpu_s"] for s in samples) + time.thread_time() - cpu0
    stamps = [s["requested"] for s in samples if s["requested"] is not None]
    batch["requested_t"] = min(stamps) if stamps else None
    batch["ready_t"] = time.time()
    return batch


class _WorkerInit:
    """worker_init_fn: one torch thread; with --pin, the worker onto its CPU."""

    def __init__(self, cfg, rank):
        import common

        w = workers_per_rank(cfg)
        self.cpus = [common.worker_cpu(cfg, rank * w + i) for i in range(w)]

    def __call__(self, worker_id):
        import torch

        import common

        torch.set_num_threads(1)
        if self.cpus[worker_id]:
            common.pin_this_process(self.cpus[worker_id])


def open_loader(cfg, context, rank):
    from torch.utils.data import DataLoader, DistributedSampler

    dataset = VideoDataset(cfg["samples"], cfg.get("pyav", "skip"))
    sampler = DistributedSampler(dataset, num_replicas=cfg["ranks"], rank=rank, shuffle=True,
                                 seed=cfg["seed"])
    return DataLoader(dataset, batch_size=cfg["batch"], sampler=_StampedSampler(sampler),
                      num_workers=workers_per_rank(cfg), prefetch_factor=prefetch_factor(cfg),
                      collate_fn=collate, worker_init_fn=_WorkerInit(cfg, rank),
                      multiprocessing_context="fork")


def batch_info(cfg, batch):
    ids = batch["sample_ids"]
    ready = (batch["ready_t"] - batch["requested_t"]
             if batch.get("requested_t") is not None else None)
    return ids, [int(t) for t in batch["tokens"]], ready, batch["cpu_s"]


def consume(batch):
    pass  # the tensors are already in this process's shared memory (zero-copy)


def close_loader(loader):
    pass  # the iterator's workers stop when the rank exits
