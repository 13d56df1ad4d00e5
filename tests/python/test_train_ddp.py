"""examples/train_ddp.py under torchrun, 2 processes: it runs and its loss falls."""
import os
import re
import subprocess
import sys

from conftest import ROOT, torchrun_port


def test_torchrun_example_runs_and_the_loss_falls(dataset):
    src, _ = dataset
    env = dict(os.environ, OMP_NUM_THREADS="1")
    port = torchrun_port()  # the rendezvous's, and +17 the coordinator's
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1",
                        "--master_port", str(port), os.path.join(ROOT, "examples", "train_ddp.py"),
                        "--data", src, "--epochs", "12"],
                       capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    losses = [float(x) for x in re.findall(r"epoch \d+: mean loss ([0-9.]+)", r.stdout)]
    assert len(losses) == 12, r.stdout
    assert min(losses[-3:]) < losses[0], losses
