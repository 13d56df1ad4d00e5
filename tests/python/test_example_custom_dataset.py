"""examples/train_custom_dataset.py: a dataset defined in a script's __main__ trains through
DataServer worker processes (cloudpickle), batches in shared memory, costs learned."""
import json
import os
import re
import subprocess
import sys

from conftest import ROOT


def test_custom_dataset_example_trains_from_worker_processes(tmp_path):
    costs = tmp_path / "costs.jsonl"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_custom_dataset.py"),
                        "--epochs", "3", "--samples", "64", "--costs", str(costs)],
                       capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"epoch \d+: mean loss ([0-9.]+)", r.stdout)]
    assert len(losses) == 3, r.stdout
    assert losses[-1] < losses[0], r.stdout
    assert "24 batches were views of the DataServer's shared memory" in r.stdout, r.stdout
    with open(costs) as f:
        rows = [json.loads(line) for line in f]
    assert sorted(int(row["id"]) for row in rows) == list(range(64))
