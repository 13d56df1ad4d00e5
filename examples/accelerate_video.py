"""A tiny video classifier trained with Hugging Face Accelerate, fed by datahelix.DataLoader,
with checkpoints that resume mid-epoch on the same or another number of processes.

    torchrun --nproc_per_node 2 examples/accelerate_video.py --data DIR --checkpoint CKPT \\
        --save-every 2 --stop-after 4     # or: accelerate launch --multi_gpu --num_processes 2
    torchrun --nproc_per_node 1 examples/accelerate_video.py --data DIR --checkpoint CKPT \\
        --resume --batch 4 --keep global_batch     # later, on 1 process: 1 x 4 = 2 x 2

DIR is a `datahelix synth` + `probe` directory. The label is what the clip shows: whether its
first moving shape is a square or a disc (from the caption the generator wrote). Runs on the
CPU (Accelerator(cpu=True); `accelerate launch` needs --multi_gpu for several processes even
so). accelerator.prepare() hands the loader back as it is (DataHelix already gives each rank
its own batches) and the batches stay on the CPU: the model's input is moved to
accelerator.device here. accelerator.register_for_checkpointing(loader) is the one call that
puts the loader's place in the epoch into save_state / load_state (docs/python.md,
"Training stacks").
"""
import argparse
import gc
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                "python"))
import datahelix  # noqa: E402


class TinyVideoNet(nn.Module):
    """Frames resized to 4 x 32 x 32, two 3-D convolutions, a linear head."""

    def __init__(self, classes=2):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv3d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool3d((1, 2, 2)),
            nn.Conv3d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d((1, 4, 4)))
        self.head = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        return self.head(self.convs(x).flatten(1))


def clips(frames, mask):
    """uint8 B x T x 3 x H x W (zero-copy views) -> float B x 3 x 4 x 32 x 32, resizing each
    clip's valid frames (mask) only."""
    out = []
    for i in range(frames.shape[0]):
        t = max(1, int(mask[i].sum()))
        clip = frames[i, :t].permute(1, 0, 2, 3).float().div_(255).sub_(0.45).div_(0.25)
        out.append(F.interpolate(clip.unsqueeze(0), size=(4, 32, 32), mode="trilinear",
                                 align_corners=False))
    return torch.cat(out)


def labels(captions):
    return torch.tensor([1 if "square" in c.split()[:4] else 0 for c in captions])


def save(accelerator, root, loader):
    """save_state into ROOT/eE_pP (epoch E, P samples of its order consumed), then ROOT/latest
    names it (written last, atomically: a job killed while saving resumes from the one
    before)."""
    state = loader.state_dict()
    path = os.path.join(root, f"e{state['epoch']:03d}_p{state['position']:07d}")
    accelerator.save_state(path)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with open(os.path.join(root, "latest.tmp"), "w") as f:
            f.write(os.path.basename(path))
        os.replace(os.path.join(root, "latest.tmp"), os.path.join(root, "latest"))
    accelerator.print(f"saved {path}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a synth + probe directory (profiles.jsonl)")
    p.add_argument("--epochs", type=int, default=3, help="epochs in all (a resumed run ends "
                   "there too)")
    p.add_argument("--batch", type=int, default=2, help="samples per process per step")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate")
    p.add_argument("--workers", type=int, default=None, help="decode threads of the DataServer")
    p.add_argument("--checkpoint", help="a folder for checkpoints (DIR/eE_pP, DIR/latest)")
    p.add_argument("--save-every", type=int, default=0,
                   help="save a checkpoint every N steps (0: never; needs --checkpoint)")
    p.add_argument("--resume", action="store_true",
                   help="load --checkpoint's latest checkpoint first (any number of processes)")
    p.add_argument("--keep", choices=["global_batch", "rank_batch"],
                   help="on another number of processes, what --resume keeps fixed (the "
                   "loader's elastic_keep; default: what --batch keeps)")
    p.add_argument("--stop-after", type=int, default=0,
                   help="leave after N steps of this run (0: run all epochs), e.g. to try "
                   "--resume")
    args = p.parse_args()
    if (args.save_every or args.resume) and not args.checkpoint:
        p.error("--save-every and --resume need --checkpoint")

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = datahelix.DataLoader(args.data, batch_size=args.batch, seed=0, prefetch=2,
                                  workers=args.workers, arena_bytes=256 << 20,
                                  elastic_keep=args.keep)
    model = TinyVideoNet()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    model, opt, loader = accelerator.prepare(model, opt, loader)  # the loader comes back as is
    accelerator.register_for_checkpointing(loader)
    if args.resume:
        with open(os.path.join(args.checkpoint, "latest")) as f:
            path = os.path.join(args.checkpoint, f.read().strip())
        accelerator.load_state(path)
        state = loader.state_dict()
        accelerator.print(f"resumed from {path}: epoch {state['epoch']}, step {state['step']}"
                          f" ({accelerator.num_processes} processes x batch {args.batch})",
                          flush=True)
    accelerator.print(f"{accelerator.num_processes} processes, {len(loader)} steps per epoch, "
                      f"batch {args.batch} per process", flush=True)
    done = 0
    for epoch in range(loader.state_dict()["epoch"], args.epochs):
        loader.set_epoch(epoch)  # the checkpoint's epoch keeps its place in it
        total, steps = torch.zeros(1, device=accelerator.device), 0
        for batch in loader:
            x = clips(batch["frames"], batch["mask"]).to(accelerator.device)
            y = labels(batch["captions"]).to(accelerator.device)
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            total += loss.detach()
            steps += 1
            done += 1
            if args.save_every and done % args.save_every == 0:
                save(accelerator, args.checkpoint, loader)
            if done == args.stop_after:
                break
        total = accelerator.reduce(total, reduction="sum")
        accelerator.print(f"epoch {epoch}: {steps} steps, mean loss "
                          f"{total.item() / max(1, steps * accelerator.num_processes):.4f}",
                          flush=True)
        if done == args.stop_after:
            accelerator.print(f"stopped after {done} steps", flush=True)
            break
    loader.close()
    accelerator.wait_for_everyone()  # every rank is done with the node's DataServer
    del model, opt
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
