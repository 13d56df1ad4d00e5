"""Mid-epoch resume (DataLoader.state_dict / load_state_dict; client.h first_step): a 2-rank
epoch interrupted at a random step and restored yields exactly the batches that were left,
in the order of an uninterrupted run, whichever rank restarts first."""
import json
import os
import random
import signal
import subprocess
import sys

import pytest

from conftest import CLI, ROOT

RANKS, BATCH, SEED = 2, 3, 11
SYNTH = {"type": "synthetic", "cost": "none", "bytes_scale": 0.0001}


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("resume") / "profiles.jsonl")
    subprocess.run([CLI, "gen-profiles", "--mix", "kinetics-mixed", "--count", "90", "--seed",
                    "3", "-o", path], check=True, capture_output=True)
    return path


def loaders(datahelix, cluster, profiles, **kw):
    return [datahelix.DataLoader(profiles, batch_size=BATCH, seed=SEED, prefetch=2,
                                 coordinator=cluster.endpoint, rank=r, world_size=RANKS,
                                 timeout=60, **kw) for r in range(RANKS)]


def run(dls, steps=None):
    """Each rank's sample ids, batch by batch, for `steps` steps (None: to the end)."""
    out = [[] for _ in dls]
    its = [iter(dl) for dl in dls]
    n = len(dls[0]) if steps is None else steps
    for _ in range(n):
        for r, it in enumerate(its):
            out[r].append(next(it)["sample_ids"])
    return out, its


def test_state_dict_at_random_steps_resumes_the_same_order(datahelix, profiles):
    with datahelix.start_cluster(profiles, workers=2, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as cluster:
        full_dls = loaders(datahelix, cluster, profiles, plan_window=2)
        for dl in full_dls:
            dl.set_epoch(1)
        full, _ = run(full_dls)
        for dl in full_dls:
            dl.close()
        steps = len(full[0])
        assert steps == 90 // (RANKS * BATCH)
        rng = random.Random(5)
        for k in rng.sample(range(1, steps), 10):
            dls = loaders(datahelix, cluster, profiles, plan_window=2)
            for dl in dls:
                dl.set_epoch(1)
            head, _ = run(dls, k)
            states = [json.loads(json.dumps(dl.state_dict())) for dl in dls]  # as saved
            assert [s["step"] for s in states] == [k, k] and states[0]["epoch"] == 1
            for dl in dls:  # the job dies
                dl.close()
            fresh = loaders(datahelix, cluster, profiles, plan_window=2)
            for r in reversed(range(RANKS)):  # restored in any order
                fresh[r].load_state_dict(states[r])
            assert [len(dl) for dl in fresh] == [steps, steps]
            tail, its = run(fresh, steps - k)
            for it in its:
                with pytest.raises(StopIteration):
                    next(it)
            for r in range(RANKS):
                assert head[r] + tail[r] == full[r], f"resumed at step {k}: rank {r} differs"
            for dl in fresh:
                dl.close()
        bad = loaders(datahelix, cluster, profiles)[0]
        with pytest.raises(datahelix.InvalidArgumentError, match="plan_window"):
            bad.load_state_dict(states[0])
        bad.close()


RANK_SCRIPT = r"""
import json, os, sys, time
sys.path.insert(0, os.environ["DH_PYTHON_PATH"])
import torch
import datahelix
endpoint, profiles, rank, state_path, out_path = sys.argv[1:6]
dl = datahelix.DataLoader(profiles, batch_size=%d, seed=%d, prefetch=2, coordinator=endpoint,
                          rank=int(rank), world_size=%d, timeout=60)
if os.path.exists(state_path):
    dl.load_state_dict(torch.load(state_path))
with open(out_path, "a") as out:
    for batch in dl:
        out.write(json.dumps(batch["sample_ids"]) + "\n")
        out.flush()
        torch.save(dl.state_dict(), state_path + ".tmp")  # the checkpoint, each step
        os.replace(state_path + ".tmp", state_path)
        time.sleep(0.02)
""" % (BATCH, SEED, RANKS)


def test_ranks_killed_and_restarted_from_their_checkpoints(datahelix, profiles, tmp_path):
    """Each rank a process checkpointing its state_dict every step; both SIGKILLed
    mid-epoch, restarted (rank 1 first) from their checkpoints: every sample once, each
    rank's batches as planned."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               DH_PYTHON_PATH=os.environ.get("DH_PYTHON_PATH") or
               os.path.join(ROOT, "build", "python"))
    with datahelix.start_cluster(profiles, workers=2, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as cluster:
        def start(r):
            return subprocess.Popen([sys.executable, str(script), cluster.endpoint, profiles,
                                     str(r), str(tmp_path / f"state{r}.pt"),
                                     str(tmp_path / f"out{r}.jsonl")], env=env)
        procs = [start(r) for r in range(RANKS)]

        def lines(r):
            try:
                return open(tmp_path / f"out{r}.jsonl").read().count("\n")
            except OSError:
                return 0
        import time
        end = time.monotonic() + 60
        while min(lines(0), lines(1)) < 4 and time.monotonic() < end:
            time.sleep(0.01)
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        before = [lines(r) for r in range(RANKS)]
        procs = [start(r) for r in reversed(range(RANKS))]
        for p in procs:
            assert p.wait(timeout=120) == 0
    steps = 90 // (RANKS * BATCH)
    rows = [json.loads(line)["id"] for line in open(profiles)]
    seen = []
    for r in range(RANKS):
        got = [json.loads(line) for line in open(tmp_path / f"out{r}.jsonl")]
        want = [[rows[i] for i in datahelix.plan(profiles, s, r, RANKS, BATCH, seed=SEED)]
                for s in range(steps)]
        pre, post = got[:before[r]], got[before[r]:]
        assert pre == want[:len(pre)], f"rank {r}: before the kill"
        if len(pre) == steps and len(post) == steps:
            # (a loaded machine) the rank ended its epoch and saved the state after the last
            # batch before the kill: a pass without set_epoch after such a state is the next
            # epoch, from its first step (docs/python.md, "Resume")
            assert post == [[rows[i] for i in datahelix.plan(profiles, steps + s, r, RANKS,
                                                              BATCH, seed=SEED)]
                            for s in range(steps)], f"rank {r}: the next epoch"
            seen += [i for b in want for i in b]
            continue
        # the restart resumes at the checkpointed step: the last batch written before the
        # kill, or the one before it when the kill fell between writing it and saving
        resumed_at = steps - len(post)
        assert resumed_at in (len(pre), len(pre) - 1), (r, len(pre), resumed_at)
        assert post == want[resumed_at:], f"rank {r}: after the restart"
        seen += [i for b in want for i in b]
    assert sorted(seen) == sorted(rows[:steps * RANKS * BATCH])


def test_state_dict_goes_through_torch_distributed_checkpoint(datahelix, profiles, tmp_path):
    """The loader is a torch.distributed.checkpoint Stateful: saved in a DCP state (under one
    key, as on every rank of a job: test_stack_dcp.py) and loaded into a fresh loader, it
    resumes there."""
    import torch.distributed.checkpoint as dcp
    with datahelix.start_cluster(profiles, workers=2, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as cluster:
        dl = datahelix.DataLoader(profiles, batch_size=BATCH, seed=SEED, coordinator=cluster.endpoint,
                                  rank=0, world_size=1, timeout=60)
        it = iter(dl)
        first = [next(it)["sample_ids"] for _ in range(4)]
        dcp.save({"loader": dl}, checkpoint_id=str(tmp_path / "ckpt"))
        rest = [b["sample_ids"] for b in it]
        dl.close()
        fresh = datahelix.DataLoader(profiles, batch_size=BATCH, seed=SEED,
                                     coordinator=cluster.endpoint, rank=0, world_size=1,
                                     timeout=60)
        dcp.load({"loader": fresh}, checkpoint_id=str(tmp_path / "ckpt"))
        assert [b["sample_ids"] for b in fresh] == rest
        assert len(first) == 4 and fresh.state_dict()["step"] == len(first) + len(rest)
        fresh.close()
