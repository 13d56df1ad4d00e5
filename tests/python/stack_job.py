"""What test_stack_accelerate.py and test_stack_dcp.py share: a training job of real
processes under torchrun, killed mid-epoch after its checkpoint and resumed at other world
sizes, and the check that the epoch's samples were each seen once across the two runs.

The rank scripts (stack_accelerate_rank.py, stack_dcp_rank.py) record every batch they get,
one JSON line per batch ({"step", "ids"}) in OUT/RUN.rankR.jsonl, flushed as it is written.
The first run checkpoints after SAVE_AT steps, goes on to HANG_AT steps and then blocks until
it is killed, so that some batches were consumed after the checkpoint: those are not covered
by it, and the resumed run yields them again (as after any crash)."""
import collections
import json
import os
import signal
import subprocess
import sys
import time

from conftest import CLI, torchrun_port

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 11
# profiles only: the DataServer makes each sample's tensors without decoding anything
SYNTH = {"type": "synthetic", "cost": "none", "bytes_scale": 0.0001}


def make_profiles(path, count):
    subprocess.run([CLI, "gen-profiles", "--mix", "kinetics-mixed", "--count", str(count),
                    "--seed", "3", "-o", str(path)], check=True, capture_output=True)
    with open(path) as f:
        return [json.loads(line)["id"] for line in f if line.strip()]


def launch(script, nproc, args, log):
    """`torchrun --nproc_per_node NPROC script ARGS` in a session of its own (so the whole job,
    agent and ranks, can be killed at once), its output to the file `log`."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(torchrun_port()),
           os.path.join(HERE, script)] + [str(a) for a in args]
    out = open(log, "w")
    try:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        out.close()


def tail(log, n=6000):
    with open(log, errors="replace") as f:
        return f.read()[-n:]


def kill(proc):
    """SIGKILL to the whole job: torchrun's agent (its process group) and every process under
    it; the agent starts each rank in a session of its own, so they are found as its
    descendants (taken before the agent dies) and killed one by one."""
    import psutil
    try:
        ranks = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        ranks = []
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for r in ranks:
        try:
            r.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    _, alive = psutil.wait_procs(ranks, timeout=60)
    assert not alive, f"still running after SIGKILL: {alive}"


def wait_until(cond, what, proc, log, timeout=100.0):
    """Polls cond() until it holds; fails naming `what` if the job exits first or the
    timeout passes (a bound for a stuck job, not a pace)."""
    end = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the job exited ({proc.returncode}) before {what}:\n"
                                 + tail(log))
        if time.monotonic() > end:
            kill(proc)
            raise AssertionError(f"no {what} after {timeout:.0f} s:\n" + tail(log))
        time.sleep(0.05)


def records(out, run, world):
    """Each rank's records of one run: [[{"step", "ids"}, ...] per rank]."""
    got = []
    for r in range(world):
        path = os.path.join(out, f"{run}.rank{r}.jsonl")
        if not os.path.exists(path):
            got.append([])
            continue
        with open(path) as f:
            got.append([json.loads(line) for line in f if line.endswith("\n")])
    return got


def run_to_end(script, nproc, args, log, timeout=100.0):
    proc = launch(script, nproc, args, log)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(proc)
        raise AssertionError(f"{script} on {nproc} ranks did not finish in {timeout:.0f} s:\n"
                             + tail(log))
    assert rc == 0, f"{script} on {nproc} ranks exited {rc}:\n" + tail(log)


def first_run(script, ckpt_ready, out, args, save_at, hang_at, log, world=2):
    """Starts the job on `world` ranks, waits for its checkpoint (ckpt_ready() true) and for
    every rank to have recorded HANG_AT batches (it then blocks), and SIGKILLs it. Returns its
    records."""
    proc = launch(script, world, args, log)
    try:
        wait_until(ckpt_ready, f"checkpoint after step {save_at}", proc, log)
        wait_until(lambda: all(len(r) >= hang_at for r in records(out, "first", world)),
                   f"{hang_at} batches recorded on every rank", proc, log)
    finally:
        kill(proc)
    return records(out, "first", world)


def check_exactly_once(ids, first, resumed, save_at, hang_at, batch2, world2):
    """The first run's batches up to the checkpoint (steps < save_at) and the resumed run's
    batches together hold each sample of the epoch once. The first run's batches after the
    checkpoint (steps save_at .. hang_at - 1, consumed before the kill) are not counted: the
    checkpoint does not cover them, so the resumed run yields those samples again, which is
    checked too. Returns the resumed run's first step."""
    for r, recs in enumerate(first):
        assert [x["step"] for x in recs] == list(range(hang_at)), f"first run, rank {r}"
    covered = [i for recs in first for x in recs if x["step"] < save_at for i in x["ids"]]
    replayed = {i for recs in first for x in recs if x["step"] >= save_at for i in x["ids"]}
    steps = [x["step"] for x in resumed[0]]
    assert steps, "the resumed run yielded nothing"
    for r, recs in enumerate(resumed):
        assert [x["step"] for x in recs] == steps, f"resumed run: rank {r}'s steps differ"
        assert all(len(x["ids"]) == batch2 for x in recs), f"resumed run, rank {r}: batch"
    assert steps == list(range(steps[0], steps[0] + len(steps))), steps
    assert len(resumed) == world2
    again = [i for recs in resumed for x in recs for i in x["ids"]]
    counts = collections.Counter(covered + again)
    twice = sorted(i for i, c in counts.items() if c > 1)
    assert not twice, f"seen twice across the two runs: {twice}"
    missing = sorted(set(ids) - set(counts))
    assert not missing, f"never seen: {missing}"
    assert sorted(counts) == sorted(ids)
    assert replayed and replayed <= set(again), "batches after the checkpoint not replayed"
    return steps[0]
