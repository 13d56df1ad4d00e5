"""datahelix.DataLoader under PyTorch Lightning (docs/python.md, "PyTorch Lightning"), with
the real library in real processes: a LightningModule's ``train_dataloader()`` returns the
loader and ``Trainer(strategy="ddp", devices=2, accelerator="cpu")`` runs it as it is (no
sampler injected: Lightning only rewraps a ``torch.utils.data.DataLoader``); its state goes
into Lightning's checkpoints (the fit loop saves every ``Stateful`` train loader's
``state_dict()``) and ``fit(ckpt_path=...)`` resumes it mid-epoch, on the same or another
number of ranks.

This file is also the training job the tests start (``python test_stack_lightning.py
--out DIR ...``; Lightning's DDP launcher starts the other ranks by running it again): each
rank appends one JSON line per training step to DIR/rankR.jsonl (Lightning's epoch, batch
index and global step, the batch's sample ids, the loader's state), which the tests read.
"""
import collections
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
N, B, SEED = 40, 3, 7     # 40 samples, 2 ranks x 3 a step: 6 steps an epoch (36 samples)
SYNTH = {"type": "synthetic", "cost": "none", "bytes_scale": 0.0001}  # no decoding
EVERY, BLOCK = 9, 10      # the killed job checkpoints after global step 9, stops inside 10


# -- the training job ---------------------------------------------------------------------

def job(argv):
    import argparse
    import threading

    sys.path.insert(0, os.environ.get("DH_PYTHON_PATH") or
                    os.path.join(HERE, "..", "..", "build", "python"))
    import torch
    import lightning as L
    import datahelix

    p = argparse.ArgumentParser(description="a Lightning job over a datahelix.DataLoader")
    p.add_argument("--profiles", required=True)
    p.add_argument("--out", required=True, help="DIR: rankR.jsonl per rank, ckpt/")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--batch", type=int, default=B, help="samples per rank per step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--every", type=int, default=0, help="checkpoint every k steps (0: none)")
    p.add_argument("--block", type=int, default=-1,
                   help="wait forever inside this global step, once recorded (to be killed)")
    p.add_argument("--ckpt-path", default=None)
    args = p.parse_args(argv)

    class Job(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.loader = None
            self.loader_state = None

        def on_load_checkpoint(self, checkpoint):
            # called before train_dataloader(): the loader's state, for a resume on more
            # ranks (docs/python.md, "PyTorch Lightning")
            (self.loader_state,) = checkpoint["loops"]["fit_loop"]["state_dict"][
                "combined_loader"]

        def train_dataloader(self):
            # made here, once the process group exists: rank and world size are its own
            self.loader = datahelix.DataLoader(args.profiles, batch_size=args.batch, seed=SEED,
                                               pipeline=SYNTH, workers=1, prefetch=2,
                                               timeout=60, log_level="warn")
            st = self.loader_state
            if st is not None and st["world_size"] < self.loader.world_size:
                # more ranks: load the state before Lightning takes len() as the epoch's
                # limit (with the per-rank batch kept, the resumed epoch has more batches
                # than a fresh one); Lightning loads it again, which changes nothing
                self.loader.load_state_dict(st)
            return self.loader

        def training_step(self, batch, batch_idx):
            st = self.loader.state_dict()
            rec = {"epoch": self.current_epoch, "batch_idx": batch_idx,
                   "global_step": self.global_step, "ids": list(batch["sample_ids"]),
                   "state": {k: st[k] for k in ("epoch", "step", "world_size", "batch_size",
                                                "keep")}}
            with open(os.path.join(args.out, f"rank{self.global_rank}.jsonl"), "a") as f:
                f.write(json.dumps(rec) + "\n")
            if self.global_step == args.block:
                threading.Event().wait()  # the test kills the job here
            return (self.w - batch["tokens"].float().mean() / 1000).pow(2).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks = []
    if args.every:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
            dirpath=os.path.join(args.out, "ckpt"), every_n_train_steps=args.every,
            save_top_k=-1))
    trainer = L.Trainer(strategy="ddp" if args.devices > 1 else "auto", devices=args.devices,
                        accelerator="cpu", max_epochs=args.epochs, callbacks=callbacks,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=bool(callbacks))
    trainer.fit(Job(), ckpt_path=args.ckpt_path)


# -- the tests ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    from conftest import CLI
    path = str(tmp_path_factory.mktemp("lightning") / "profiles.jsonl")
    subprocess.run([CLI, "gen-profiles", "--mix", "kinetics-mixed", "--count", str(N), "--seed",
                    "5", "-o", path], check=True, capture_output=True)
    return path


def order(datahelix, profiles, epoch):
    """An epoch's permutation as sample ids (the same for every world size): one step of all
    N samples on one rank in sampler order; step e of that plan is epoch e."""
    rows = [json.loads(line)["id"] for line in open(profiles)]
    return [rows[i] for i in datahelix.plan(profiles, epoch, 0, 1, N, seed=SEED, plan="count")]


def start(profiles, out, devices, *extra):
    from conftest import torchrun_port
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(torchrun_port()))  # +17: the datahelix coordinator's
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    log = open(os.path.join(out, "log"), "w")
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--profiles", profiles,
                             "--out", out, "--devices", str(devices), *extra],
                            stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # a group: the job and the ranks it starts


def finish(proc, out, timeout=240):
    try:
        rc = proc.wait(timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 0, open(os.path.join(out, "log")).read()[-6000:]


def records(out, ranks):
    got = {}
    for r in range(ranks):
        path = os.path.join(out, f"rank{r}.jsonl")
        got[r] = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    return got


def steps(recs):
    """{(epoch, global step): [ids of every rank]} and the number of ranks per step."""
    out = collections.defaultdict(list)
    count = collections.Counter()
    for rank_recs in recs.values():
        for rec in rank_recs:
            out[(rec["epoch"], rec["global_step"])] += rec["ids"]
            count[(rec["epoch"], rec["global_step"])] += 1
    return out, count


def wait_for(cond, what, proc, out, timeout=180):
    end = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before {what}: "
                                 + open(os.path.join(out, "log")).read()[-6000:])
        if time.monotonic() > end:
            raise AssertionError(f"no {what} after {timeout} s: "
                                 + open(os.path.join(out, "log")).read()[-6000:])
        time.sleep(0.1)


@pytest.fixture(scope="module")
def killed(profiles, tmp_path_factory):
    """A 2-rank job of 2 epochs: epoch 0 whole, then in epoch 1 a checkpoint after global
    step 9 (ModelCheckpoint(every_n_train_steps=9): batch 3 of epoch 1) and a SIGKILL of the
    job inside step 10, once both ranks have recorded it: steps 9 and 10 were consumed after
    the checkpoint, so a resumed run yields them again."""
    import torch
    out = str(tmp_path_factory.mktemp("killed"))
    proc = start(profiles, out, 2, "--epochs", "2", "--every", str(EVERY),
                 "--block", str(BLOCK))
    try:
        def blocked():
            return all(any(x["global_step"] == BLOCK for x in rs)
                       for rs in records(out, 2).values())
        # the checkpoint was written (rank 0 saves, then every rank waits at a barrier)
        # before any rank began step 10
        wait_for(blocked, f"step {BLOCK} on both ranks", proc, out)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    ckpts = glob.glob(os.path.join(out, "ckpt", "*.ckpt"))
    assert [os.path.basename(c) for c in ckpts] == [f"epoch=1-step={EVERY}.ckpt"]
    ckpt = torch.load(ckpts[0], weights_only=False)
    return out, ckpts[0], ckpt


def test_ddp_fit_sees_every_sample_once_per_epoch(datahelix, profiles, killed):
    """Epoch 0 of the 2-rank job: the loader ran as returned (no sampler injected, rank and
    world size from the process group), every global step is the next window of the epoch's
    order (its 6 samples shared by the ranks), so the epoch sees each sample once, up to the
    last full step (drop_last); epoch 1 follows with its own order."""
    recs = records(killed[0], 2)
    by_step, count = steps(recs)
    assert sorted(by_step) == [(s // 6, s) for s in range(BLOCK + 1)], sorted(by_step)
    assert set(count.values()) == {2}
    for (epoch, gs), ids in by_step.items():
        window = order(datahelix, profiles, epoch)[(gs % 6) * 6:(gs % 6 + 1) * 6]
        assert sorted(ids) == sorted(window), (epoch, gs)
    epoch0 = [i for (e, _), ids in by_step.items() if e == 0 for i in ids]
    assert sorted(epoch0) == sorted(order(datahelix, profiles, 0)[:N // 6 * 6])
    for r, rank_recs in recs.items():  # Lightning's batch index and the loader's step agree
        assert [x["batch_idx"] for x in rank_recs] == list(range(6)) + list(range(BLOCK - 5))
        assert [x["state"]["step"] for x in rank_recs] == \
            list(range(1, 7)) + list(range(1, BLOCK - 4))
        assert [x["state"]["epoch"] for x in rank_recs] == [0] * 6 + [1] * (BLOCK - 5)
        assert all(x["state"]["world_size"] == 2 for x in rank_recs)


def test_the_checkpoint_holds_the_loader_state(killed):
    _, _, ckpt = killed
    (state,) = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]  # rank 0's
    assert (state["epoch"], state["step"], state["world_size"], state["batch_size"]) == \
        (1, EVERY - 6, 2, B)
    assert state["position"] == (EVERY - 6) * 2 * B
    assert ckpt["global_step"] == EVERY


@pytest.mark.parametrize("world", [1, 3])
def test_killed_job_resumes_on_another_world_size(datahelix, profiles, killed, tmp_path, world):
    """The 2-rank job killed after its checkpoint at batch 3 of epoch 1 resumes with
    fit(ckpt_path=...) on `world` ranks, keeping the global batch (batch 6 / world per rank:
    Lightning calls load_state_dict(state) without keep, so the new loader's batch_size
    decides it). Counting from the first run only what the checkpoint covers (epoch 1's
    batches 0-2; batches 3 and 4, consumed after it and before the kill, are legitimately
    replayed), the two runs see each sample of epoch 1 exactly once; Lightning's batch
    counters and the loader's agree."""
    first, ckpt_path, _ = killed
    covered = [i for rs in records(first, 2).values() for x in rs
               if x["epoch"] == 1 and x["global_step"] < EVERY for i in x["ids"]]
    assert len(covered) == 3 * 2 * B
    out = str(tmp_path / f"resume{world}")
    args = ["--epochs", "2", "--batch", str(2 * B // world), "--ckpt-path", ckpt_path]
    if world == 1:  # one device: in this process (no launcher), as the epoch-end test
        os.makedirs(out)
        job(["--profiles", profiles, "--out", out, "--devices", "1"] + args)
    else:
        finish(start(profiles, out, world, *args), out)
    recs = records(out, world)
    perm = order(datahelix, profiles, 1)
    for r, rank_recs in recs.items():
        # Lightning goes on at batch 3 of epoch 1 and so does the loader: 3 steps left
        assert [(x["epoch"], x["batch_idx"]) for x in rank_recs] == [(1, 3), (1, 4), (1, 5)]
        assert [x["global_step"] for x in rank_recs] == [9, 10, 11], r
        assert [x["state"]["step"] for x in rank_recs] == [4, 5, 6], r
        assert all(x["state"]["keep"] == "global_batch" and x["state"]["world_size"] == world
                   for x in rank_recs), r
        assert all(len(x["ids"]) == 2 * B // world for x in rank_recs), r
    by_step, count = steps(recs)
    assert set(count.values()) == {world}
    for (_, gs), ids in by_step.items():  # each resumed step: that window of the order
        assert sorted(ids) == sorted(perm[(gs - 6) * 6:(gs - 5) * 6]), gs
    resumed = [i for ids in by_step.values() for i in ids]
    seen = collections.Counter(covered + resumed)
    assert max(seen.values()) == 1, [i for i, c in seen.items() if c > 1]
    assert sorted(seen) == sorted(perm[:N // 6 * 6])  # drop_last: the last full step's end


@pytest.mark.parametrize("world", [1, 3])
def test_killed_job_resumes_keeping_the_per_rank_batch(datahelix, profiles, killed, tmp_path,
                                                       world):
    """The same checkpoint (batch 3 of epoch 1, 3 x 6 = 18 samples in) resumed on `world`
    ranks with the per-rank batch kept (batch 3: global batch 3 or 9). The resumed epoch
    has other steps (18 samples are 6 steps of 3, 2 of 9). On three ranks the loader's
    count goes on from the saved step 3 (len() = 3 + the 2 steps left), so Lightning's
    restored batch_idx and the loader's step agree and Lightning ends the epoch with the
    loader's last batch; the job loads the state in train_dataloader() too (the documented
    recipe: Lightning takes len() before it loads the state, as its batches per epoch for
    the whole fit). On one rank (a smaller global batch) the count starts at the 6 steps of
    3 the 18 samples fill, so that len() is a fresh epoch's 13 (Lightning keeps that number
    for the epochs after): Lightning's batch_idx runs 3 behind the loader's step in the
    resumed epoch, which Lightning ends when the loader's pass ends. Counting from the
    first run only what the checkpoint covers, epoch 1's samples are each seen once, up to
    the last full step of the new global batch (drop_last); epoch 2 follows whole, with
    its own order, batch_idx and the loader's step from 0 again, equal."""
    first, ckpt_path, _ = killed
    covered = [i for rs in records(first, 2).values() for x in rs
               if x["epoch"] == 1 and x["global_step"] < EVERY for i in x["ids"]]
    out = str(tmp_path / f"rank_batch{world}")
    args = ["--epochs", "3", "--batch", str(B), "--ckpt-path", ckpt_path]
    if world == 1:
        os.makedirs(out)
        job(["--profiles", profiles, "--out", out, "--devices", "1"] + args)
    else:
        finish(start(profiles, out, world, *args), out)
    recs = records(out, world)
    g = world * B
    left = (N - 18) // g                      # epoch 1's steps after position 18
    per_epoch = N // g
    ahead = max(3, -(-18 // g)) - 3           # the loader's count - Lightning's, epoch 1
    assert ahead == (3 if world == 1 else 0)
    want = [(1, 3 + j) for j in range(left)] + [(2, j) for j in range(per_epoch)]
    for r, rank_recs in recs.items():
        assert [(x["epoch"], x["batch_idx"]) for x in rank_recs] == want, r
        assert [x["global_step"] for x in rank_recs] == \
            list(range(EVERY, EVERY + left + per_epoch)), r
        # the loader's step after yielding batch i is i + 1 (+ ahead in epoch 1)
        assert [x["state"]["step"] for x in rank_recs] == \
            [b + 1 + (ahead if e == 1 else 0) for e, b in want], r
        assert [x["state"]["epoch"] for x in rank_recs] == [e for e, _ in want], r
        assert all(x["state"]["keep"] == "rank_batch" and x["state"]["world_size"] == world
                   and len(x["ids"]) == B for x in rank_recs), r
    by_step, count = steps(recs)
    assert set(count.values()) == {world}
    perm1, perm2 = order(datahelix, profiles, 1), order(datahelix, profiles, 2)
    for (epoch, gs), ids in by_step.items():  # each step: the next window of the order
        at = 18 + (gs - EVERY) * g if epoch == 1 else (gs - EVERY - left) * g
        perm = perm1 if epoch == 1 else perm2
        assert sorted(ids) == sorted(perm[at:at + g]), (epoch, gs)
    resumed = [i for (e, _), ids in by_step.items() if e == 1 for i in ids]
    seen = collections.Counter(covered + resumed)
    assert max(seen.values()) == 1, [i for i, c in seen.items() if c > 1]
    assert sorted(seen) == sorted(perm1[:18 + left * g])
    epoch2 = [i for (e, _), ids in by_step.items() if e == 2 for i in ids]
    assert sorted(epoch2) == sorted(perm2[:per_epoch * g])


def test_resume_from_an_epoch_end_checkpoint_starts_the_next_epoch(datahelix, profiles,
                                                                    tmp_path):
    """One device, in this process: a checkpoint after an epoch's last batch holds the
    loader at the end of its pass; Lightning then iterates it without set_epoch for the next
    epoch, which must be epoch 1 from its first batch (not an empty pass, and not epoch 1
    skipped)."""
    out = str(tmp_path / "end")
    os.makedirs(out)
    common = ["--profiles", profiles, "--out", out, "--devices", "1", "--batch", str(2 * B)]
    job(common + ["--epochs", "1", "--every", "6"])
    (ckpt,) = glob.glob(os.path.join(out, "ckpt", "*.ckpt"))
    job(common + ["--epochs", "2", "--ckpt-path", ckpt])
    recs = records(out, 1)[0]
    assert [(x["epoch"], x["batch_idx"]) for x in recs] == \
        [(0, i) for i in range(6)] + [(1, i) for i in range(6)]
    for x in recs:
        s = x["global_step"] % 6
        assert sorted(x["ids"]) == sorted(order(datahelix, profiles, x["epoch"])[s * 6:s * 6 + 6])


def test_the_example_resumes_mid_epoch(dataset, tmp_path, monkeypatch, capsys):
    """examples/lightning_video.py on one device, in this process: stopped after 2 steps
    (checkpoints after steps 1 and 2), resumed from the step-1 checkpoint: batch 1 comes
    again with the same loss (the same samples, the restored weights), then the rest of
    the epoch (12 clips, 2 a step: 6 steps)."""
    import runpy
    example = os.path.join(HERE, "..", "..", "examples", "lightning_video.py")
    common = ["--data", dataset[0], "--devices", "1", "--epochs", "1", "--workers", "2",
              "--ckpt-dir", str(tmp_path / "ckpt")]

    def run(*args):
        monkeypatch.setattr(sys, "argv", [example, *common, *args])
        runpy.run_path(example, run_name="__main__")
        return capsys.readouterr().out

    first = run("--max-steps", "2", "--ckpt-every", "1")
    assert "done: 2 steps, 1 device(s) x batch 2" in first, first
    second = run("--ckpt-path", str(tmp_path / "ckpt" / "epoch=0-step=1.ckpt"))
    assert "done: 6 steps, 1 device(s) x batch 2" in second, second
    lines = [ln for ln in second.splitlines() if ln.startswith("epoch 0 batch")]
    assert [ln.split(":")[0] for ln in lines] == \
        [f"epoch 0 batch {i} step {i}" for i in range(1, 6)], second
    again = [ln for ln in first.splitlines() if ln.startswith("epoch 0 batch 1 ")]
    assert again == lines[:1], (first, second)


# -- what Lightning relies on, without Lightning ---------------------------------------------

def loader(datahelix, profiles, **kw):
    kw.setdefault("batch_size", 2 * B)
    return datahelix.DataLoader(profiles, seed=SEED, pipeline=SYNTH, workers=1, prefetch=2,
                                timeout=60, log_level="warn", **kw)


def ids_of(it, n=None):
    return [list(b["sample_ids"]) for _, b in zip(range(n) if n else iter(int, 1), it)]


def test_what_lightning_calls_on_a_fresh_and_a_resumed_loader(datahelix, profiles):
    """Lightning calls iter() once to check that a non-torch loader is iterable, then len(),
    then (resuming) load_state_dict(state), then iter() for the epoch: the checking iter()
    takes no batch and must not use up an epoch, and load_state_dict after it and len() is
    no load "during a pass"."""
    with loader(datahelix, profiles) as ref:
        ref.set_epoch(0)
        epoch0 = ids_of(ref)
    with loader(datahelix, profiles) as dl:
        check = iter(dl)               # the check
        assert len(dl) == 6
        it = iter(dl)
        assert ids_of(check) == []     # abandoned: replaced by the new pass
        assert ids_of(it, 2) == epoch0[:2]
        state = dl.state_dict()
        assert (state["epoch"], state["step"]) == (0, 2)
        with pytest.raises(datahelix.InvalidArgumentError, match="during a pass"):
            dl.load_state_dict(state)  # batches were taken: that is a pass
    with loader(datahelix, profiles) as dl:
        iter(dl)
        assert len(dl) == 6
        dl.load_state_dict(state)
        assert ids_of(iter(dl)) == epoch0[2:]


def test_a_state_at_the_end_of_a_pass(datahelix, profiles):
    """A state taken after a pass's last batch (Lightning's checkpoint at an epoch's end):
    iterated without set_epoch, as Lightning does, the next pass is the next epoch from its
    first step; with set_epoch of the saved epoch (a hand-written loop) that epoch is done:
    an empty pass, as before."""
    with loader(datahelix, profiles) as ref:
        ref.set_epoch(1)
        epoch1 = ids_of(ref)
    with loader(datahelix, profiles) as dl:
        assert len(ids_of(dl)) == 6
        state = dl.state_dict()
    assert (state["epoch"], state["step"]) == (0, 6)
    with loader(datahelix, profiles) as dl:
        dl.load_state_dict(state)
        assert ids_of(iter(dl)) == epoch1
        assert dl.state_dict()["epoch"] == 1
    with loader(datahelix, profiles) as dl:
        dl.load_state_dict(state)
        dl.set_epoch(0)
        assert ids_of(iter(dl)) == []


def test_len_and_step_after_a_resume_keeping_the_per_rank_batch(datahelix, profiles):
    """What the Lightning resume keeping the per-rank batch relies on, and a hand-written
    loop too: after load_state_dict of a 2 x 3 state at step 3 (position 18), the loader's
    count goes on from step 3 on 3 x 3 (len() 3 + 2 left = 5, more than a fresh epoch's 4:
    a len() taken before the load was too small, which load_state_dict warns about, naming
    both), and from the 6 steps 18 samples fill on 1 x 3 (len() 6 + 7 = 13, a fresh
    epoch's); enumerate(loader, start=state_dict()["step"]) ends at len() - 1."""
    import warnings
    with loader(datahelix, profiles, batch_size=B) as one:
        assert len(one) == N // B
        st = dict(one.state_dict(), epoch=1, step=3, position=18, first_sample=0,
                  world_size=2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # len() 13 before, 13 after: nothing to say
            one.load_state_dict(st)
        assert (one.state_dict()["step"], len(one)) == (6, 13)
        got = [(i, b["sample_ids"]) for i, b in enumerate(one, start=one.state_dict()["step"])]
        assert [i for i, _ in got] == list(range(6, 13))
        assert [i for _, ids in got for i in ids] == order(datahelix, profiles, 1)[18:39]
    with datahelix.start_cluster(profiles, workers=1, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as cluster:
        def rank0_of_3():
            return datahelix.DataLoader(profiles, batch_size=B, seed=SEED, pipeline=SYNTH,
                                        coordinator=cluster.endpoint, rank=0, world_size=3,
                                        timeout=60, log_level="warn")
        dl = rank0_of_3()
        assert len(dl) == N // 9
        with pytest.warns(UserWarning, match=r"len\(\) was 4 before .* has 5 batches \(step "
                          r"3 and 2 left, world size 2 -> 3\).* stops 1 batches early"):
            dl.load_state_dict(st)
        assert (dl.state_dict()["step"], dl.state_dict()["keep"], len(dl)) == \
            (3, "rank_batch", 5)
        dl.close()
        dl = rank0_of_3()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dl.load_state_dict(st)     # before len(): what the Lightning recipe does
            assert len(dl) == 5
            iter(dl)                   # Lightning's check
            dl.load_state_dict(st)     # Lightning loads it again: the same
        assert (dl.state_dict()["step"], len(dl)) == (3, 5)
        dl.close()


def test_rank_and_world_size_from_the_process_group(datahelix, profiles, monkeypatch):
    """Lightning's DDP launcher sets WORLD_SIZE and LOCAL_RANK but not RANK: a loader made
    without rank= and world_size= takes them from torch.distributed's process group (RANK,
    when set, wins: torchrun's); one made before the group existed refuses to start a pass,
    naming both."""
    from datahelix import loader as mod
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(mod, "_dist_group", lambda: (2, 3))
    assert mod._job_rank_world(None, None) == (2, 3)
    assert mod._job_rank_world(0, 1) == (0, 1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert mod._job_rank_world(None, None) == (1, 4)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(mod, "_dist_group", lambda: None)
    with loader(datahelix, profiles) as dl:
        assert (dl.rank, dl.world_size) == (0, 1)
        monkeypatch.setattr(mod, "_dist_group", lambda: (1, 2))
        with pytest.raises(datahelix.InvalidArgumentError,
                           match=r"rank 0 of world size 1 .*rank 1 of 2.*train_dataloader"):
            iter(dl)
    with loader(datahelix, profiles, rank=0, world_size=1) as dl:  # given: kept
        assert len(ids_of(dl)) == 6


if __name__ == "__main__":
    job(sys.argv[1:])
