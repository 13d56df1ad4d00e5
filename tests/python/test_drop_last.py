"""drop_last=False (DataLoader; sampler.h, client.h keep_tail): as torch's
DistributedSampler(drop_last=False), every epoch's tail is delivered. Two ranks, 13 samples,
batch 2: ceil(13 / 4) = 4 steps, the last one a row per rank (one real sample and one pad, a
repeat of the epoch's first sample, flagged in batch["padded"]); every sample seen exactly
once besides the pad, len() what is yielded, datahelix.plan() the same rows, and a resume in
the middle (or right before the tail) yields the rest of the same epoch."""
import json
import subprocess

import pytest

from conftest import CLI

RANKS, BATCH, N, SEED = 2, 2, 13, 4
STEPS = -(-N // (RANKS * BATCH))  # 4
SYNTH = {"type": "synthetic", "cost": "none", "bytes_scale": 0.0001}


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("droplast") / "profiles.jsonl")
    subprocess.run([CLI, "gen-profiles", "--mix", "kinetics-mixed", "--count", str(N), "--seed",
                    "3", "-o", path], check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def cluster(datahelix, profiles):
    with datahelix.start_cluster(profiles, workers=2, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as c:
        yield c


def row_ids(profiles):
    with open(profiles) as f:
        return [json.loads(line)["id"] for line in f if line.strip()]


def loaders(datahelix, cluster, profiles, **kw):
    kw.setdefault("drop_last", False)
    return [datahelix.DataLoader(profiles, batch_size=BATCH, seed=SEED, prefetch=2,
                                 coordinator=cluster.endpoint, rank=r, world_size=RANKS,
                                 timeout=60, **kw) for r in range(RANKS)]


def run(dls, steps=None):
    """Each rank's batches as (sample_ids, padded flags), for `steps` steps (None: len());
    with steps None, the iterators must end there."""
    out = [[] for _ in dls]
    its = [iter(dl) for dl in dls]
    n = len(dls[0]) if steps is None else steps
    for _ in range(n):
        for r, it in enumerate(its):
            b = next(it)
            assert str(b["padded"].dtype) == "torch.bool"
            assert len(b["padded"]) == len(b["sample_ids"])
            out[r].append((list(b["sample_ids"]), [bool(p) for p in b["padded"]]))
    if steps is None:
        for it in its:
            with pytest.raises(StopIteration):
                next(it)
    return out


def check_epoch(batches, ids):
    """One epoch of every rank's batches: the same count per rank, full steps but the last,
    every sample once besides the pads, the pads repeats of the epoch's first samples."""
    assert all(len(b) == STEPS for b in batches)
    tail = N - (STEPS - 1) * RANKS * BATCH
    per_rank_tail = -(-tail // RANKS)
    for r in range(RANKS):
        assert [len(ids_) for ids_, _ in batches[r]] == [BATCH] * (STEPS - 1) + [per_rank_tail]
        for s in range(STEPS - 1):
            assert not any(batches[r][s][1]), f"rank {r} step {s} has a pad"
    real = [i for b in batches for ids_, pads in b for i, p in zip(ids_, pads) if not p]
    padded = [i for b in batches for ids_, pads in b for i, p in zip(ids_, pads) if p]
    assert sorted(real) == sorted(ids)  # every sample exactly once
    assert len(padded) == per_rank_tail * RANKS - tail == 1
    first_step = {i for b in batches for i in b[0][0]}
    assert set(padded) <= first_step  # repeats of the epoch's start
    return padded


@pytest.mark.parametrize("plan", ["balanced", "count"])
def test_every_sample_seen_len_matches_pads_flagged(datahelix, cluster, profiles, plan):
    ids = row_ids(profiles)
    dls = loaders(datahelix, cluster, profiles, plan=plan)
    assert [len(dl) for dl in dls] == [STEPS, STEPS]
    batches = run(dls)
    padded = check_epoch(batches, ids)
    if plan == "count":  # the pad is the epoch's very first sample, as DistributedSampler's
        assert padded == [batches[0][0][0][0]]
    # datahelix.plan() is the loader's order, the tail included
    for s in range(STEPS):
        for r in range(RANKS):
            rows = datahelix.plan(profiles, s, r, RANKS, BATCH, seed=SEED, plan=plan,
                                  drop_last=False)
            assert [ids[i] for i in rows] == batches[r][s][0], f"step {s} rank {r}"
    for dl in dls:
        dl.close()


def test_second_epoch_and_two_epochs_per_pass(datahelix, cluster, profiles):
    ids = row_ids(profiles)
    dls = loaders(datahelix, cluster, profiles)
    for dl in dls:
        dl.set_epoch(1)
    epoch1 = run(dls)
    check_epoch(epoch1, ids)
    for dl in dls:
        dl.close()
    dls = loaders(datahelix, cluster, profiles, epochs=2)
    both = run(dls)
    assert [len(dl) for dl in dls] == [2 * STEPS] * RANKS
    check_epoch([b[:STEPS] for b in both], ids)
    check_epoch([b[STEPS:] for b in both], ids)
    assert [b[STEPS:] for b in both] == epoch1
    for dl in dls:
        dl.close()


def test_drop_last_true_is_unchanged(datahelix, cluster, profiles):
    dls = loaders(datahelix, cluster, profiles, drop_last=True)
    assert [len(dl) for dl in dls] == [N // (RANKS * BATCH)] * RANKS
    batches = run(dls)
    seen = [i for b in batches for ids_, pads in b for i in ids_]
    assert len(seen) == len(set(seen)) == 12
    assert not any(p for b in batches for _, pads in b for p in pads)
    for s in range(len(batches[0])):
        for r in range(RANKS):
            assert datahelix.plan(profiles, s, r, RANKS, BATCH, seed=SEED) == \
                datahelix.plan(profiles, s, r, RANKS, BATCH, seed=SEED, drop_last=True)
    for dl in dls:
        dl.close()


@pytest.mark.parametrize("k", [2, STEPS - 1])
def test_resume_mid_epoch_yields_the_same_tail(datahelix, cluster, profiles, k):
    ids = row_ids(profiles)
    full_dls = loaders(datahelix, cluster, profiles)
    full = run(full_dls)
    for dl in full_dls:
        dl.close()
    dls = loaders(datahelix, cluster, profiles)
    head = run(dls, k)
    states = [json.loads(json.dumps(dl.state_dict())) for dl in dls]
    assert [s["step"] for s in states] == [k, k] and states[0]["drop_last"] is False
    for dl in dls:
        dl.close()
    fresh = loaders(datahelix, cluster, profiles)
    for r in reversed(range(RANKS)):
        fresh[r].load_state_dict(states[r])
    assert [len(dl) for dl in fresh] == [STEPS, STEPS]
    rest = run(fresh, STEPS - k)
    for r in range(RANKS):
        assert head[r] + rest[r] == full[r], f"resumed at step {k}: rank {r} differs"
    check_epoch([head[r] + rest[r] for r in range(RANKS)], ids)
    for dl in fresh:
        dl.close()
    other = loaders(datahelix, cluster, profiles, drop_last=True)[0]
    with pytest.raises(datahelix.InvalidArgumentError, match="drop_last"):
        other.load_state_dict(states[0])
    other.close()


def test_drop_last_false_refuses_rebalance(datahelix, profiles):
    with pytest.raises(datahelix.InvalidArgumentError, match="drop_last=False"):
        datahelix.DataLoader(profiles, batch_size=BATCH, drop_last=False, rebalance=True,
                             world_size=2, rank=0, coordinator="tcp://127.0.0.1:1")


def test_tail_smaller_than_fanout(datahelix, cluster, profiles):
    """fanout 2 and a tail of one row per rank: the row in part 0, part 1 empty."""
    ids = row_ids(profiles)
    clients = [datahelix._C.Client(profiles, r, RANKS, BATCH, coordinator=cluster.endpoint,
                                   fanout=2, seed=SEED, drop_last=False, prefetch=2)
               for r in range(RANKS)]
    try:
        batches = [[] for _ in clients]
        for r, c in enumerate(clients):
            while True:
                b = c.next()
                if b is None:
                    break
                batches[r].append(([s[0] for s in b.samples()], b.padded()))
                assert b.tensors()["sizes"].shape[0] == len(b.samples())
                del b
        check_epoch(batches, ids)
        for s in range(STEPS):  # the parts' order, not the plan's: the same rows
            assert sorted(ids[i] for i in clients[0].plan(s, 0)) == sorted(batches[0][s][0])
    finally:
        for c in clients:
            c.close()
