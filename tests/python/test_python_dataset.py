"""A user's map-style Python Dataset run by DataServer worker processes (docs/datasets.md,
"Your own Dataset"; src/runtime/dataserver_pyworker.c, python/datahelix/_worker.py)."""
import json
import os
import re
import signal
import time

import numpy as np
import pytest

import pydatasets


def wait_for(cond, what, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def worker_pids():
    """This process's children running datahelix._worker (the embedded DataServer's)."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError):
            continue
        if ppid == me and b"datahelix._worker" in cmd and " Z " not in stat[stat.rindex(")"):]:
            out.append(int(name))
    return sorted(out)


def check_batch(b, ds):
    """Every row's bytes equal ds[i]'s; padding zero, mask true exactly on real frames."""
    video, mask = b["video"].numpy(), b["video_mask"].numpy()
    assert b["video_mask"].dtype.is_floating_point is False and str(b["video_mask"].dtype) == "torch.bool"
    for row, i in enumerate(b["indices"]):
        want = pydatasets.clip(i)
        t = want.shape[0]
        assert np.array_equal(video[row, :t], want), f"sample {i}: bytes differ"
        assert not video[row, t:].any()
        assert mask[row, :t].all() and not mask[row, t:].any()
        assert b["caption"][row] == f"clip number {i}"
        assert int(b["label"][row]) == i * 10
        assert int(b["tokens"][row]) == t  # the leading dimension of its largest array


def run_ranks(datahelix, cluster, ds, world=2, batch=3, **kw):
    loaders = [datahelix.DataLoader(dataset=ds, batch_size=batch, seed=3, prefetch=2,
                                    coordinator=cluster.endpoint, rank=r, world_size=world,
                                    timeout=60, **kw)
               for r in range(world)]
    iters = [iter(dl) for dl in loaders]
    batches = []
    for _ in range(len(loaders[0])):
        for it in iters:
            batches.append(next(it))
    for it in iters:
        with pytest.raises(StopIteration):
            next(it)
    for dl in loaders:
        dl.close()
    return batches


def test_two_ranks_get_every_sample_once_with_its_bytes_in_the_arena(datahelix):
    ds = pydatasets.Clips(n=24)
    with datahelix.start_cluster(dataset=ds, workers=2, arena_bytes=64 << 20) as cluster:
        assert len(wait_for(lambda: len(worker_pids()) == 2 and worker_pids(),
                            "2 worker processes")) == 2
        batches = run_ranks(datahelix, cluster, ds)
        for b in batches:
            check_batch(b, ds)
            base, size = b["info"]["arena"]
            ptr = b["video"].data_ptr()
            assert base <= ptr and ptr + b["video"].nbytes <= base + size, "not in the arena"
        seen = [i for b in batches for i in b["indices"]]
        assert sorted(seen) == list(range(24))
        stats = cluster.server.stats()
        assert stats["samples"] == 24 and stats["sample_errors"] == 0


def test_a_raising_sample_is_named_with_its_traceback(datahelix):
    ds = pydatasets.Clips(n=8, fail=5, wrong=6)
    with datahelix.DataLoader(dataset=ds, batch_size=8, workers=1, timeout=60,
                              on_error="skip") as dl:
        (b,) = list(dl)
    errors = dict(zip(b["indices"], b["errors"]))
    assert "dataset[5]" in errors[5] and "ValueError: cannot read clip 5" in errors[5]
    assert "Traceback" in errors[5] and "pydatasets.py" in errors[5]
    assert "dataset[6]" in errors[6] and "returned list" in errors[6]
    assert all(errors[i] is None for i in errors if i not in (5, 6))
    rows = {i: r for r, i in enumerate(b["indices"])}
    assert not b["video"][rows[5]].any() and not b["video_mask"][rows[5]].any()
    ds = pydatasets.Clips(n=8, fail=5)
    with datahelix.DataLoader(dataset=ds, batch_size=8, workers=1, timeout=60) as dl:
        with pytest.raises(datahelix.DatasetError, match=r"dataset\[5\]") as err:
            list(dl)
    assert "Traceback" in str(err.value) and isinstance(err.value, RuntimeError)


def test_a_killed_worker_process_is_replaced_and_no_sample_is_lost(datahelix):
    ds = pydatasets.Clips(n=48, sleep_s=0.02)
    with datahelix.start_cluster(dataset=ds, workers=2, arena_bytes=64 << 20) as cluster:
        first = wait_for(lambda: len(worker_pids()) == 2 and worker_pids(), "2 workers")
        loaders = [datahelix.DataLoader(dataset=ds, batch_size=3, seed=4, prefetch=3,
                                        coordinator=cluster.endpoint, rank=r, world_size=2,
                                        timeout=60) for r in range(2)]
        iters = [iter(dl) for dl in loaders]
        batches = [next(it) for it in iters]
        os.kill(first[0], signal.SIGKILL)  # mid-epoch, with requests in flight
        for _ in range(len(loaders[0]) - 1):
            for it in iters:
                batches.append(next(it))
        now = wait_for(lambda: len(worker_pids()) == 2 and worker_pids(), "a replacement")
        assert first[0] not in now
        for dl in loaders:
            dl.close()
    seen = [i for b in batches for i in b["indices"]]
    assert sorted(seen) == list(range(48)), "a sample lost or duplicated"
    for b in batches:
        check_batch(b, ds)


def test_workers_are_seeded_and_initialised_as_torch_does(datahelix):
    with datahelix.DataLoader(dataset=pydatasets.WhoAmI(), batch_size=4, workers=2, seed=7,
                              worker_init_fn=pydatasets.mark_worker, timeout=60) as dl:
        rows = [(w, p, s, m) for b in dl
                for w, p, s, m in zip(b["worker"].tolist(), b["pid"].tolist(),
                                      b["seed"].tolist(), b["mark"])]
    assert {w for w, _, _, _ in rows} <= {0, 1}
    base = datahelix._C.epoch_seed(7, 0)  # the pass's base seed: (seed, epoch), as torch's
    for w, p, s, m in rows:
        assert s == base + w and m == f"init-{w}" and p != os.getpid()


def test_a_lambda_collate_fn_travels_by_cloudpickle(datahelix):
    ds = pydatasets.Clips(n=8)
    collate = lambda samples: {"labels": np.array([s["label"] for s in samples]),  # noqa: E731
                               "n_frames": np.array([len(s["video"]) for s in samples]),
                               "caption": [s["caption"].upper() for s in samples]}
    with datahelix.DataLoader(dataset=ds, batch_size=4, workers=1, collate_fn=collate,
                              timeout=60) as dl:
        for b in dl:
            assert b["labels"].tolist() == [i * 10 for i in b["indices"]]
            assert b["n_frames"].tolist() == [2 + i % 4 for i in b["indices"]]
            assert b["caption"] == [f"CLIP NUMBER {i}" for i in b["indices"]]
            assert "video" not in b


def test_costs_are_learned_and_the_next_run_plans_with_them(datahelix, tmp_path):
    costs = tmp_path / "costs.jsonl"
    ds = pydatasets.Costly(n=16, tell=False)
    ds.estimate_cost = None  # learned only
    del ds.estimate_cost
    with datahelix.DataLoader(dataset=pydatasets.Clips(n=16), batch_size=4, workers=2,
                              costs=costs, timeout=60) as dl:
        for _ in dl:
            pass
    rows = [json.loads(line) for line in costs.read_text().splitlines()]
    assert sorted(int(r["id"]) for r in rows) == list(range(16))
    for r in rows:
        i = int(r["id"])
        assert r["tokens"] == 2 + i % 4 and r["out_bytes"] == pydatasets.clip(i).nbytes
        assert r["cpu_s"] > 0
    dl2 = datahelix.DataLoader(dataset=pydatasets.Clips(n=16), batch_size=4, workers=1,
                               costs=costs, timeout=60)
    with open(os.path.join(os.path.dirname(dl2.profiles), "profiles.jsonl")) as f:
        planned = {json.loads(line)["id"]: json.loads(line) for line in f}
    dl2.close()
    for r in rows:
        assert planned[r["id"]]["tokens_est"] == r["tokens"]
        assert planned[r["id"]]["out_bytes"] == r["out_bytes"]


def test_a_dataset_that_cannot_load_fails_every_sample_with_the_reason(datahelix, tmp_path):
    class Unloadable:
        def __init__(self):
            self.weights = "weights.bin"

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"x": np.zeros(1)}

        def __setstate__(self, state):
            raise RuntimeError("no weights file here")
    with datahelix.DataLoader(dataset=Unloadable(), batch_size=2, workers=1,
                              timeout=60) as dl:
        with pytest.raises(datahelix.DatasetError, match="no weights file here"):
            next(iter(dl))


def test_errors_name_what_is_wrong(datahelix):
    with pytest.raises(datahelix.InvalidArgumentError, match="map-style"):
        datahelix.DataLoader(dataset=object())
    with pytest.raises(datahelix.InvalidArgumentError, match="not both"):
        datahelix.DataLoader("somewhere", dataset=pydatasets.Clips())
    with pytest.raises(datahelix.InvalidArgumentError, match="Python dataset"):
        datahelix.DataLoader("somewhere", collate_fn=len)


def test_a_remote_sidecar_runs_the_dataset_from_its_module(datahelix, tmp_path):
    """`datahelix server --role remote --dataset pydatasets:make_clips`: the sidecar's worker
    processes import the dataset by name; its batches reach the rank through the local
    DataServer (which has no workers of its own), bytes intact."""
    import subprocess
    import sys
    from conftest import CLI, ROOT
    here = os.path.dirname(os.path.abspath(__file__))
    coord = datahelix._C.Coordinator("tcp://127.0.0.1:*", policy="deadline")
    env = dict(os.environ, DH_PYTHON_EXE=sys.executable,
               PYTHONPATH=os.pathsep.join([here, os.environ.get("DH_PYTHON_PATH") or
                                           os.path.join(ROOT, "build", "python")]))
    common = [CLI, "server", "--coordinator", coord.endpoint, "--heartbeat-ms", "50"]
    procs = [subprocess.Popen(common + ["--role", "local", "--node", "n1", "--workers", "0"],
                              stderr=open(tmp_path / "local.log", "w")),
             subprocess.Popen(common + ["--role", "remote", "--node", "n2", "--workers", "2",
                                        "--dataset", "pydatasets:make_clips",
                                        "--sample-timeout", "30"],
                              env=env, stderr=open(tmp_path / "sidecar.log", "w"))]
    try:
        ds = pydatasets.Clips(n=24)
        with datahelix.DataLoader(dataset=ds, batch_size=3, coordinator=coord.endpoint,
                                  rank=0, world_size=1, node="n1", timeout=60) as dl:
            batches = list(dl)
        for b in batches:
            check_batch(b, ds)
            assert b["info"]["server"].startswith("n2-remote")
        assert sorted(i for b in batches for i in b["indices"]) == list(range(24))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        coord.close()
    log = (tmp_path / "sidecar.log").read_text()
    assert "python pipeline (dataset pydatasets:make_clips" in log, log
    assert "sample_timeout 30 s)" in log, log
    assert "24 samples (0 failed)" in log, log
    with pytest.raises(subprocess.CalledProcessError) as bad:
        subprocess.run([CLI, "server", "--coordinator", "tcp://127.0.0.1:1", "--role", "remote",
                        "--node", "x", "--workers", "1", "--dataset", "no-colon"],
                       check=True, capture_output=True, text=True)
    assert "MODULE:FACTORY" in bad.value.stderr
    for extra, says in ((["--dataset", "m:f", "--sample-timeout", "-1"], "[0, 1e7]"),
                        (["--sample-timeout", "5"], "goes with --dataset")):
        r = subprocess.run([CLI, "server", "--coordinator", "tcp://127.0.0.1:1", "--role",
                            "remote", "--node", "x", "--workers", "1"] + extra,
                           capture_output=True, text=True)
        assert r.returncode == 2 and says in r.stderr, r.stderr


def test_a_dataset_can_load_straight_into_the_slabs(datahelix, tmp_path):
    """sample_spec + load_into: the worker hands the dataset views of the batch's slab rows
    (the zero-copy form); the batch is what the default collate would make of the same
    samples, failures are named, and learned costs are recorded."""
    costs = tmp_path / "costs.jsonl"
    ds = pydatasets.IntoSlabs(n=16, fail=9)
    with datahelix.DataLoader(dataset=ds, batch_size=4, workers=2, timeout=60,
                              on_error="skip", costs=costs) as dl:
        batches = list(dl)
    assert sorted(i for b in batches for i in b["indices"]) == list(range(16))
    for b in batches:
        errors = dict(zip(b["indices"], b["errors"]))
        ok = dict(b)
        if 9 in errors:
            assert "dataset[9]" in errors[9] and "OSError: clip 9 is unreadable" in errors[9]
            row = b["indices"].index(9)
            assert not b["video"][row].any() and not b["video_mask"][row].any()
            continue
        check_batch(ok, ds)
    rows = [json.loads(line) for line in costs.read_text().splitlines()]
    assert sorted(int(r["id"]) for r in rows) == [i for i in range(16) if i != 9]
    for r in rows:
        assert r["out_bytes"] == pydatasets.clip(int(r["id"])).nbytes and r["cpu_s"] > 0


def shm_names():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_a_hanging_sample_fails_past_sample_timeout_and_its_slot_comes_back(datahelix):
    """__getitem__ of index 2 never returns: with sample_timeout=2, next() raises DatasetError
    naming it and the time, within a bounded time; its worker process is killed and reaped,
    a new one takes its place, and with one worker the rest of the pass still arrives."""
    shm = shm_names()
    ds = pydatasets.Clips(n=6, hang=2)
    with datahelix.DataLoader(dataset=ds, batch_size=1, workers=1, shuffle=False, prefetch=2,
                              timeout=60, sample_timeout=2) as dl:
        it = iter(dl)
        got = [next(it), next(it)]
        t0 = time.monotonic()
        with pytest.raises(datahelix.DatasetError) as err:
            next(it)
        assert time.monotonic() - t0 < 15
        text = str(err.value)
        assert "dataset[2]" in text and "__getitem__ ran past sample_timeout (2 s)" in text, text
        assert "no answer after 2." in text, text
        first = int(re.search(r"worker process \(pid (\d+)\) was killed", text).group(1))
        assert not os.path.exists(f"/proc/{first}"), "the killed worker was not reaped"
        wait_for(lambda: len(worker_pids()) == 1 and worker_pids() != [first], "a new worker")
        got += list(it)  # the batch that failed is consumed; the rest of the pass follows
    assert [b["indices"] for b in got] == [[0], [1], [3], [4], [5]]
    for b in got:
        check_batch(b, ds)
    assert worker_pids() == [] and shm_names() <= shm


def test_with_skip_a_hanging_sample_is_left_out_and_its_batch_mates_arrive(datahelix):
    """on_error="skip": the pass completes without the hanging sample; the samples of its
    batch run again in the new process and arrive with their bytes (a __getitem__ hang and a
    load_into hang, the latter after the batch's slabs were placed)."""
    for ds in (pydatasets.Clips(n=6, hang=3), pydatasets.IntoSlabs(n=6, hang=3)):
        with datahelix.DataLoader(dataset=ds, batch_size=3, workers=1, shuffle=False,
                                  timeout=60, sample_timeout=2, on_error="skip") as dl:
            batches = list(dl)
        assert [b["indices"] for b in batches] == [[0, 1, 2], [3, 4, 5]]
        errors = batches[1]["errors"]
        assert "dataset[3]" in errors[0] and "ran past sample_timeout (2 s)" in errors[0]
        assert ("load_into" if isinstance(ds, pydatasets.IntoSlabs) else "__getitem__") in \
            errors[0]
        assert errors[1] is None and errors[2] is None
        for b in batches:
            for row, i in enumerate(b["indices"]):
                if i == 3:
                    assert not b["video"][row].any()
                    continue
                t = pydatasets.clip(i).shape[0]
                assert np.array_equal(b["video"].numpy()[row, :t], pydatasets.clip(i))
        assert worker_pids() == []


def test_a_hanging_collate_fn_fails_its_batch_and_the_pass_goes_on(datahelix):
    """collate_fn never returns on the second batch: its samples fail with one message, the
    process is replaced, and the third batch arrives."""
    ds = pydatasets.Clips(n=9)
    with datahelix.DataLoader(dataset=ds, batch_size=3, workers=1, shuffle=False, timeout=60,
                              sample_timeout=2, on_error="skip",
                              collate_fn=pydatasets.collate_hangs_on_label_40) as dl:
        batches = list(dl)
    assert [b["sample_ids"] for b in batches] == [["0", "1", "2"], ["3", "4", "5"],
                                                  ["6", "7", "8"]]
    assert batches[0]["errors"] == [None] * 3 and batches[2]["errors"] == [None] * 3
    assert [int(x) for x in batches[2]["label"]] == [60, 70, 80]
    for e in batches[1]["errors"]:
        assert "collate_fn ran past sample_timeout (2 s) on the batch of 3 samples" in e, e
    assert worker_pids() == []


def test_sample_timeout_none_or_0_is_no_limit_and_a_bad_one_is_refused(datahelix):
    ds = pydatasets.Clips(n=2, sleep_s=0.3)
    for no_limit in (None, 0):
        with datahelix.DataLoader(dataset=ds, batch_size=1, workers=1, shuffle=False,
                                  timeout=60, sample_timeout=no_limit) as dl:
            batches = list(dl)
        assert [b["errors"] for b in batches] == [[None], [None]]
    with pytest.raises(datahelix.InvalidArgumentError, match="sample_timeout"):
        datahelix.DataLoader(dataset=ds, sample_timeout=-1)
