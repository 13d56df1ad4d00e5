"""Hugging Face Accelerate (docs/python.md, "Training stacks"): a datahelix.DataLoader passed
to accelerator.prepare() comes back as it is (no re-sharding, no dispatching), and with
accelerator.register_for_checkpointing(loader) its state rides in save_state / load_state.
A 2-rank job (torchrun, gloo, CPU) checkpointed after step 3 and SIGKILLed after step 5 is
resumed on 1 rank (keeping the global batch) and, separately, on 3 ranks (keeping the
per-rank batch): in each case the first run's batches up to the checkpoint and the resumed
run's batches hold each sample of the epoch exactly once (stack_job.py)."""
import os
import re
import subprocess
import sys

import pytest

import stack_job
from conftest import ROOT, torchrun_port

N, W1, B1, SAVE_AT, HANG_AT = 54, 2, 3, 3, 5
SCRIPT = "stack_accelerate_rank.py"


@pytest.mark.parametrize("world2,keep,batch2", [(1, "global_batch", 6), (3, "rank_batch", 3)])
def test_killed_job_resumes_on_another_world_size(tmp_path, world2, keep, batch2):
    ids = stack_job.make_profiles(tmp_path / "profiles.jsonl", N)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()

    def args(run, batch, *more):
        return [tmp_path / "profiles.jsonl", out, run, ckpt, batch, keep, SAVE_AT, HANG_AT,
                *more]
    first = stack_job.first_run(SCRIPT, lambda: os.path.exists(ckpt / "READY"), str(out),
                                args("first", B1), SAVE_AT, HANG_AT, tmp_path / "first.log")
    assert (ckpt / "custom_checkpoint_0.pkl").exists()  # the loader's state (rank 0's)
    stack_job.run_to_end(SCRIPT, world2, args("resumed", batch2, "--resume"),
                         tmp_path / "resumed.log")
    resumed = stack_job.records(str(out), "resumed", world2)
    start = stack_job.check_exactly_once(ids, first, resumed, SAVE_AT, HANG_AT, batch2,
                                         world2)
    # position 3 x (2 x 3) = 18 of the order: step 3 of 6-sample steps, 2 of 9-sample ones;
    # the loader's count goes on from the saved step 3 (or from the steps 18 samples fill
    # on a smaller global batch), the batches left are (54 - 18) / the new global batch
    pos, g2 = SAVE_AT * W1 * B1, world2 * batch2
    assert start == max(SAVE_AT, -(-pos // g2))
    assert len(resumed[0]) == (N - pos) // g2


def test_example_saves_and_resumes_on_another_world_size(dataset, tmp_path):
    """examples/accelerate_video.py: 2 processes (torchrun) stop after 4 steps of 3 per epoch,
    saving every 2; one process (plain python) resumes from the latest checkpoint keeping
    the global batch (1 x 4 = 2 x 2) and trains the 2 steps left."""
    src, _ = dataset
    example = os.path.join(ROOT, "examples", "accelerate_video.py")
    ckpt = tmp_path / "ckpt"
    common = ["--data", src, "--epochs", "2", "--checkpoint", str(ckpt)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(torchrun_port()),
                        example, *common, "--save-every", "2", "--stop-after", "4"],
                       capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "2 processes, 3 steps per epoch, batch 2 per process" in r.stdout, r.stdout
    assert re.search(r"epoch 0: 3 steps, mean loss [0-9.]+\n", r.stdout), r.stdout
    assert "stopped after 4 steps" in r.stdout, r.stdout
    assert (ckpt / "latest").read_text() == "e001_p0000004"  # epoch 1, 4 samples in
    assert (ckpt / "e001_p0000004" / "custom_checkpoint_0.pkl").exists()
    r = subprocess.run([sys.executable, example, *common, "--resume", "--batch", "4", "--keep",
                        "global_batch"], capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert re.search(r"resumed from \S+e001_p0000004: epoch 1, step 1 \(1 processes x "
                     r"batch 4\)", r.stdout), r.stdout
    assert re.search(r"epoch 1: 2 steps, mean loss [0-9.]+\n", r.stdout), r.stdout
    assert "epoch 0" not in r.stdout, r.stdout
