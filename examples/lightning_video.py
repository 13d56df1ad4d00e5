"""A small video classifier trained with PyTorch Lightning on the CPU, fed by datahelix.DataLoader.

    datahelix synth --out out/demo --count 24 && \\
        datahelix probe out/demo/manifest.jsonl -o out/demo/profiles.jsonl
    python examples/lightning_video.py --data out/demo --devices 2 --ckpt-every 4
    python examples/lightning_video.py --data out/demo --devices 1 --ckpt-path CKPT

The LightningDataModule's train_dataloader() returns the datahelix.DataLoader as it is:
Lightning leaves a loader that is not a torch.utils.data.DataLoader alone (no sampler is
injected, no flag is needed), and the loader takes its rank and world size from the process
group Lightning has made by then. Lightning keeps the loader's state_dict() in every
checkpoint and fit(ckpt_path=...) gives it back, so a run resumed from a checkpoint taken
mid-epoch goes on with the batches that were left. Resuming on another number of devices
keeps the global batch: the per-device batch becomes the saved devices x batch / devices
(docs/python.md, "PyTorch Lightning"). The label is what the clip shows: whether its first
moving shape is a square or a disc (from the caption the generator wrote).
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
import datahelix  # noqa: E402


class VideoClassifier(L.LightningModule):
    """Frames resized to 4 x 32 x 32, two 3-D convolutions, a linear head."""

    def __init__(self, lr=2e-3):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv3d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool3d((1, 2, 2)),
            nn.Conv3d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d((1, 2, 2)),
            nn.Flatten(), nn.Linear(16 * 2 * 2, 2))

    def training_step(self, batch, batch_idx):
        x = clips(batch["frames"], batch["mask"])
        y = torch.tensor([label(c) for c in batch["captions"]])
        loss = F.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True, batch_size=len(y))
        if self.global_rank == 0:
            self.print(f"epoch {self.current_epoch} batch {batch_idx} step {self.global_step}: "
                       f"loss {loss.item():.4f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class VideoData(L.LightningDataModule):
    def __init__(self, data, batch, workers):
        super().__init__()
        self.data, self.batch, self.workers = data, batch, workers

    def train_dataloader(self):
        # Made here, not in __init__: Lightning has started the ranks and their process group.
        return datahelix.DataLoader(self.data, batch_size=self.batch, seed=0, prefetch=2,
                                    workers=self.workers, arena_bytes=256 << 20)


def clips(frames, mask):
    """uint8 B x T x 3 x H x W (zero-copy views) -> float B x 3 x 4 x 32 x 32, from each clip's
    valid frames (mask 1)."""
    out = []
    for i in range(frames.shape[0]):
        t = max(1, int(mask[i].sum()))
        clip = frames[i, :t].permute(1, 0, 2, 3).float().div_(255).sub_(0.45).div_(0.25)
        out.append(F.interpolate(clip.unsqueeze(0), size=(4, 32, 32), mode="trilinear",
                                 align_corners=False))
    return torch.cat(out)


def label(caption):
    return 1 if "square" in caption.split()[:4] else 0


def saved_global_batch(ckpt_path):
    """world_size x batch_size of the loader state in a Lightning checkpoint."""
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    (state,) = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    return state["world_size"] * state["batch_size"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a synth/probe directory (profiles.jsonl)")
    p.add_argument("--devices", type=int, default=1, help="CPU processes (strategy ddp when > 1)")
    p.add_argument("--batch", type=int, default=None,
                   help="samples per device per step (default 2; with --ckpt-path, the saved "
                        "global batch / --devices)")
    p.add_argument("--epochs", type=int, default=2, help="epochs to train")
    p.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps "
                   "(-1: no limit, --epochs decides)")
    p.add_argument("--ckpt-dir", default="lightning_ckpt", help="where checkpoints go")
    p.add_argument("--ckpt-every", type=int, default=0,
                   help="also checkpoint every this many steps, mid-epoch (0: at epoch ends only)")
    p.add_argument("--ckpt-path", default=None,
                   help="resume from this checkpoint (on any number of devices)")
    p.add_argument("--workers", type=int, default=None, help="decode threads of the DataServer")
    args = p.parse_args()

    batch = args.batch
    if batch is None:
        batch = 2
        if args.ckpt_path:  # keep the saved run's global batch (Lightning's step counters)
            g = saved_global_batch(args.ckpt_path)
            if g % args.devices:
                p.error(f"the checkpoint's global batch {g} does not split over "
                        f"{args.devices} devices: give --batch")
            batch = g // args.devices
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ckpt = ModelCheckpoint(dirpath=args.ckpt_dir, save_top_k=-1,
                           every_n_train_steps=args.ckpt_every or None)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices,
                        strategy="ddp" if args.devices > 1 else "auto",
                        max_epochs=args.epochs, max_steps=args.max_steps, callbacks=[ckpt],
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        log_every_n_steps=1)
    trainer.fit(VideoClassifier(), VideoData(args.data, batch, args.workers),
                ckpt_path=args.ckpt_path)
    if trainer.global_rank == 0:
        print(f"done: {trainer.global_step} steps, {args.devices} device(s) x batch {batch}; "
              f"checkpoints in {args.ckpt_dir}", flush=True)


if __name__ == "__main__":
    main()
