"""Tier 2 from Python (docs/rebalancing.md): DataLoader(rebalance=...) and _C.Client(rebalance=...).

Three layers:
  - argument checks (nothing starts);
  - the bridge between the C callbacks and the Python feature_fn / sort_fn, driven through
    _C.RebalanceSpec, which calls the same C trampolines the runtime calls (nothing starts);
  - end to end, two ranks in this process against a coordinator and a DataServer on
    threads (as test_loader.py does), and examples/rebalance_example.py under torchrun.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from conftest import ROOT, torchrun_port


# ---- helpers -------------------------------------------------------------------------------

@pytest.fixture
def profiles(tmp_path):
    """A data set directory that resolve_source accepts (no client reads it)."""
    (tmp_path / "profiles.jsonl").write_text("")
    return str(tmp_path)


@contextmanager
def deadline(seconds):
    """Fails the test instead of hanging: SIGALRM raises in the main thread, which the
    loaders' next() notices between its 200 ms waits."""
    def expire(signum, frame):
        raise AssertionError(f"no progress within {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _drain(datahelix, clients):
    """Runs the clients' epochs side by side: {step: ids} per rank, and the errors next()
    raised per rank (at most 3 each; a timeout is not one)."""
    got, errors = [dict() for _ in clients], [[] for _ in clients]
    done = [False] * len(clients)
    while not all(done):
        for r, c in enumerate(clients):
            if done[r]:
                continue
            try:
                b = c.next()
            except datahelix.TimeoutError:
                # next_timeout_ms only lets this one thread turn to the other rank (whose
                # consumption may be what this rank's round waits for): "not yet", not an
                # error. A loaded machine times out more often; the deadline() bounds it.
                continue
            except datahelix.DataHelixError as e:
                errors[r].append(e)
                assert len(errors[r]) <= 3, errors[r]
                continue
            if b is None:
                done[r] = True
                continue
            got[r][b.info["step"]] = [s[0] for s in b.samples()]
    return got, errors


def assert_rounds_ran(stats_list, what):
    assert all(s["rebalance_rounds"] > 0 for s in stats_list), \
        f"{what}: a rank took part in no rebalance round: {stats_list}"


def profile_ids(src):
    with open(os.path.join(src, "profiles.jsonl")) as f:
        return [json.loads(line)["id"] for line in f if line.strip()]


def a_round(parts, round_no=7, group=0, ranks=(0, 1)):
    return {"group": group, "round": round_no, "ranks": list(ranks),
            "parts": [dict(rank=r, batch=b, slot=s, n_samples=1, tokens=t, bytes=100.0,
                           cpu_s=0.01, features=[t, 100.0, 0.01])  # the default features
                      for r, b, s, t in parts],
            "s_per_token": 1e-3, "min_gain": 0.05, "move_s_per_B": 0.0}


# ---- (a) arguments: nothing starts ---------------------------------------------------------

def test_an_unknown_key_is_named_with_the_allowed_ones(datahelix, profiles):
    with pytest.raises(datahelix.InvalidArgumentError) as info:
        datahelix.DataLoader(profiles, rebalance={"sort_fn": None, "bufer_size": 8})
    msg = str(info.value)
    assert "bufer_size" in msg
    for key in ("feature_fn", "sort_fn", "client_ranks", "groups", "buffer_size", "min_gain",
                "args"):
        assert key in msg
    with pytest.raises(datahelix.InvalidArgumentError, match="'bogus'.*allowed"):
        datahelix._C.RebalanceSpec({"bogus": 1}, 2)


@pytest.mark.parametrize("groups, match", [
    ([[0, 1], [1, 2]], "rank 1 is listed twice"),
    ([[0, 0]], "rank 0 is listed twice"),
    ([[0, 4]], "rank 4 is out of range"),
    ([[-1]], "rank -1 is out of range"),
    ([[]], r"\[0\] is empty"),
])
def test_bad_groups_name_the_rank(datahelix, profiles, groups, match):
    with pytest.raises(ValueError, match=match):
        datahelix.DataLoader(profiles, rank=0, world_size=4, coordinator="tcp://127.0.0.1:1",
                             rebalance={"client_ranks": groups})
    with pytest.raises(ValueError, match=match):
        datahelix._C.RebalanceSpec({"groups": groups}, 4)


def test_other_bad_values_are_named(datahelix, profiles):
    cases = [
        ({"groups": [["a"]]}, TypeError, r"\['groups'\]\[0\]\[0\] must be an int"),
        ({"sort_fn": 3}, TypeError, "sort_fn'] must be callable"),
        ({"buffer_size": 0}, ValueError, "buffer_size"),
        ({"min_gain": -0.1}, ValueError, "min_gain"),
        ({"n_features": 2}, ValueError, "needs a feature_fn"),
        ({"feature_fn": len, "n_features": 17}, ValueError, "n_features"),
        ({"args": {"f": object()}}, ValueError, "JSON"),
        ({"client_ranks": [[0, 1]], "groups": [[0]]}, ValueError, "client_ranks and groups"),
        ({"fanout": 3}, ValueError, r"fanout.*\[1, batch_size=2\]"),
    ]
    for spec, exc, match in cases:
        with pytest.raises(exc, match=match):
            datahelix.DataLoader(profiles, batch_size=2, rank=0, world_size=2,
                                 coordinator="tcp://127.0.0.1:1", rebalance=spec)
    with pytest.raises(datahelix.InvalidArgumentError, match="rebalance must be"):
        datahelix.DataLoader(profiles, rebalance="yes")


def test_groups_become_the_c_group_table(datahelix):
    # listed groups are 0, 1, ...; a rank in none gets an id of its own (it does not rebalance)
    cfg = datahelix._C.RebalanceSpec({"groups": [[0, 2], [3, 4]], "args": {"k": [1, 2]},
                                      "buffer_size": 8, "min_gain": 0.1,
                                      "round_timeout_ms": 500}, 6).config
    assert cfg["enabled"] and cfg["group_of"] == [0, 2, 0, 1, 1, 3]
    assert json.loads(cfg["args"]) == {"k": [1, 2]}
    assert (cfg["buffer_size"], cfg["min_gain"], cfg["round_timeout_ms"]) == (8, 0.1, 500)
    assert not cfg["feature_fn"] and not cfg["sort_fn"]
    # None groups: by node (the C default); True: on with every default; None/False: off
    assert datahelix._C.RebalanceSpec({"groups": None}, 2).config["group_of"] is None
    on = datahelix._C.RebalanceSpec(True, 2).config
    assert on["enabled"] and on["buffer_size"] == 64 and on["min_gain"] == 0.05
    assert not datahelix._C.RebalanceSpec(None, 2).config["enabled"]
    assert not datahelix._C.RebalanceSpec(False, 2).config["enabled"]


def test_rebalance_moves_single_samples_unless_told(datahelix, profiles):
    # a part is the unit that moves: the loader asks the client for batch_size parts
    dl = datahelix.DataLoader(profiles, batch_size=4, rebalance=True)
    assert dl.rebalance and dl._client_kwargs["fanout"] == 4
    dl = datahelix.DataLoader(profiles, batch_size=4, rebalance={"fanout": 2})
    assert dl._client_kwargs["fanout"] == 2
    dl = datahelix.DataLoader(profiles, batch_size=4)
    assert not dl.rebalance and "fanout" not in dl._client_kwargs


# ---- the bridge: the C trampolines calling Python, nothing starts --------------------------

def test_sort_fn_gets_the_round_and_args_and_its_ranks_go_to_c(datahelix):
    seen = []

    def swap(rnd, args):
        seen.append((rnd, args))
        return [1, 0, rnd["parts"][2]["rank"]] if args["swap"] else None

    spec = datahelix._C.RebalanceSpec({"sort_fn": swap, "args": {"swap": True}}, 2)
    rnd = a_round([(0, 5, 0, 10.0), (1, 5, 0, 2.0), (0, 6, 0, 3.0)])
    assert spec.sort(rnd) == [1, 0, 0]
    got, args = seen[0]
    assert args == {"swap": True}
    assert (got["group"], got["round"], got["ranks"]) == (0, 7, [0, 1])
    assert got["parts"][0] == {"rank": 0, "batch": 5, "slot": 0, "n_samples": 1, "tokens": 10.0,
                               "bytes": 100.0, "cpu_s": 0.01, "features": [10.0, 100.0, 0.01]}
    assert (got["s_per_token"], got["min_gain"], got["move_s_per_B"]) == (1e-3, 0.05, 0.0)
    keep = datahelix._C.RebalanceSpec({"sort_fn": swap, "args": {"swap": False}}, 2)
    assert keep.sort(rnd) is None  # None: keep the assignment


def test_a_raising_sort_fn_is_an_error_naming_the_round(datahelix):
    def policy(rnd, args):
        raise RuntimeError("policy boom")

    spec = datahelix._C.RebalanceSpec({"sort_fn": policy}, 2)
    with pytest.raises(datahelix.DataHelixError) as info:
        spec.sort(a_round([(0, 1, 0, 1.0), (1, 1, 0, 1.0)], round_no=42, group=3))
    msg = str(info.value)
    assert "round 42" in msg and "group 3" in msg
    assert "RuntimeError: policy boom" in msg and "Traceback" in msg and "in policy" in msg
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize("answer, match", [
    ([0], r"returned 1 ranks for 2 parts"),
    ([0, 1, 1], r"returned 3 ranks for 2 parts"),
    ([0, 1.0], r"float for part 1 \(batch 1, rank 1, slot 0\), not an int"),
    (["0", 1], r"str for part 0 .* not an int"),
    ([True, 0], r"bool for part 0 .* not an int"),
    ([0, 2], r"part 1 .* rank 2, not a rank of the group"),
    ([-1, 0], r"rank -1, not a rank of the group"),
    ("01", r"returned str, not a list of ranks"),
    (5, r"returned int, not a list of ranks"),
])
def test_a_bad_assignment_is_an_error_naming_the_round(datahelix, answer, match):
    spec = datahelix._C.RebalanceSpec({"sort_fn": lambda rnd, args: answer}, 3)
    with pytest.raises(datahelix.InvalidArgumentError, match="round 9 .*" + match):
        spec.sort(a_round([(0, 1, 0, 1.0), (1, 1, 0, 1.0)], round_no=9))


def test_feature_fn_sees_zero_copy_views_valid_during_the_call(datahelix):
    frames = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    kept = {}

    def measure(tensors, samples):
        view = tensors["frames"]
        t = torch.from_dlpack(view)
        kept["view"], kept["ptr"] = view, t.data_ptr()
        assert t.shape == (2, 3, 4) and t.dtype == torch.uint8
        return [sum(s["tokens"] for s in samples), float(t.float().mean()),
                len(samples), samples[1]["error"]]

    spec = datahelix._C.RebalanceSpec({"feature_fn": measure, "n_features": 4}, 1)
    got = spec.feature({"frames": frames}, [("a", 5), ("b", 7)])
    assert got == [12.0, float(frames.mean()), 2.0, 0.0]
    assert kept["ptr"] == frames.ctypes.data  # the part's memory itself, no copy
    with pytest.raises(BufferError, match="only during the call"):
        memoryview(kept["view"])


def test_feature_fn_vector_length(datahelix):
    # without n_features: 1 to 16 values; the C side carries 16, the unused ones marked
    # (by the smallest negative subnormal: the runtime takes finite numbers only)
    spec = datahelix._C.RebalanceSpec({"feature_fn": lambda t, s: (1.5, 2)}, 1)
    out = spec.feature({}, [("a", 1)])
    assert out[:2] == [1.5, 2.0] and len(out) == 16 and out[2:] == [-5e-324] * 14
    spec = datahelix._C.RebalanceSpec(
        {"feature_fn": lambda t, s: [1.0] * 17}, 1)
    with pytest.raises(datahelix.InvalidArgumentError, match="returned 17 values"):
        spec.feature({}, [("a", 1)])
    spec = datahelix._C.RebalanceSpec({"feature_fn": lambda t, s: [1.0], "n_features": 2}, 1)
    with pytest.raises(datahelix.InvalidArgumentError,
                       match=r"returned 1 values on the part of 1 sample \['a'\], n_features is 2"):
        spec.feature({}, [("a", 1)])
    spec = datahelix._C.RebalanceSpec({"feature_fn": lambda t, s: ["x"], "n_features": 1}, 1)
    with pytest.raises(datahelix.InvalidArgumentError, match="'x' at index 0 .* not a finite"):
        spec.feature({}, [("a", 1)])
    spec = datahelix._C.RebalanceSpec({"feature_fn": lambda t, s: [1.0, float("nan")]}, 1)
    with pytest.raises(datahelix.InvalidArgumentError, match="nan at index 1 .* not a finite"):
        spec.feature({}, [("a", 1)])
    # what sort_fn sees: the values returned, not the padding
    parts = []
    sorter = datahelix._C.RebalanceSpec(
        {"feature_fn": lambda t, s: [1.0], "sort_fn": lambda r, a: parts.extend(r["parts"])}, 2)
    rnd = a_round([(0, 1, 0, 4.0)])
    rnd["parts"][0]["features"] = [4.0, 3.0]
    assert sorter.sort(rnd) is None and parts[0]["features"] == [4.0, 3.0]


def test_a_raising_feature_fn_names_the_part_and_the_exception(datahelix):
    def measure(tensors, samples):
        raise KeyError("no such tensor")

    spec = datahelix._C.RebalanceSpec({"feature_fn": measure}, 1)
    with pytest.raises(datahelix.DataHelixError) as info:
        spec.feature({}, [("clip-7", 3)])
    msg = str(info.value)
    assert "feature_fn raised KeyError: 'no such tensor'" in msg and "clip-7" in msg
    assert isinstance(info.value.__cause__, KeyError)


def test_the_loader_gives_feature_fn_torch_views(datahelix, profiles):
    # DataLoader wraps feature_fn: the _C views arrive as torch tensors on the same memory
    seen = {}

    def measure(tensors, samples):
        seen["type"], seen["ptr"] = type(tensors["frames"]), tensors["frames"].data_ptr()
        return [1.0]

    dl = datahelix.DataLoader(profiles, rebalance={"feature_fn": measure})
    spec = datahelix._C.RebalanceSpec(dl._client_kwargs["rebalance"], 1)
    frames = np.zeros((1, 2, 2), dtype=np.uint8)
    assert spec.feature({"frames": frames}, [("a", 1)])[0] == 1.0
    assert seen["type"] is torch.Tensor and seen["ptr"] == frames.ctypes.data


# ---- end to end: two ranks in this process -------------------------------------------------

def two_loaders(datahelix, cluster, src, **rebalance):
    return [datahelix.DataLoader(src, batch_size=2, seed=3, prefetch=2,
                                 coordinator=cluster.endpoint, rank=r, world_size=2,
                                 rebalance=dict(groups=[[0, 1]], buffer_size=4, late_ms=30000,
                                                   **rebalance))
            for r in range(2)]


def lockstep(loaders):
    """Iterates the ranks' loaders step by step (as synchronous training does): returns per
    rank {step: (sample ids, batch)}, and the loaders' stats."""
    got = [dict() for _ in loaders]
    for dl in loaders:  # every rank's client runs before any waits for a round
        len(dl)
    iters = [iter(dl) for dl in loaders]
    done = [False] * len(loaders)
    while not all(done):
        for r, it in enumerate(iters):
            if done[r]:
                continue
            b = next(it, None)
            if b is None:
                done[r] = True
                continue
            got[r][b["info"]["step"]] = (b["sample_ids"], b)
    return got, [dl.stats() for dl in loaders]


def test_a_user_sort_fn_that_swaps_is_obeyed_exactly(datahelix, dataset):
    src, ids = dataset
    order = profile_ids(src)
    index = {sid: i for i, sid in enumerate(order)}
    held = {}     # batch -> {(rank, slot): sample} as sort_fn saw the round (before moves)
    swapped = {}  # batch -> round, for every round's swap (every member runs sort_fn)

    def which(tensors, samples):  # a part's feature: its sample (fanout = batch: one each)
        (s,) = samples
        return [index[s["id"]]]

    def swap_first_parts(rnd, args):
        # parts are ordered by (batch, rank, slot): each rank's first part is its slot 0 of
        # the round's first batch; those two trade places
        for p in rnd["parts"]:
            held.setdefault(p["batch"], {})[(p["rank"], p["slot"])] = order[int(p["features"][0])]
        new = [p["rank"] for p in rnd["parts"]]
        first = {}
        for i, p in enumerate(rnd["parts"]):
            first.setdefault(p["rank"], i)
        a, b = first[args["a"]], first[args["b"]]
        new[a], new[b] = args["b"], args["a"]
        swapped[rnd["parts"][a]["batch"]] = rnd["round"]
        return new

    with deadline(120), datahelix.start_cluster(src, workers=2,
                                                arena_bytes=128 << 20) as cluster:
        loaders = two_loaders(datahelix, cluster, src, feature_fn=which, n_features=1,
                              sort_fn=swap_first_parts, args={"a": 0, "b": 1})
        got, stats = lockstep(loaders)
        for dl in loaders:
            dl.close()
    assert_rounds_ran(stats, "the swap")
    assert swapped, "sort_fn was never called"
    steps = sorted(got[0])
    assert steps == sorted(got[1]) == list(range(len(ids) // 4)) == sorted(held)
    for step in steps:
        slots = held[step]
        for r in range(2):  # the round held what tier 1 planned
            planned = [order[row] for row in datahelix.plan(src, step, r, 2, 2, seed=3)]
            assert sorted([slots[(r, 0)], slots[(r, 1)]]) == sorted(planned)
        want = [[slots[(0, 0)], slots[(0, 1)]], [slots[(1, 0)], slots[(1, 1)]]]
        if step in swapped:  # slot 0 traded: the part received takes the slot given up
            want = [[slots[(1, 0)], slots[(0, 1)]], [slots[(0, 0)], slots[(1, 1)]]]
        assert [got[0][step][0], got[1][step][0]] == want, (step, swapped)
    seen = [i for r in range(2) for step in steps for i in got[r][step][0]]
    assert sorted(seen) == sorted(ids)  # each sample exactly once
    for s in stats:
        assert s["rebalance_applied"] == s["rebalance_rounds"] == len(set(swapped.values()))
        assert s["rebalance_moved_parts"] == s["rebalance_moved_samples"] == len(swapped)
        assert s["rebalance_callback_errors"] == 0


def raise_in_first_round(what, first_ids):
    """A callback that fails (raising or answering badly) in the first round it sees, on
    every member (feature_fn: on the parts of `first_ids`, round 0's); later rounds keep.
    Returns (the rebalance spec, the rounds it failed in)."""
    failed = set()

    def fail_once(rnd):
        if not failed or rnd in failed:
            failed.add(rnd)
            return True
        return False

    if what == "sort_fn raises":
        def sort_fn(rnd, args):
            if fail_once(rnd["round"]):
                raise RuntimeError("policy boom")
        return {"sort_fn": sort_fn}, failed
    if what == "sort_fn answers badly":
        def sort_fn(rnd, args):
            return [p["rank"] for p in rnd["parts"]][1:] if fail_once(rnd["round"]) else None
        return {"sort_fn": sort_fn}, failed
    assert what == "feature_fn raises"
    def feature_fn(tensors, samples):
        if samples[0]["id"] in first_ids:
            failed.add(0)
            raise KeyError("no frames2")
        return [1.0]
    return {"feature_fn": feature_fn, "n_features": 1}, failed


@pytest.mark.parametrize("what, says", [
    ("sort_fn raises", "sort_fn raised RuntimeError: policy boom"),
    ("sort_fn answers badly", "sort_fn returned 3 ranks for 4 parts"),
    ("feature_fn raises", "feature_fn raised KeyError: 'no frames2'"),
])
def test_a_failing_policy_fails_next_once_naming_the_round_and_keeps_the_data(
        datahelix, dataset, what, says):
    src, ids = dataset
    order = profile_ids(src)
    # one step per round (buffer_size 4 = 2 ranks x 2): round 0 is step 0
    step0 = {order[i] for r in range(2) for i in datahelix.plan(src, 0, r, 2, 2, seed=3)}
    spec, failed = raise_in_first_round(what, step0)
    profiles = os.path.join(src, "profiles.jsonl")
    with deadline(120), datahelix.start_cluster(src, workers=2,
                                                arena_bytes=128 << 20) as cluster:
        clients = [datahelix._C.Client(profiles, r, 2, 2, coordinator=cluster.endpoint,
                                       fanout=2, prefetch=2, seed=3, next_timeout_ms=1000,
                                       rebalance=dict(spec, groups=[[0, 1]], buffer_size=4,
                                                          late_ms=30000))
                   for r in range(2)]
        got, errors = _drain(datahelix, clients)
        stats = [c.stats() for c in clients]
        plans = {(step, r): clients[0].plan(step, r) for step in range(3) for r in range(2)}
        for c in clients:
            c.close()
    assert_rounds_ran(stats, what)
    assert failed, "the callback was never called"
    (bad_round,) = failed
    for r in range(2):
        assert len(errors[r]) == 1, errors[r]  # said once
        e = errors[r][0]
        assert isinstance(e, datahelix.InvalidArgumentError), e
        assert f"round {bad_round}" in str(e) and says in str(e), str(e)
        if "raises" in what:
            assert "Traceback" in str(e) and isinstance(e.__cause__, Exception)
        # kept: every batch holds what tier 1 planned for it (in the order of its parts)
        for step, got_ids in got[r].items():
            assert sorted(got_ids) == sorted(order[i] for i in plans[(step, r)])
        assert stats[r]["rebalance_applied"] == 0 and stats[r]["rebalance_moved_parts"] == 0
        assert stats[r]["rebalance_callback_errors"] >= 1
    seen = [i for r in range(2) for step in got[r] for i in got[r][step]]
    assert sorted(seen) == sorted(ids)  # the kept round's batches come after the error


def test_a_user_feature_fn_vector_is_what_sort_fn_sees(datahelix, dataset):
    src, ids = dataset
    index = {sid: i for i, sid in enumerate(profile_ids(src))}
    measured = {}  # sample id -> the vector feature_fn returned for its part
    kinds = set()
    seen_parts = []

    def measure(tensors, samples):
        frames = tensors["frames"]
        kinds.add(type(frames))
        (s,) = samples  # fanout = batch: one sample per part
        vec = [float(s["tokens"]), float(frames.sum(dtype=torch.float64)), float(index[s["id"]])]
        measured[s["id"]] = vec
        return vec

    def look(rnd, args):
        seen_parts.extend(rnd["parts"])
        return None

    with deadline(120), datahelix.start_cluster(src, workers=2,
                                                arena_bytes=128 << 20) as cluster:
        loaders = two_loaders(datahelix, cluster, src, feature_fn=measure, sort_fn=look)
        got, stats = lockstep(loaders)
        sums = {sid: float(b["frames"][i].sum(dtype=torch.float64))
                for r in range(2) for _, (sids, b) in got[r].items()
                for i, sid in enumerate(sids)}
        del got
        for dl in loaders:
            dl.close()
    assert_rounds_ran(stats, "the feature vector")
    assert kinds == {torch.Tensor}
    assert seen_parts, "sort_fn was never called"
    by_index = {vec[2]: vec for vec in measured.values()}
    for p in seen_parts:
        vec = by_index[p["features"][2]]
        assert p["features"] == vec  # exactly what feature_fn returned, no padding
        assert p["tokens"] == vec[0] and p["n_samples"] == 1
    # the views were the part's own data: its pixels are the ones the batch yields
    for sid, vec in measured.items():
        assert sums[sid] == vec[1], sid


# ---- the docs example under torchrun -------------------------------------------------------

def test_the_docs_example_runs_under_torchrun(dataset):
    src, ids = dataset
    env = dict(os.environ, OMP_NUM_THREADS="1")
    port = torchrun_port()  # the rendezvous's, and +17 the coordinator's
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(port),
                        os.path.join(ROOT, "examples", "rebalance_example.py"), "--data", src],
                       capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert f"2 ranks: {len(ids)} samples, each exactly once" in r.stdout, r.stdout
    lines = re.findall(r"rank (\d): (\d+) samples.*rebalance rounds (\d+).*callback errors (\d+)",
                       r.stdout)
    assert sorted(int(x[0]) for x in lines) == [0, 1], r.stdout
    assert all(int(x[3]) == 0 for x in lines), r.stdout
    assert_rounds_ran([{"rebalance_rounds": int(x[2])} for x in lines], "the example")


# ---- moves across nodes in one all_to_all (rebalance["process_group"]) ----------------------

def test_a_process_group_carries_cross_node_moves_in_all_to_all(datahelix, dataset, tmp_path):
    src, ids = dataset
    order = profile_ids(src)
    with socket.socket() as s:  # a free port for the ranks' gloo rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rebalance_a2a_worker.py")
    with datahelix.start_cluster(src, workers=1, node="node-0",
                                 arena_bytes=128 << 20) as first, \
            datahelix.start_cluster(src, workers=1, node="node-1", coordinator=first.endpoint,
                                    arena_bytes=128 << 20) as second:
        procs = [subprocess.Popen([sys.executable, worker, src, first.endpoint, str(port), str(r),
                                   str(tmp_path / f"rank{r}.json")], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(2)]
        outputs = []
        for p in procs:
            try:
                outputs.append(p.communicate(timeout=240)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
        forwarded = [first.stats()["server"]["rebalance_sent"],
                     second.stats()["server"]["rebalance_sent"]]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in range(2):
        assert res[r]["wrong"] == [], f"rank {r} yielded pixels not its samples': {res[r]['wrong']}"
    steps = len(ids) // 4
    for step in range(steps):  # every part swapped: each rank yields the other's plan
        for r in range(2):
            planned = [order[i] for i in datahelix.plan(src, step, 1 - r, 2, 2, seed=3)]
            assert sorted(res[r]["got"][str(step)]) == sorted(planned), (step, r)
    seen = [i for r in range(2) for step in range(steps) for i in res[r]["got"][str(step)]]
    assert sorted(seen) == sorted(ids)
    for r in range(2):
        st = res[r]["stats"]
        assert st["rebalance_rounds"] == st["rebalance_applied"] == steps, st
        assert st["rebalance_exchanges"] == steps, st  # one all_to_all per round
        assert st["rebalance_bytes_remote"] == st["rebalance_bytes"] > 0, st
        assert st["rebalance_transfer_s_total"] > 0, st
        assert st["rebalance_callback_errors"] == 0, st
    assert forwarded == [0, 0]  # no DataServer forwarded a part


def test_an_exchange_fn_that_raises_fails_next_once_naming_the_round(datahelix, dataset):
    # two ranks on two nodes in this process; their exchange_fn meet on a barrier (an
    # in-process all_to_all); rank 1's raises in round 1, so the parts it was to bring are
    # lost: next() says so once, naming the round, with the exception as its cause
    src, ids = dataset
    profiles = os.path.join(src, "profiles.jsonl")
    barrier = threading.Barrier(2, timeout=60)
    posted = {}

    def exchange_for(rank):
        def exchange(rnd, ranks, send, send_counts, recv, recv_counts):
            assert ranks == [0, 1] and recv_counts[rank] == send_counts[rank] == 0
            posted[rank] = (bytes(send), list(send_counts))
            barrier.wait()
            data, counts = posted[1 - rank]
            start = sum(counts[:rank])
            recv[:] = data[start:start + counts[rank]]
            barrier.wait()
            if rnd == 1 and rank == 1:
                raise RuntimeError("link boom")
        return exchange

    def swap_all(rnd, args):
        return [1 - p["rank"] for p in rnd["parts"]]

    with deadline(120), datahelix.start_cluster(src, workers=1, node="node-0",
                                                arena_bytes=128 << 20) as first, \
            datahelix.start_cluster(src, workers=1, node="node-1", coordinator=first.endpoint,
                                    arena_bytes=128 << 20):
        clients = [datahelix._C.Client(profiles, r, 2, 2, coordinator=first.endpoint,
                                       node=f"node-{r}", fanout=2, prefetch=2, seed=3,
                                       next_timeout_ms=1000,
                                       rebalance=dict(groups=[[0, 1]], buffer_size=4,
                                                      late_ms=30000, sort_fn=swap_all,
                                                      exchange_fn=exchange_for(r)))
                   for r in range(2)]
        got, errors = _drain(datahelix, clients)
        stats = [c.stats() for c in clients]
        for c in clients:
            c.close()
    assert errors[0] == []
    (e,) = errors[1]
    assert "rebalance round 1 (group 0): exchange_fn failed" in str(e), str(e)
    assert "exchange_fn raised RuntimeError: link boom" in str(e), str(e)
    assert isinstance(e.__cause__, RuntimeError)
    # rank 1 lost step 1's parts (both came from rank 0); every other batch is whole
    assert got[1].get(1, []) == [] and all(len(got[r][s]) == 2 for r in range(2)
                                           for s in got[r] if (r, s) != (1, 1))
    assert stats[0]["rebalance_exchanges"] == stats[1]["rebalance_exchanges"] == len(ids) // 4
