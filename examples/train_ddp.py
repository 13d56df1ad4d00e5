"""A small video classifier trained with DDP on the CPU, fed by datahelix.DataLoader.

    torchrun --nproc_per_node 2 examples/train_ddp.py --data DIR

Each rank's DataLoader finds the job's data plane from torchrun's environment: rank 0
starts the coordinator, local rank 0 the node's DataServer, every rank a client. The label
is what the clip shows: whether its first moving shape is a square or a disc (from the
caption the generator wrote). The loss falls over the epochs (12 by default).
"""
import argparse
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
import datahelix  # noqa: E402


class VideoNet(nn.Module):
    """Frames resized to 8 x 64 x 64, three 3-D convolutions, a linear head."""

    def __init__(self, classes=2):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv3d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool3d((1, 2, 2)),
            nn.Conv3d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool3d(2),
            nn.Conv3d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d((2, 4, 4)))
        self.head = nn.Linear(64 * 2 * 4 * 4, classes)

    def forward(self, x):
        return self.head(self.convs(x).flatten(1))


def prepare(frames, mask):
    """uint8 B x T x 3 x H x W (zero-copy views) -> float B x 3 x 8 x 64 x 64; padded frames
    (mask 0) are left out of the temporal average by resizing only the valid prefix."""
    out = []
    for i in range(frames.shape[0]):
        t = max(1, int(mask[i].sum()))
        clip = frames[i, :t].permute(1, 0, 2, 3).float().div_(255).sub_(0.45).div_(0.25).unsqueeze(0)
        out.append(F.interpolate(clip, size=(8, 64, 64), mode="trilinear", align_corners=False))
    return torch.cat(out)


def label(caption):
    words = caption.split()
    return 1 if "square" in words[:4] else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a synth/probe directory (profiles.jsonl)")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=2, help="samples per rank per step")
    p.add_argument("--max-steps", type=int, default=0, help="steps per epoch (0 = all)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--workers", type=int, default=None, help="decode threads of the DataServer")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(VideoNet())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = datahelix.DataLoader(args.data, batch_size=args.batch, seed=0, prefetch=2,
                                  workers=args.workers, max_steps=args.max_steps,
                                  arena_bytes=256 << 20)
    if rank == 0:
        print(f"{world} ranks, {len(loader)} steps per epoch, batch {args.batch} per rank",
              flush=True)
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        total, steps = torch.zeros(1), 0
        for batch in loader:
            x = prepare(batch["frames"], batch["mask"])
            y = torch.tensor([label(c) for c in batch["captions"]])
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.detach()
            steps += 1
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: mean loss {total.item() / max(1, steps * world):.4f}",
                  flush=True)
    loader.close()
    dist.barrier()  # every rank is done with the node's DataServer before rank 0 leaves
    # DDP's reducer holds the process group and its pending work: free it while the group is
    # alive, so nothing of gloo's is torn down at interpreter exit
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
