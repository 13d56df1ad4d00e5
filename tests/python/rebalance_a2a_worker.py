"""One rank of test_rebalance.py's all_to_all test (a process of its own: a torch.distributed
gloo group needs one per rank). Its node is its own ("node-<rank>"), so every move crosses
nodes; rebalance["process_group"] carries them in one all_to_all per round.

    rebalance_a2a_worker.py DATA COORDINATOR PORT RANK OUT.json

sort_fn swaps every part between the two ranks; feature_fn gives each part its sample's row
and pixel sum, which sort_fn (run on both ranks with every part's features) records, so a
rank can check that the pixels it yields are those its sample had where it was decoded.
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import datahelix


def main():
    src, endpoint, port, rank, out = sys.argv[1:6]
    rank = int(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=120))
    group = dist.new_group([0, 1], backend="gloo", timeout=datetime.timedelta(seconds=60))
    with open(os.path.join(src, "profiles.jsonl")) as f:
        order = [json.loads(line)["id"] for line in f if line.strip()]
    row = {sid: i for i, sid in enumerate(order)}
    pixels = {}  # row -> pixel sum where the sample was decoded (every part of every round)

    def feature_fn(tensors, samples):
        (s,) = samples
        return [row[s["id"]], float(tensors["frames"].to(torch.float64).sum())]

    def swap_all(rnd, args):
        for p in rnd["parts"]:
            pixels[int(p["features"][0])] = p["features"][1]
        return [1 - p["rank"] for p in rnd["parts"]]

    loader = datahelix.DataLoader(
        src, batch_size=2, seed=3, prefetch=2, coordinator=endpoint, rank=rank, world_size=2,
        node=f"node-{rank}",
        rebalance={"groups": [[0, 1]], "buffer_size": 4, "late_ms": 30000,
                   "feature_fn": feature_fn, "n_features": 2, "sort_fn": swap_all,
                   "process_group": group})
    got, wrong = {}, []
    for step, batch in enumerate(loader):
        got[step] = batch["sample_ids"]
        for i, sid in enumerate(batch["sample_ids"]):
            have = float(batch["frames"][i].to(torch.float64).sum())
            if pixels.get(row[sid]) != have:
                wrong.append([step, sid, pixels.get(row[sid]), have])
    with open(out, "w") as f:
        json.dump({"got": got, "wrong": wrong, "stats": loader.stats()}, f)
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
