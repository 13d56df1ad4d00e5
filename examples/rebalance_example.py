"""Tier-2 rebalancing with a user feature_fn and sort_fn (docs/rebalancing.md).

    torchrun --nproc_per_node 2 examples/rebalance_example.py --data DIR

Each rank's DataLoader plans its share of every step (tier 1), then, before yielding, the
ranks of the group trade parts of batches already decoded (tier 2): feature_fn measures
each part (here its tokens and mean pixel), sort_fn decides on the gathered measures
(here: in each batch, the heaviest part of the most loaded rank trades places with the
lightest part of the least loaded one, when that lowers the larger of the two). Every rank
runs sort_fn on the same round, so it must be deterministic. At the end the ranks check
together that every sample came exactly once, and rank 0 prints what tier 2 did on each.
"""
import argparse
import os
import sys
from collections import defaultdict

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
import datahelix  # noqa: E402


def feature_fn(tensors, samples):
    """One part's measures: its tokens and its mean pixel. `tensors` are zero-copy torch
    views of the part (valid during this call only); `samples` its samples' metadata."""
    frames = tensors["frames"]
    return [float(sum(s["tokens"] for s in samples)), float(frames.float().mean())]


def sort_fn(round, args):
    """A new rank for every part of the round, or None to keep the assignment. Parts move
    within their batch, in exchange: each rank keeps its number of parts per batch."""
    parts = round["parts"]
    new_rank = [p["rank"] for p in parts]
    by_batch = defaultdict(list)
    for i, p in enumerate(parts):
        by_batch[p["batch"]].append(i)
    moved = False
    for batch in sorted(by_batch):
        load = defaultdict(float)  # the rank's tokens in this batch
        for i in by_batch[batch]:
            load[parts[i]["rank"]] += parts[i]["features"][0]
        heavy = max(sorted(load), key=lambda r: load[r])
        light = min(sorted(load), key=lambda r: load[r])
        if heavy == light:
            continue
        big = max((i for i in by_batch[batch] if parts[i]["rank"] == heavy),
                  key=lambda i: parts[i]["features"][0])
        small = min((i for i in by_batch[batch] if parts[i]["rank"] == light),
                    key=lambda i: parts[i]["features"][0])
        delta = parts[big]["features"][0] - parts[small]["features"][0]
        # after the swap the larger of the two loads is max(heavy - delta, light + delta)
        if max(load[heavy] - delta, load[light] + delta) < load[heavy] * (1 - args["min_gain"]):
            new_rank[big], new_rank[small] = light, heavy
            moved = True
    return new_rank if moved else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a synth/probe directory (profiles.jsonl)")
    p.add_argument("--batch", type=int, default=2, help="samples per rank per step")
    p.add_argument("--workers", type=int, default=None, help="decode threads of the DataServer")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = datahelix.DataLoader(
        args.data, batch_size=args.batch, seed=0, prefetch=2, workers=args.workers,
        arena_bytes=256 << 20,
        rebalance={
            "feature_fn": feature_fn,
            "sort_fn": sort_fn,
            "client_ranks": [list(range(world))],  # one group: every rank
            "buffer_size": 2 * world * args.batch,  # two steps per round
            "args": {"min_gain": 0.05},
        })
    seen, tokens = [], 0
    for batch in loader:
        seen += batch["sample_ids"]
        tokens += int(batch["tokens"].sum())
    stats = loader.stats()
    every = [None] * world
    dist.all_gather_object(every, (seen, tokens, stats))
    if rank == 0:
        ids = [i for rank_ids, _, _ in every for i in rank_ids]
        assert len(ids) == len(set(ids)), "a sample came twice"
        assert len(ids) == len(loader) * args.batch * world, "a sample is missing"
        print(f"{world} ranks: {len(ids)} samples, each exactly once")
        for r, (rank_ids, rank_tokens, s) in enumerate(every):
            print(f"rank {r}: {len(rank_ids)} samples, {rank_tokens} tokens; rebalance rounds "
                  f"{s['rebalance_rounds']}, applied {s['rebalance_applied']}, kept by the "
                  f"gate {s['rebalance_kept_by_gate']}, parts received "
                  f"{s['rebalance_moved_parts']}, callback errors "
                  f"{s['rebalance_callback_errors']}")
    loader.close()
    dist.barrier()  # every rank is done with the node's DataServer before rank 0 leaves
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
