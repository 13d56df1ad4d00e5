"""Training from your own map-style Dataset, run by DataServer worker processes
(docs/datasets.md, "Your own Dataset").

    python examples/train_custom_dataset.py --epochs 3 --workers 2

The dataset below makes each sample the way a real one would load and augment it: a clip of
a varying number of frames (a moving bright square whose direction is the label), a random
horizontal flip, a caption. It is defined here, in __main__, so it reaches the worker
processes by cloudpickle. The loader learns each sample's cost in the first run (written to
--costs) and plans with it from the next run on. The script prints one line per epoch with
the mean loss and the accuracy, and checks that the batches were views of shared memory.
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
import datahelix  # noqa: E402

DIRECTIONS = ["left", "right", "up", "down"]


class MovingSquares:
    """{"video": uint8 T x 32 x 32 x 3 (T from 4 to 11), "caption": str, "label": int}."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)  # the sample's content: a function of its index
        label = int(rng.integers(0, 4))
        frames = 4 + i % 8
        y, x = rng.integers(8, 24, size=2)
        video = np.zeros((frames, 32, 32, 3), np.uint8)
        dy, dx = [(0, -1), (0, 1), (-1, 0), (1, 0)][label]
        for t in range(frames):
            cy, cx = (y + dy * t) % 28, (x + dx * t) % 28
            video[t, cy:cy + 4, cx:cx + 4] = 255
        # the augmentation: per-worker seeded, as torch's workers are (worker_init_fn)
        if np.random.random() < 0.5 and label in (2, 3):
            video = video[:, :, ::-1]
        return {"video": video, "caption": f"a square moving {DIRECTIONS[label]}",
                "label": label}


def seed_worker(worker_id):
    info = datahelix.get_worker_info()
    np.random.seed(info.seed % (1 << 32))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, kernel_size=3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, video, mask):
        x = video.permute(0, 4, 1, 2, 3).float() / 255  # B x 3 x T x H x W
        x = F.relu(self.conv(x)).mean(dim=(3, 4))        # B x 8 x T
        m = mask.unsqueeze(1).float()
        return self.head((x * m).sum(2) / m.sum(2).clamp(min=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--costs", default=None, help="learned costs JSONL (default: none)")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    # torch's names: num_workers, and worker processes kept across epochs
    loader = datahelix.DataLoader(MovingSquares(args.samples), batch_size=args.batch,
                                  num_workers=args.workers, persistent_workers=True,
                                  worker_init_fn=seed_worker, costs=args.costs, timeout=120)
    in_arena = 0
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        losses, right, seen = [], 0, 0
        for batch in loader:
            base, size = batch["info"]["arena"] or (0, 0)
            ptr = batch["video"].data_ptr()
            in_arena += base <= ptr < base + size
            logits = model(batch["video"], batch["video_mask"])
            loss = F.cross_entropy(logits, batch["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            right += int((logits.argmax(1) == batch["label"]).sum())
            seen += len(batch["label"])
            assert all(c.startswith("a square moving") for c in batch["caption"])
        print(f"epoch {epoch}: mean loss {sum(losses) / len(losses):.4f}, "
              f"accuracy {right / seen:.2f} over {seen} samples", flush=True)
    loader.close()
    print(f"{in_arena} batches were views of the DataServer's shared memory")


if __name__ == "__main__":
    main()
