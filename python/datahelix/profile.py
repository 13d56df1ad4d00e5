"""Profiles a Python map-style dataset for the tools that read profile sets (`datahelix
bench`, `consume`, `plan`; docs/datasets.md, "Your own Dataset"):

    python -m datahelix.profile MODULE:FACTORY -o DIR [--learn] [--workers N]

imports MODULE, calls FACTORY() for the dataset and writes DIR/profiles.jsonl (one row per
index, the costs from ``dataset.estimate_cost(i)``; with --learn, measured instead over one
pass through a DataLoader with that many worker processes, as a loader's ``costs=`` learns
them: DIR/costs.jsonl) and DIR/pipeline.json (the python pipeline that runs MODULE:FACTORY
in DataServer worker processes). `datahelix bench --python-dataset` runs it.
"""
import argparse
import importlib
import json
import os
import sys
import time
from typing import Any

from .loader import DataLoader
from .sources import _dataset_source, _worker_path


class WithoutEstimates:
    """The dataset with its estimate_cost hidden (what --learn measures against)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]

    def __getattr__(self, name: str) -> Any:  # sample_spec, load_into, count_tokens
        if name in ("dataset", "estimate_cost") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def load(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise SystemExit(f"datahelix.profile: {spec!r} is not MODULE:FACTORY")
    obj = getattr(importlib.import_module(module), attr)
    return obj() if callable(obj) and not hasattr(obj, "__getitem__") else obj


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m datahelix.profile",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", help="MODULE:FACTORY")
    ap.add_argument("-o", "--out", required=True, help="output folder")
    ap.add_argument("--learn", action="store_true",
                    help="measure the costs over one pass instead of estimate_cost")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    sys.path.insert(0, os.getcwd())
    dataset = load(args.dataset)
    os.makedirs(args.out, exist_ok=True)
    costs = None
    if args.learn:
        costs = os.path.join(args.out, "costs.jsonl")
        if os.path.exists(costs):
            os.remove(costs)
        t0 = time.monotonic()
        with DataLoader(dataset=WithoutEstimates(dataset), batch_size=args.batch,
                        workers=args.workers, costs=costs, timeout=600) as dl:
            for _ in dl:
                pass
        print(f"learned the costs of {len(dataset)} samples over one pass in "
              f"{time.monotonic() - t0:.1f} s: {costs}", flush=True)
        dataset = WithoutEstimates(dataset)
    _dataset_source(dataset, args.out, seed=0, costs=costs)
    os.remove(os.path.join(args.out, "dataset.pkl"))
    with open(os.path.join(args.out, "pipeline.json"), "w") as f:
        json.dump({"type": "python", "dataset": args.dataset, "python": sys.executable,
                   "path": _worker_path()}, f)
    print(f"wrote {os.path.join(args.out, 'profiles.jsonl')} ({len(dataset)} rows, costs "
          f"{'learned' if args.learn else 'from estimate_cost'}) and "
          f"{os.path.join(args.out, 'pipeline.json')}")


if __name__ == "__main__":
    main()
