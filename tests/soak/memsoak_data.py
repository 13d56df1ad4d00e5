"""The Python Dataset of the memory soak (tests/soak/memsoak.py), a module of its own so that
the sidecar's worker processes import it by name (`datahelix server --dataset
memsoak_data:make`)."""
import os

import numpy as np

SAMPLES = 96
FAIL_EVERY = 37  # index % 37 == 5 raises: the error path (traceback text, zeroed slot) too
# DH_MEMSOAK_LEAK_KB=N: each sample keeps N KiB alive for good, a planted leak that shows the
# check fails (docs/operations.md, "Memory over time")
LEAK_KB = int(os.environ.get("DH_MEMSOAK_LEAK_KB", "0"))
_kept = []


class Frames:
    """{"video": uint8 T x 48 x 64 x 3 (T 4..19), "feat": float32 (64..575), "caption": str,
    "label": int}: variable leading dimensions, so batches pad and the arena's slabs vary in
    size; bytes a function of the index."""

    def __init__(self, n=SAMPLES):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i % FAIL_EVERY == 5:
            raise ValueError(f"memsoak: sample {i} fails on purpose")
        if LEAK_KB:
            _kept.append(np.ones(LEAK_KB * 1024, np.uint8))
        rng = np.random.default_rng(i)
        t = 4 + i % 16
        video = rng.integers(0, 255, size=(t, 48, 64, 3), dtype=np.uint8)
        feat = rng.standard_normal(64 + (i * 7) % 512).astype(np.float32)
        return {"video": video, "feat": feat, "caption": f"sample {i} " + "x" * (i % 50),
                "label": i}


def make():
    """The factory the sidecar names."""
    return Frames()
