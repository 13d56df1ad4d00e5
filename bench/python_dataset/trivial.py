"""The trivial dataset of overhead.py: every sample the same ready 1 MiB uint8 array, flat
(1,048,576) or as 1024 x 1024 rows."""
import numpy as np


class Trivial:
    def __init__(self, n, rows=False):
        self.n = n
        self.rows = rows
        self.x = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.x is None:  # made in the worker process, once
            x = np.arange(1 << 20, dtype=np.uint32).astype(np.uint8)
            self.x = x.reshape(1024, 1024) if self.rows else x
        return {"x": self.x}
