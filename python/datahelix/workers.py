"""The DataServer's Python worker processes as the training process sees them, in torch's
terms: ``get_worker_info`` (inside a worker), ``default_collate`` (what a worker makes of a
list of samples)."""

from __future__ import annotations

from typing import Any, Dict, List

from ._C import DatasetError


def get_worker_info() -> Any:
    """Inside a DataServer's Python worker process: its WorkerInfo (id, num_workers, seed,
    dataset), as ``torch.utils.data.get_worker_info()``; None elsewhere."""
    from . import _worker
    return _worker.get_worker_info()


def default_collate(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    """What a DataServer's worker makes of a list of sample dicts when the loader has no
    collate_fn, as numpy arrays (for a custom collate_fn to start from): same-shape arrays
    stacked, a varying leading dimension padded with ``NAME_mask``, bool/int/float as
    arrays, anything else as a list. The same checks as the worker's: a sample whose key set,
    or a key's kind, dtype, rank or trailing dimensions differ from the batch's (its
    majority, wherever the odd sample sits) raises DatasetError naming the sample's index in
    the list, the key and both types (docs/datasets.md, "The default collate")."""
    import numpy as np
    from . import _worker
    from ._collate import row_keys
    samples = list(samples)
    for k, s in enumerate(samples):
        if not isinstance(s, dict):
            raise DatasetError(f"sample {k} (batch slot {k}) is {type(s).__name__}; a sample "
                               f"is a dict of arrays (numpy or torch), str, int, float")
    plan, rows, failures = _worker.default_collate(samples)
    if failures:
        k = min(failures)
        raise DatasetError(f"sample {k} (batch slot {k}) does not fit the batch: {failures[k]}")
    out: Dict[str, Any] = {}
    for name, dtype, shape, fill in plan:
        arr = np.empty(shape, dtype=dtype)
        fill(arr)
        out[name] = arr
    for key in row_keys(rows):
        out[key] = [r.get(key) for r in rows]
    return out

