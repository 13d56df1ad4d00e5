"""One rank of tests/netns/test_tier2_curve.py, run in its node's namespace: a DataLoader over
pydatasets.Pattern (images of a known 16-byte pattern) with CURVE keys and tier 2 on, a
sort_fn that swaps every part between the two ranks (one per node), so every part crosses
nodes.

    tier2_rank.py COORDINATOR KEYS RANK OUT.json forward|process_group MASTER_HOST:PORT

forward: cross-node moves go DataServer to DataServer (the default, over CURVE).
process_group: they go in one gloo all_to_all per round, opted in with
allow_unencrypted_exchange=True (plaintext: the test's control).
"""
import datetime
import json
import sys
import warnings

import pydatasets

import datahelix


def swap_all(rnd, args):
    return [1 - p["rank"] for p in rnd["parts"]]


def main():
    endpoint, keys, rank, out, mode, master = sys.argv[1:7]
    rank = int(rank)
    rebalance = {"groups": [[0, 1]], "buffer_size": 4, "late_ms": 30000, "sort_fn": swap_all}
    dist = None
    if mode == "process_group":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=120))
        rebalance["process_group"] = dist.new_group(
            [0, 1], backend="gloo", timeout=datetime.timedelta(seconds=60))
        rebalance["allow_unencrypted_exchange"] = True
    ds = pydatasets.Pattern(n=48)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = datahelix.DataLoader(
            dataset=ds, batch_size=2, seed=3, prefetch=2, coordinator=endpoint, rank=rank,
            world_size=2, node=f"node-{rank}", keys=keys, timeout=120, rebalance=rebalance)
    got, wrong = [], 0
    for batch in loader:
        got.extend(int(i) for i in batch["indices"])
        for row in batch["image"].numpy():
            wrong += row.tobytes() != pydatasets.PATTERN * 256
    with open(out, "w") as f:
        json.dump({"got": got, "wrong": wrong, "stats": loader.stats(),
                   "warnings": [str(w.message) for w in caught]}, f)
    loader.close()
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
