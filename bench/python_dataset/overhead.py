"""The Python-dataset overhead: datahelix.DataLoader(dataset=...) against
torch.utils.data.DataLoader over the same trivial map-style dataset (each sample a ready
1 MiB uint8 array, flat or with --rows 1024 x 1024, so the loaders' own costs are what is measured), the same batch size and
the same number of worker processes (docs/benchmarks.md, "Python-dataset overhead").

    python bench/python_dataset/overhead.py --workers 2 --batch 16 --batches 60 --runs 3

Each run times each loader from its first batch to its last (the first batch, which pays
for starting the worker processes, is excluded) and reports samples/s; the runs alternate
the two loaders, and the result is the median over runs of each, and their ratio. Both
loaders yield torch tensors; the loop only holds each batch until the next arrives, as a
training loop that finished its step would.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "build", "python"))
import datahelix  # noqa: E402
from trivial import Trivial  # noqa: E402  (importable by name in the worker processes)


def time_loader(batches, it, key):
    """Seconds from the first batch to the last of `batches`; checks each batch's bytes."""
    first = next(it)
    assert first[key][0].numel() == 1 << 20
    t0 = time.perf_counter()
    n = 0
    for _ in range(batches - 1):
        b = next(it)
        n += b[key].shape[0]
    return n / (time.perf_counter() - t0)


def run_torch(args):
    ds = Trivial(args.samples, args.rows)
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True,
                                     num_workers=args.workers, drop_last=True,
                                     prefetch_factor=args.prefetch, persistent_workers=False)
    return time_loader(args.batches, iter(dl), "x")


def run_datahelix(args):
    ds = Trivial(args.samples, args.rows)
    with datahelix.DataLoader(dataset=ds, batch_size=args.batch, workers=args.workers,
                              prefetch=args.prefetch * args.workers, timeout=120) as dl:
        return time_loader(args.batches, iter(dl), "x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="worker processes, each loader")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=60, help="timed batches + 1, each run")
    ap.add_argument("--prefetch", type=int, default=2,
                    help="batches in flight per worker (torch prefetch_factor; datahelix "
                         "prefetch = this x workers)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rows", action="store_true",
                    help="each sample 1024 x 1024 (default: flat, 1,048,576); datahelix's "
                         "default collate adds a B x leading-dimension mask, so a flat array "
                         "carries twice its bytes")
    ap.add_argument("--json", default=None, help="write the result here too")
    args = ap.parse_args()
    args.samples = args.batch * args.batches
    torch.set_num_threads(1)
    runs = {"torch": [], "datahelix": []}
    for r in range(args.runs):
        for name, fn in (("torch", run_torch), ("datahelix", run_datahelix)):
            sps = fn(args)
            runs[name].append(sps)
            print(f"run {r}: {name:9s} {sps:8.1f} samples/s", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    out = {"config": {"workers": args.workers, "batch": args.batch, "batches": args.batches,
                      "shape": [1024, 1024] if args.rows else [1 << 20],
                      "prefetch": args.prefetch, "sample_bytes": 1 << 20,
                      "cpus": os.cpu_count()},
           "runs": runs, "median_samples_per_s": med,
           "ratio_datahelix_over_torch": med["datahelix"] / med["torch"]}
    print(f"median: torch {med['torch']:.1f}, datahelix {med['datahelix']:.1f} samples/s; "
          f"datahelix / torch = {out['ratio_datahelix_over_torch']:.2f}x "
          f"({args.workers} worker processes each, {os.cpu_count()} CPUs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
