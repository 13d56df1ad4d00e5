"""One rank of bench/netns/two_node.py: a synchronous training loop over datahelix.DataLoader
(its coordinator and DataServers already running), torch.distributed gloo as the barrier.
Each step: next batch (the input wait), sleep a x tokens + b (the emulated accelerator),
all_reduce. Rank 0 writes the measured window's numbers as JSON to --out."""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "build", "python"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--master", required=True, help="tcp://HOST:PORT of the gloo rendezvous")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--plan", default="balanced")
    ap.add_argument("--a", type=float, required=True)
    ap.add_argument("--b", type=float, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threshold", type=float, required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    # gloo finds its interface from the host name, which a namespace resolves to loopback
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    import torch
    import torch.distributed as dist
    import datahelix
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.master, rank=args.rank,
                            world_size=args.world)
    loader = datahelix.DataLoader(args.source, batch_size=args.batch, seed=3, prefetch=4,
                                  coordinator=args.coordinator, rank=args.rank,
                                  world_size=args.world, node=args.node, plan=args.plan,
                                  timeout=120, max_steps=args.warmup + args.steps)
    it = iter(loader)
    one = torch.zeros(1)
    waits, t_start, samples = [], None, 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.all_reduce(one)
            t_start = time.monotonic()
        t0 = time.monotonic()
        batch = next(it)
        wait = time.monotonic() - t0
        tokens = int(batch["tokens"].sum())
        time.sleep(args.a * tokens + args.b)
        dist.all_reduce(one)
        if step >= args.warmup:
            waits.append(wait)
            samples += len(batch["sample_ids"])
        del batch
    elapsed = time.monotonic() - t_start
    everyone = [None] * args.world
    dist.all_gather_object(everyone, {"waits": waits, "samples": samples})
    if args.rank == 0 and args.out:
        all_waits = sorted(w for e in everyone for w in e["waits"])
        total = sum(e["samples"] for e in everyone)
        with open(args.out, "w") as f:
            json.dump({"samples_per_s": total / elapsed, "elapsed_s": elapsed,
                       "miss_rate": sum(w > args.threshold for w in all_waits) / len(all_waits),
                       "wait_p95_s": all_waits[int(0.95 * (len(all_waits) - 1))]}, f)
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
