"""Elastic resume (docs/python.md, "Elastic resume"): a 2-rank epoch stopped after k steps
resumes on 1 and on 3 ranks from the merged rank states, keeping the global batch or the
per-rank batch. What holds, checked here: the epoch's order (the permutation) is the same
for every world size, each global step consumes the next window of it (its samples shared
among the ranks by the tier-1 plan, so the order within a window is the planner's), the
two runs together consume every sample of the order once, up to the last full step of the
resumed run's global batch (drop_last; with drop_last=False every sample, the pads marked),
and the resumed run's steps are the windows an uninterrupted run would have had at that
global batch from the resume position, also when that position is inside a step of the new
global batch (keeping the per-rank batch: the pass is then cut from it, its plan windows
counted from there), and after a second resume. A different DataServer worker count on
resume changes nothing."""
import collections
import json
import subprocess

import pytest

from conftest import CLI

W1, B1, SEED, N, EPOCH = 2, 3, 11, 95, 1
SYNTH = {"type": "synthetic", "cost": "none", "bytes_scale": 0.0001}


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("elastic") / "profiles.jsonl")
    subprocess.run([CLI, "gen-profiles", "--mix", "kinetics-mixed", "--count", str(N), "--seed",
                    "3", "-o", path], check=True, capture_output=True)
    return path


def order(datahelix, profiles):
    """The epoch's permutation as sample ids: one step of all N samples on one rank, in
    sampler order (plan="count"); it does not depend on the world size."""
    rows = [json.loads(line)["id"] for line in open(profiles)]
    return [rows[i] for i in datahelix.plan(profiles, EPOCH, 0, 1, N, seed=SEED, plan="count")]


def loaders(datahelix, cluster, profiles, world, batch, **kw):
    dls = [datahelix.DataLoader(profiles, batch_size=batch, seed=SEED, prefetch=2,
                                coordinator=cluster.endpoint, rank=r, world_size=world,
                                timeout=60, **kw) for r in range(world)]
    for dl in dls:
        dl.set_epoch(EPOCH)
    return dls


def run(dls, steps=None):
    """Each global step's batches [(ids, padded)] per rank, for `steps` steps (None: to the
    end, which must then come on every rank)."""
    its = [iter(dl) for dl in dls]
    out = []
    n = len(dls[0]) - dls[0].state_dict()["step"] if steps is None else steps
    for _ in range(n):
        step = []
        for it in its:
            b = next(it)
            step.append((list(b["sample_ids"]), [bool(p) for p in b["padded"]]))
        out.append(step)
    if steps is None:
        for it in its:
            with pytest.raises(StopIteration):
                next(it)
    return out


def real_ids(step):
    return [i for ids, pads in step for i, p in zip(ids, pads) if not p]


CASES = [  # keep, new world size, steps before the stop, plan_window, drop_last
    ("global_batch", 1, 4, 1, True),
    ("global_batch", 3, 5, 1, True),
    ("global_batch", 3, 4, 2, True),
    ("global_batch", 3, 7, 1, False),
    ("rank_batch", 1, 5, 1, True),
    ("rank_batch", 3, 3, 1, True),
    ("rank_batch", 3, 6, 1, False),
    # from inside a step of the new global batch: the pass is cut from the position
    ("rank_batch", 4, 1, 1, True),   # 2 x 3 stopped after 1 step (sample 6), on 4 x 3
    ("rank_batch", 1, 1, 1, True),   # ... and on 1 x 3 (a step boundary there)
    ("rank_batch", 3, 4, 1, True),   # sample 24 on 3 x 3
    ("rank_batch", 3, 2, 2, True),   # sample 12 on 3 x 3, plan windows from the resume
    ("rank_batch", 4, 2, 2, True),   # sample 12 on 4 x 3: a step boundary, not a window's
    ("rank_batch", 4, 3, 1, False),  # sample 18 on 4 x 3, the tail padded
]


def resume_at(pos, g2, pw):
    """Where a keep="rank_batch" resume from sample `pos` starts: (step, first sample) of
    the pass, the epoch's own step at a step boundary that starts a plan window, else step
    0 of the pass cut from `pos`."""
    return (pos // g2, 0) if pos % g2 == 0 and pos // g2 % pw == 0 else (0, pos)


@pytest.mark.parametrize("keep,w2,k,pw,drop_last", CASES)
def test_resume_on_another_world_size(datahelix, profiles, keep, w2, k, pw, drop_last):
    perm = order(datahelix, profiles)
    assert len(set(perm)) == N
    b2 = B1 * W1 // w2 if keep == "global_batch" else B1
    g1, g2 = W1 * B1, w2 * b2
    with datahelix.start_cluster(profiles, workers=2, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as cluster:
        dls = loaders(datahelix, cluster, profiles, W1, B1, plan_window=pw, drop_last=drop_last)
        head = run(dls, k)
        states = [json.loads(json.dumps(dl.state_dict())) for dl in dls]  # as saved
        for dl in dls:  # the job stops
            dl.close()
    assert [s["position"] for s in states] == [k * g1] * W1
    merged = datahelix.DataLoader.merge_states(reversed(states))
    assert merged["ranks"] == [0, 1] and "rank" not in merged
    # the new job: another world size, and another DataServer worker count
    with datahelix.start_cluster(profiles, workers=1, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as cluster:
        fresh = loaders(datahelix, cluster, profiles, w2, b2, plan_window=pw,
                        drop_last=drop_last)
        for r, dl in enumerate(fresh):  # any rank's state, or the merged one
            dl.load_state_dict(merged if r % 2 else states[r % W1], keep=keep)
        pos = k * g1
        at = (k, 0) if keep == "global_batch" else resume_at(pos, g2, pw)
        assert all((dl._resume_step, dl._resume_sample) == at for dl in fresh)
        assert fresh[0].state_dict()["keep"] == keep
        assert fresh[0].state_dict()["position"] == pos
        # the loader's count goes on from the saved step k, or on a smaller global batch
        # from the steps of it the consumed samples fill, ceil(pos / g2), if more: len() is
        # that plus the batches left, the state's step that plus those yielded
        count = max(k, -(-pos // g2))
        assert fresh[0].state_dict()["step"] == count
        tail = run(fresh)
        assert len(fresh[0]) == count + len(tail)
        fresh_len = (N // g2) if drop_last else -(-N // g2)  # a fresh epoch's at g2
        assert len(fresh[0]) >= fresh_len
        after = fresh[0].state_dict()
        assert (after["keep"], after["position"], after["step"]) == \
            (keep, pos + len(tail) * g2, count + len(tail))
        assert after["first_sample"] == at[1]
        for dl in fresh:
            dl.close()
    # each step is the next window of the order; with plan_window, each window of steps
    for steps, g, first in ((head, g1, 0), (tail, g2, k * g1)):
        for w in range(0, len(steps), pw):
            chunk = [i for s in steps[w:w + pw] for i in real_ids(s)]
            at = first + w * g
            assert sorted(chunk) == sorted(perm[at:at + len(chunk)]), (first, w)
    for step in head:
        assert all(len(ids) == B1 for ids, _ in step)
    for step in tail[:-1]:
        assert all(len(ids) == b2 for ids, _ in step)
    seen = [i for s in head + tail for i in real_ids(s)]
    counts = collections.Counter(seen)
    assert max(counts.values()) == 1, "a sample was consumed twice"
    # drop_last: the resumed run's last full global step ends the epoch; else every sample
    end = N if not drop_last else k * g1 + (N - k * g1) // g2 * g2
    assert sorted(seen) == sorted(perm[:end])
    pads = sum(p for s in tail for _, ps in s for p in ps)
    rest = (N - k * g1) % g2
    assert pads == (0 if drop_last or rest == 0 else -(-rest // w2) * w2 - rest)


def test_global_batch_fixed_is_the_uninterrupted_run_step_by_step(datahelix, profiles):
    """Keeping the global batch, every step of the resumed 3-rank run consumes the same
    samples as that step of an uninterrupted 2-rank run (the ranks' shares differ)."""
    with datahelix.start_cluster(profiles, workers=2, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as cluster:
        full = run(loaders(datahelix, cluster, profiles, W1, B1))
        dls = loaders(datahelix, cluster, profiles, W1, B1)
        head = run(dls, 6)
        state = dls[1].state_dict()
        for dl in dls:
            dl.close()
        fresh = loaders(datahelix, cluster, profiles, 3, 2)
        for dl in fresh:
            dl.load_state_dict(state)  # keep inferred: 3 x 2 == 2 x 3
        tail = run(fresh)
        for dl in fresh:
            dl.close()
    assert len(head) + len(tail) == len(full) == N // (W1 * B1)
    for s, (a, b) in enumerate(zip(full, head + tail)):
        assert sorted(real_ids(a)) == sorted(real_ids(b)), f"step {s}"


def test_second_resume_keeps_position_and_keep(datahelix, profiles):
    """2 x 3 stopped after 1 step (sample 6); resumed on 4 x 3 (cut from sample 6), stopped
    after 1 step (sample 18); resumed on 4 x 3 again from that state (the same cut, not an
    elastic resume), stopped after 1 more (sample 30); resumed on 3 x 3 from the merged
    states (30 is inside a step of 9: cut from 30) to the end. Each state's position is
    where the next window starts, keep says "rank_batch" from the first elastic resume on,
    first_sample the cut, and step goes on counting from the saved step (1, 2, 3), on the
    smaller global batch of the last run from the 9-sample steps 30 samples fill, 4; every
    run's steps are the next windows of the order, every sample once."""
    perm = order(datahelix, profiles)
    runs = []  # (steps, global batch, first position)
    with datahelix.start_cluster(profiles, workers=2, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as cluster:
        def leg(world, state, steps, keep=None):
            dls = loaders(datahelix, cluster, profiles, world, B1)
            for dl in dls:
                if state is not None:
                    dl.load_state_dict(state, keep=keep)
            first = dls[0].state_dict()["position"]
            runs.append((run(dls, steps), world * B1, first))
            states = [json.loads(json.dumps(dl.state_dict())) for dl in dls]
            for dl in dls:
                dl.close()
            return states

        s1 = leg(W1, None, 1)
        assert [(s["step"], s["position"], s["keep"]) for s in s1] == [(1, 6, None)] * W1
        s2 = leg(4, datahelix.DataLoader.merge_states(s1), 1, keep="rank_batch")
        assert [(s["step"], s["position"], s["first_sample"], s["keep"]) for s in s2] == \
            [(2, 18, 6, "rank_batch")] * 4
        s3 = leg(4, s2[3], 1)  # the same world size: the same cut, step 2 of it
        assert [(s["step"], s["position"], s["first_sample"], s["keep"]) for s in s3] == \
            [(3, 30, 6, "rank_batch")] * 4
        s4 = leg(3, datahelix.DataLoader.merge_states(s3), None, keep="rank_batch")
        end = 30 + (N - 30) // 9 * 9
        assert [(s["step"], s["position"], s["first_sample"], s["keep"]) for s in s4] == \
            [(4 + (end - 30) // 9, end, 30, "rank_batch")] * 3
    assert [first for _, _, first in runs] == [0, 6, 18, 30]
    seen = []
    for steps, g, first in runs:
        for j, step in enumerate(steps):
            ids = real_ids(step)
            assert sorted(ids) == sorted(perm[first + j * g:first + (j + 1) * g])
            seen += ids
    assert seen and len(seen) == len(set(seen)) == end
    assert sorted(seen) == sorted(perm[:end])


def test_refusals(datahelix, profiles):
    with datahelix.start_cluster(profiles, workers=2, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as cluster:
        dls = loaders(datahelix, cluster, profiles, W1, B1, plan_window=2)
        run(dls, 3)
        states = [dl.state_dict() for dl in dls]
        late = dict(states[1], step=4, position=24)  # rank 1 saved a step later
        for dl in dls:
            dl.close()

        def new(world, batch, **kw):
            return datahelix.DataLoader(profiles, batch_size=batch, seed=SEED,
                                        coordinator=cluster.endpoint, rank=0,
                                        world_size=world, plan_window=kw.pop("pw", 2), **kw)

        with pytest.raises(datahelix.InvalidArgumentError, match=r"ranks 0 and 1 disagree on "
                           r"(position|step)"):
            datahelix.DataLoader.merge_states([states[0], late])
        with pytest.raises(datahelix.InvalidArgumentError, match=r"rank\(s\) \[0\] given more"):
            datahelix.DataLoader.merge_states([states[0], states[0]])
        st = dict(states[0], step=4, position=24)
        # the global batch 6 does not split over 4 ranks: both world sizes named
        with pytest.raises(datahelix.InvalidArgumentError,
                           match=r"world size 2 .*does not split over world size 4"):
            new(4, 1).load_state_dict(st, keep="global_batch")
        with pytest.raises(datahelix.InvalidArgumentError,
                           match=r"world size 2 x batch_size 3, .*world size 4 x batch_size 2"):
            new(4, 2).load_state_dict(st)
        with pytest.raises(datahelix.InvalidArgumentError, match=r"needs batch_size 2"):
            new(3, 3).load_state_dict(st, keep="global_batch")
        # per-rank batch: step 4 at 2 x 3 is sample 24, inside a step of 3 x 3: not refused,
        # the pass is cut from sample 24
        inside = new(3, 3)
        inside.load_state_dict(st, keep="rank_batch")
        assert (inside._resume_step, inside._resume_sample) == (0, 24)
        assert inside.state_dict()["position"] == 24 and len(inside) == 4 + (N - 24) // 9
        assert inside.state_dict()["step"] == 4  # the saved count: 24 / 9 fills 3 steps
        inside.close()
        # a state without first_sample (an older DataHelix's) counts its own steps in step
        old = {k: v for k, v in st.items() if k != "first_sample"}
        with pytest.raises(datahelix.InvalidArgumentError, match=r"position 12 is before step 4"):
            new(3, 3).load_state_dict(dict(old, position=12), keep="rank_batch")
        with pytest.raises(datahelix.InvalidArgumentError,
                           match=r"position 24 is not first_sample 5 plus whole steps of .* 6"):
            new(3, 3).load_state_dict(dict(st, first_sample=5), keep="rank_batch")
        # plan_window 2: step 3 is inside a plan window
        with pytest.raises(datahelix.InvalidArgumentError, match=r"plan_window 2"):
            new(1, 6).load_state_dict(states[0])
        with pytest.raises(datahelix.InvalidArgumentError, match=r"plan_window"):
            new(1, 6, pw=1).load_state_dict(st)
        with pytest.raises(datahelix.InvalidArgumentError, match=r"keep must be"):
            new(1, 6).load_state_dict(st, keep="both")
        ok = new(1, 6)
        ok.load_state_dict(st)  # step 4 starts a plan window at both sizes
        assert ok._resume_step == 4 and ok.state_dict()["keep"] == "global_batch"
        ok.close()
