"""The DataLoader contract (docs/python.md, "torch's DataLoader parameters"): the same
scenarios through torch.utils.data.DataLoader and datahelix.DataLoader, asserting each
documented equivalence (order with plan="count" and no shuffle, per-epoch randomness,
worker_init_fn, get_worker_info, raise-then-continue, resume with the standard set_epoch
loop, timeout) and each documented difference (the refused arguments, the per-sample
seeding, the defaults)."""
import os
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

N, BATCH, WORKERS, SEED = 16, 4, 2, 7


def _init(worker_id):
    """worker_init_fn: marks the worker process (read back by the dataset)."""
    os.environ["CONTRACT_INIT"] = f"init-{worker_id}"


class Draws:
    """Each sample: its index, two random draws (Python's random, NumPy's global generator)
    and what the worker knows of itself."""

    def __init__(self, n=N, fail=(), torch_info=False):
        self.n, self.fail, self.torch_info = n, set(fail), torch_info

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.fail:
            raise ValueError(f"sample {i} is bad")
        if self.torch_info:
            info = torch.utils.data.get_worker_info()
        else:
            import datahelix
            info = datahelix.get_worker_info()
        if info is None:  # torch with num_workers=0: the main process
            info = type("Main", (), {"id": 0, "num_workers": 0, "seed": 0})
        return {"i": np.array([i], dtype=np.int64),
                "draw": np.array([random.randrange(1 << 30), np.random.randint(1 << 30)],
                                 dtype=np.int64),
                "wid": info.id, "nw": info.num_workers, "wseed": info.seed,
                "init": os.environ.get("CONTRACT_INIT", "")}


def _torch_loader(ds, **kw):
    kw.setdefault("num_workers", WORKERS)
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, **kw)


def _helix_loader(datahelix, ds, **kw):
    kw.setdefault("num_workers", WORKERS)
    kw.setdefault("seed", SEED)
    kw.setdefault("timeout", 120)
    return datahelix.DataLoader(ds, batch_size=BATCH, **kw)


def _indices(batch):
    return [int(x) for x in batch["i"].flatten().tolist()]


def _draws(loader):
    """{index: (draw, draw)} of one pass."""
    out = {}
    for batch in loader:
        for i, d in zip(_indices(batch), batch["draw"].tolist()):
            out[i] = tuple(d)
    return out


def test_order_without_shuffle_is_torchs(datahelix):
    want = [_indices(b) for b in _torch_loader(Draws(torch_info=True), drop_last=True)]
    with _helix_loader(datahelix, Draws(), shuffle=False, plan="count") as dl:
        got = [_indices(b) for b in dl]
        assert len(dl) == len(want)
    assert got == want


def test_every_pass_draws_afresh_and_the_same_epoch_draws_the_same(datahelix):
    # torch: a new base seed per iterator, so epochs differ
    g = torch.Generator().manual_seed(SEED)
    tl = _torch_loader(Draws(torch_info=True), generator=g, shuffle=False)
    t0, t1 = _draws(tl), _draws(tl)
    assert sum(t0[i] == t1[i] for i in t0) == 0
    # datahelix: the same, and deterministic per (seed, epoch), whatever worker ran a sample
    with _helix_loader(datahelix, Draws(), shuffle=False) as dl:
        e0, e1 = _draws(dl), _draws(dl)  # a new iter() moves to the next epoch
        dl.set_epoch(0)
        again = _draws(dl)
    assert sorted(e0) == sorted(e1) == list(range(N))
    assert sum(e0[i] == e1[i] for i in e0) == 0, "epochs 0 and 1 drew the same"
    assert again == e0
    # a new loader (new worker processes), persistent workers too
    for persistent in (False, True):
        with _helix_loader(datahelix, Draws(), shuffle=False,
                           persistent_workers=persistent) as dl:
            dl.set_epoch(1)
            assert _draws(dl) == e1
            dl.set_epoch(0)
            assert _draws(dl) == e0


def test_worker_info_and_worker_init_fn_as_torchs(datahelix):
    def infos(loader):
        rows = []
        for b in loader:
            rows += list(zip(b["wid"].tolist(), b["nw"].tolist(), b["wseed"].tolist(),
                             b["init"]))
        return rows

    for rows in (infos(_torch_loader(Draws(torch_info=True), worker_init_fn=_init)),):
        assert {nw for _, nw, _, _ in rows} == {WORKERS}
        assert all(init == f"init-{wid}" for wid, _, _, init in rows)
        assert len({seed - wid for wid, _, seed, _ in rows}) == 1  # base_seed + id
    with _helix_loader(datahelix, Draws(), worker_init_fn=_init) as dl:
        dl.set_epoch(3)
        rows = infos(dl)
    assert {nw for _, nw, _, _ in rows} == {WORKERS}
    assert {wid for wid, _, _, _ in rows} <= set(range(WORKERS))
    assert all(init == f"init-{wid}" for wid, _, _, init in rows)
    base = datahelix._C.epoch_seed(SEED, 3)
    assert {seed - wid for wid, _, seed, _ in rows} == {base}


def test_a_failed_batch_raises_and_the_pass_goes_on(datahelix):
    def run(loader, error):
        got, it = [], iter(loader)
        while True:
            try:
                got.append(_indices(next(it)))
            except StopIteration:
                return got
            except error as e:
                assert "sample 5" in str(e) or "'5'" in str(e)
                got.append("error")

    want = run(_torch_loader(Draws(fail={5}, torch_info=True)), ValueError)
    with _helix_loader(datahelix, Draws(fail={5}), shuffle=False, plan="count") as dl:
        got = run(dl, datahelix.DatasetError)
        assert len(got) == len(dl)
        assert dl.state_dict()["step"] == len(dl)
    assert got == want == [[0, 1, 2, 3], "error", [8, 9, 10, 11], [12, 13, 14, 15]]


def test_resume_with_the_standard_set_epoch_loop(datahelix):
    epochs, stop_at = 2, (1, 2)  # saved after batch 2 of epoch 1
    with _helix_loader(datahelix, Draws(), num_workers=1) as dl:
        full = []
        for epoch in range(epochs):
            dl.set_epoch(epoch)
            full += [(epoch, _indices(b)) for b in dl]
    with _helix_loader(datahelix, Draws(), num_workers=1) as dl:
        seen, state = [], None
        for epoch in range(epochs):
            dl.set_epoch(epoch)
            for step, b in enumerate(dl):
                seen.append((epoch, _indices(b)))
                if (epoch, step + 1) == stop_at:
                    state = dl.state_dict()
                    break
            if state:
                break
    assert state["epoch"] == 1 and state["step"] == 2
    with _helix_loader(datahelix, Draws(), num_workers=1) as dl:
        dl.load_state_dict(state)
        for epoch in range(state["epoch"], epochs):
            dl.set_epoch(epoch)  # the usual loop: keeps the resume point of its epoch
            seen += [(epoch, _indices(b)) for b in dl]
    assert seen == full


class Slow(Draws):
    """Hangs on the samples past the first batch once its flag file exists."""

    def __init__(self, flag):
        super().__init__()
        self.flag = flag

    def __getitem__(self, i):
        import time
        if i >= BATCH and os.path.exists(self.flag):
            time.sleep(30)
        return super().__getitem__(i)


def test_timeout_raises_as_torchs_does(datahelix, tmp_path):
    import time
    flag = str(tmp_path / "hang")
    # a DataServer whose worker process is started (and warmed by a first pass) before the
    # timed loader runs, so the timeout measures the hang, not the process's start
    with datahelix.start_cluster(dataset=Slow(flag), workers=1) as cluster:
        kw = dict(batch_size=BATCH, shuffle=False, plan="count", coordinator=cluster.endpoint)
        with datahelix.DataLoader(dataset=Slow(flag), **kw) as dl:
            assert len(list(dl)) == N // BATCH
        open(flag, "w").close()
        with datahelix.DataLoader(dataset=Slow(flag), timeout=1.5, **kw) as dl:
            it = iter(dl)
            assert _indices(next(it)) == [0, 1, 2, 3]
            t0 = time.monotonic()
            with pytest.raises(datahelix.TimeoutError) as e:
                next(it)
            assert 1.4 < time.monotonic() - t0 < 10
            assert isinstance(e.value, TimeoutError) and "1500 ms" in str(e.value)


def test_torch_names_and_the_refused_arguments(datahelix):
    ds = Draws()
    for kw, what in ((dict(sampler=[0, 1]), "sampler"),
                     (dict(batch_sampler=[[0, 1]]), "batch_sampler"),
                     (dict(multiprocessing_context="fork"), "multiprocessing_context"),
                     (dict(in_order=False), "in_order"),
                     (dict(workers=2, num_workers=3), "num_workers"),
                     (dict(seed=1, generator=torch.Generator().manual_seed(2)), "generator")):
        with pytest.raises(datahelix.InvalidArgumentError, match=what):
            datahelix.DataLoader(ds, batch_size=2, **kw)
    with pytest.raises(datahelix.InvalidArgumentError, match="batch_size=4 by keyword"):
        datahelix.DataLoader(ds, 4)
    # the generator's seed is the loader's; prefetch_factor x workers is the prefetch
    with datahelix.DataLoader(ds, batch_size=2, generator=torch.Generator().manual_seed(9),
                              num_workers=2, prefetch_factor=3) as dl:
        assert dl.seed == 9 and dl.prefetch == 6
    # pin_memory without CUDA: a warning, and the loader goes on
    if not torch.cuda.is_available():
        from datahelix import _torch_args
        _torch_args._pin_warned = False  # said once per process: again for this test
        with pytest.warns(UserWarning, match="pin_memory"):
            dl = datahelix.DataLoader(ds, batch_size=2, pin_memory=True)
        dl.close()
    # the documented different defaults: shuffle on, drop_last on
    import inspect
    params = inspect.signature(datahelix.DataLoader).parameters
    assert params["shuffle"].default is True and params["drop_last"].default is True


def test_drop_last_false_covers_the_epoch_as_distributed_samplers(datahelix):
    """13 samples, 2 ranks, batch 2, no shuffle: torch's DistributedSampler(drop_last=False)
    pads the epoch with its first sample and every rank gets 4 batches; so does datahelix,
    which flags the pad in batch["padded"] (torch's pad cannot be told apart)."""
    n, ranks, batch = 13, 2, 2
    torch_rows, torch_batches = [], []
    for r in range(ranks):
        s = torch.utils.data.DistributedSampler(Draws(n, torch_info=True), num_replicas=ranks,
                                                rank=r, shuffle=False, drop_last=False)
        tl = torch.utils.data.DataLoader(Draws(n, torch_info=True), batch_size=batch,
                                         sampler=s, num_workers=0)
        got = [_indices(b) for b in tl]
        torch_batches.append(len(got))
        torch_rows += [i for b in got for i in b]
    ds = Draws(n)
    with datahelix.start_cluster(dataset=ds, workers=WORKERS) as cluster:
        dls = [datahelix.DataLoader(dataset=ds, batch_size=batch, shuffle=False, plan="count",
                                    drop_last=False, coordinator=cluster.endpoint, rank=r,
                                    world_size=ranks, timeout=120) for r in range(ranks)]
        its = [iter(dl) for dl in dls]
        helix_rows, pads = [], []
        for _ in range(len(dls[0])):
            for it in its:
                b = next(it)
                helix_rows += _indices(b)
                pads += [i for i, p in zip(_indices(b), b["padded"].tolist()) if p]
        for it in its:
            with pytest.raises(StopIteration):
                next(it)
        helix_batches = [len(dl) for dl in dls]
        for dl in dls:
            dl.close()
    assert torch_batches == helix_batches == [4, 4]
    assert sorted(helix_rows) == sorted(torch_rows) == sorted(list(range(n)) + [0])
    assert pads == [0]
