"""The dataset of `datahelix bench --python-dataset` (docs/benchmarks.md, "A Python
dataset"): pure Python that sleeps a per-index cost, heavy-tailed as video decode is (most
samples short, a few ten times longer), and returns that many tokens' worth of array (cost
and tokens go together, as a long clip costs more to decode and carries more tokens)."""
import time

import numpy as np


class Sleepy:
    def __init__(self, n=1024, seed=1, base_s=0.004):
        rng = np.random.default_rng(seed)
        self.cost = base_s * np.minimum(rng.lognormal(0.0, 1.0, size=n), 30.0)
        self.tokens = np.maximum(1, (self.cost / base_s * 256).astype(np.int64))

    def __len__(self):
        return len(self.cost)

    def __getitem__(self, i):
        time.sleep(float(self.cost[i]))
        return {"x": np.zeros((int(self.tokens[i]), 4), np.float16)}

    def estimate_cost(self, i):
        return {"cpu_s": float(self.cost[i]), "tokens": int(self.tokens[i]),
                "out_bytes": int(self.tokens[i]) * 8}


def make():
    return Sleepy()
