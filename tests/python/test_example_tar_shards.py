"""examples/train_tar_shards.py: a data set packed into WebDataset tar shards trains from
them, read in place (`datahelix manifest --from-tar`, probe, DataLoader), nothing extracted."""
import os
import re
import subprocess
import sys

from conftest import CLI, ROOT


def test_tar_shard_example_trains_without_extracting(dataset, tmp_path):
    src, ids = dataset
    out = tmp_path / "shards"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_tar_shards.py"),
                        "--data", src, "--out", str(out), "--epochs", "3"],
                       capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, DH_CLI=CLI, OMP_NUM_THREADS="1",
                                DH_CALIBRATION_CACHE=str(tmp_path / "calib.json")))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    losses = re.findall(r"epoch \d+: mean loss ([0-9.]+)", r.stdout)
    assert len(losses) == 3, r.stdout
    assert "read in place from 3 shards; nothing extracted" in r.stdout, r.stdout
    with open(out / "profiles.jsonl") as f:
        assert sum(1 for line in f if '"uri":"subfile,,start,' in line) == len(ids)
