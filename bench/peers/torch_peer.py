"""torch: rank-local torch.utils.data.DataLoader, the way a PyTorch DDP job loads video.

Each rank has its own DataLoader over a map-style Dataset that decodes with PyAV
(decode.py): num_workers = max(1, workers // ranks) worker processes, prefetch_factor 2
(PyTorch's default), batch_size = --batch, DistributedSampler(shuffle=True, seed=--seed),
samples fixed-count per batch. The sampler runs epoch after epoch (set_epoch(e), as a
training script does) in one never-ending iterator, so the loader does not drain at an
epoch boundary of the small benchmark dataset (the C harness's clients do the same).

As `datahelix bench` does for `native` with real decoding, each rank's workers are pinned to
the rank's share of the CPU budget (cores = min(workers, CPUs); rank r on CPUs
[r x cores / R, (r + 1) x cores / R), at least one), as on a node whose loaders cannot
borrow another node's idle cores. With R > workers that is more worker processes than
cores (4 ranks x 1 worker on 2 CPUs), but never more CPUs. --no-pin lets the kernel pool
them instead (and then, with workers < CPUs, they may use more than the budget).

batch_ready: the sampler stamps each index when the DataLoader dispatches it to a worker
(that is when the main process pulls indices from the sampler); the worker stamps the batch
after the collate: ready - request, as the C harness's request sent -> batch ready.
"""
import os
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


def setup(cfg):
    return None


def teardown(context):
    pass


class VideoDataset:
    """Map-style dataset: item i is sample i decoded with PyAV (T x 3 x H x W uint8).

    Accepts an index or (index, request time) from _StampedSampler."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, key):
        import decode

        index, requested = key if isinstance(key, tuple) else (key, None)
        s = self.samples[index]
        return dict(s, frames_data=decode.decode_sample(s["path"], s["frames"], s["height"],
                                                        s["width"]), requested=requested)


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

    batch = decode.collate(samples, alloc=_shared)
    stamps = [s["requested"] for s in samples if s["requested"] is not None]
    batch["requested_t"] = min(stamps) if stamps else None
    batch["ready_t"] = time.time()
    return batch


class _Pin:
    def __init__(self, cpus):
        self.cpus = cpus

    def __call__(self, worker_id):
        import torch

        torch.set_num_threads(1)
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)


def open_loader(cfg, context, rank):
    from torch.utils.data import DataLoader, DistributedSampler

    import common

    dataset = VideoDataset(cfg["samples"])
    sampler = DistributedSampler(dataset, num_replicas=cfg["ranks"], rank=rank, shuffle=True,
                                 seed=cfg["seed"])
    cpus = common.cpu_share(rank, cfg["ranks"], cfg["cores"]) if cfg["pin"] else None
    return DataLoader(dataset, batch_size=cfg["batch"], sampler=_StampedSampler(sampler),
                      num_workers=workers_per_rank(cfg), prefetch_factor=2,
                      collate_fn=collate, worker_init_fn=_Pin(cpus),
                      multiprocessing_context="fork")


def batch_info(cfg, batch):
    ids = batch["sample_ids"]
    ready = (batch["ready_t"] - batch["requested_t"]
             if batch.get("requested_t") is not None else None)
    return len(ids), int(batch["tokens"].sum()), ids, ready


def consume(batch):
    pass  # the tensors are already in this process's shared memory (zero-copy)


def close_loader(loader):
    pass  # the iterator's workers stop when the rank exits
