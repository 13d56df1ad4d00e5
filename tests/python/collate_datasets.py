"""Datasets of tests/python/test_collate.py, run in DataServer worker processes (a module of its
own, so that the workers import it by name)."""
import numpy as np


def image(i):
    return np.full((4, 5, 3), i + 1, np.uint8)


class OddOne:
    """{"image": uint8 4x5x3, "label": int, "caption": str}; index `odd` has a str for its
    image (a path never loaded); the indices in `fail` raise in __getitem__."""

    def __init__(self, n=8, odd=-1, fail=()):
        self.n, self.odd, self.fail = n, odd, tuple(fail)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.fail:
            raise ValueError(f"cannot read image {i}")
        return {"image": f"img{i}.jpg" if i == self.odd else image(i), "label": i * 10,
                "caption": f"image {i}"}


def collate_failing_on_30(samples):
    """A user collate_fn that raises when the batch holds label 30 (index 3)."""
    labels = [s["label"] for s in samples]
    if 30 in labels:
        raise ValueError(f"boom on labels {labels}")
    return {"image": np.stack([s["image"] for s in samples]),
            "label": np.array(labels, np.int64), "caption": [s["caption"] for s in samples]}


class LoaderNames:
    """A dataset whose keys are the loader's metadata names: "tokens" (int64, 3 or 4 long),
    "errors" (str), "info" (int)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"tokens": np.arange(3 + i % 2, dtype=np.int64) + i, "errors": f"mine {i}",
                "info": i}
