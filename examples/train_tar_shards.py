"""Training from WebDataset tar shards, read in place (docs/datasets.md).

    python examples/train_tar_shards.py --data out/demo/video --out /tmp/shards

packs the clips of a synth/probe data set into tar shards the WebDataset way (KEY.mp4 and
KEY.txt, the caption, per sample; bring your own shards instead with --shards), turns them
into a manifest with `datahelix manifest --from-tar`, probes it, and trains a small video
classifier for a few epochs from a DataLoader that reads every clip where it lies in its
shard: nothing is extracted (the script checks the shards' folder at the end).
"""
import argparse
import json
import os
import subprocess
import sys
import tarfile

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
import datahelix  # noqa: E402

CLI = os.environ.get("DH_CLI", os.path.join(HERE, "..", "build", "datahelix"))


def pack(data, out, per_shard):
    """KEY.mp4 + KEY.txt per sample, per_shard samples a shard. Returns the shard count."""
    with open(os.path.join(data, "manifest.jsonl")) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    shards = 0
    for s in range(0, len(entries), per_shard):
        with tarfile.open(os.path.join(out, f"shard-{shards:03d}.tar"), "w") as t:
            for e in entries[s:s + per_shard]:
                t.add(os.path.join(data, e["path"]), arcname=f"{e['id']}.mp4")
                caption = os.path.join(out, ".caption")
                with open(caption, "w") as c:
                    c.write(e.get("caption", ""))
                t.add(caption, arcname=f"{e['id']}.txt")
                os.remove(caption)
        shards += 1
    return shards


def label(caption):
    return 1 if "square" in caption.split()[:4] else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="a synth/probe directory whose clips to pack into shards")
    p.add_argument("--shards", help="your own shards instead, e.g. 'dir/shard-{000..009}.tar'")
    p.add_argument("--out", required=True, help="where the shards, manifest and profiles go")
    p.add_argument("--per-shard", type=int, default=5)
    p.add_argument("--epochs", type=int, default=4)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.shards:
        pattern = args.shards
    else:
        n = pack(args.data, args.out, args.per_shard)
        pattern = os.path.join(args.out, "shard-{000..%03d}.tar" % (n - 1))
    manifest = os.path.join(args.out, "manifest.jsonl")
    spec = os.path.join(args.out, "spec.json")
    with open(spec, "w") as f:
        json.dump({"frames": 8, "height": 64, "width": 64}, f)
    subprocess.run([CLI, "manifest", "--from-tar", pattern, "-o", manifest], check=True)
    subprocess.run([CLI, "probe", manifest, "-o", os.path.join(args.out, "profiles.jsonl"),
                    "-p", spec], check=True)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(2),
                          nn.Flatten(), nn.Linear(8 * 8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with datahelix.DataLoader(args.out, pipeline=spec, batch_size=2, seed=0,
                              arena_bytes=128 << 20) as loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            total, steps = 0.0, 0
            for batch in loader:
                x = batch["frames"].float().div(255).permute(0, 2, 1, 3, 4)  # B x 3 x T x H x W
                y = torch.tensor([label(c) for c in batch["captions"]])
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total, steps = total + loss.item(), steps + 1
            print(f"epoch {epoch}: mean loss {total / max(1, steps):.4f}", flush=True)
    left = sorted(os.listdir(args.out))
    extracted = [x for x in left if not (x.endswith(".tar") or x in (
        "manifest.jsonl", "profiles.jsonl", "spec.json"))]
    if extracted:
        sys.exit(f"files appeared beside the shards: {extracted}")
    print(f"read in place from {sum(x.endswith('.tar') for x in left)} shards; nothing "
          f"extracted", flush=True)


if __name__ == "__main__":
    main()
