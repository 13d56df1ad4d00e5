"""Map-style datasets the Python-dataset tests run in DataServer worker processes (a module of
its own, so that the workers import it by name and not the test module)."""
import os
import time

import numpy as np


def clip(i):
    """Sample i's video: 2..5 frames of 6 x 8 RGB, bytes a function of i."""
    t = 2 + i % 4
    rng = np.random.default_rng(i)
    return rng.integers(0, 255, size=(t, 6, 8, 3), dtype=np.uint8)


class Clips:
    """{"video": uint8 T x H x W x 3, "caption": str, "label": int}; index `fail` raises,
    index `wrong` returns a list, index `hang` never returns; each sample sleeps `sleep_s` (so
    tasks are in flight)."""

    def __init__(self, n=24, fail=-1, wrong=-1, sleep_s=0.0, hang=-1):
        self.n, self.fail, self.wrong, self.sleep_s = n, fail, wrong, sleep_s
        self.hang = hang

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.hang:
            time.sleep(3600)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if i == self.fail:
            raise ValueError(f"cannot read clip {i}")
        if i == self.wrong:
            return [i]
        return {"video": clip(i), "caption": f"clip number {i}", "label": i * 10}


class WhoAmI:
    """Each sample says which worker process made it (datahelix.get_worker_info) and the
    worker's first random draw (per-worker seeding) and its worker_init_fn mark."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        import datahelix
        info = datahelix.get_worker_info()
        return {"x": np.full(3, i, np.int32), "worker": info.id, "pid": os.getpid(),
                "seed": info.seed, "mark": os.environ.get("DH_TEST_MARK", "")}


def mark_worker(worker_id):
    os.environ["DH_TEST_MARK"] = f"init-{worker_id}"


class Costly:
    """Sleeps a per-index cost; estimate_cost tells it when `tell` (the bench's dataset)."""

    def __init__(self, n=32, tell=True):
        self.n, self.tell = n, tell

    def cost(self, i):
        return 0.002 * (1 + (i * 7) % 5)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.cost(i))
        return {"x": np.full(4 * (1 + i % 3), i, np.float32)}

    def estimate_cost(self, i):
        return {"cpu_s": self.cost(i), "tokens": 4 * (1 + i % 3), "out_bytes": 16 * (1 + i % 3)}


def make_clips():
    """A factory for `datahelix server --dataset pydatasets:make_clips`."""
    return Clips(n=24)


class IntoSlabs:
    """The zero-copy form: sample_spec(i) declares the arrays (ArraySpec) and the other
    values, load_into(i, arrays) writes the arrays into the batch's slab rows. Index `fail`
    raises in load_into, index `hang` never returns from it."""

    def __init__(self, n=16, fail=-1, hang=-1):
        self.n, self.fail, self.hang = n, fail, hang
        self.pointers = []

    def __len__(self):
        return self.n

    def sample_spec(self, i):
        import datahelix
        return {"video": datahelix.ArraySpec(clip(i).shape, "uint8"),
                "caption": f"clip number {i}", "label": i * 10}

    def load_into(self, i, arrays):
        if i == self.hang:
            time.sleep(3600)
        if i == self.fail:
            raise OSError(f"clip {i} is unreadable")
        out = arrays["video"]
        out[...] = clip(i)  # a decoder would write here directly
        out.flags.writeable = True


PATTERN = b"PIXELS-PIXELS-PX"  # 16 bytes no message header or key carries


class Pattern:
    """Images made of PATTERN repeated (64 x 64 bytes each): a tcp capture of a batch in
    plaintext contains it (tests/python/test_security.py)."""

    def __init__(self, n=12):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import numpy as np
        return {"image": np.frombuffer(PATTERN * 256, dtype=np.uint8).reshape(64, 64).copy(),
                "label": i}


def make_pattern():
    """A factory for `datahelix server --dataset pydatasets:make_pattern`."""
    return Pattern()


def collate_hangs_on_label_40(samples):
    """A collate_fn that never returns for a batch holding the sample of label 40 (Clips[4])."""
    if any(s["label"] == 40 for s in samples):
        time.sleep(3600)
    return {"label": np.array([s["label"] for s in samples], dtype=np.int64)}


def make_hanging_clips():
    """A factory for tests/runtime/test_dataserver_pyworker.c: Clips whose index 2 never returns."""
    return Clips(n=8, hang=2)
