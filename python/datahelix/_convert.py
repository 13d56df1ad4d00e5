"""Each batch as the DataLoader yields it: a dict of the dataset's keys as torch tensors
and lists, then the loader's own metadata (docs/python.md, "A batch's keys")."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ._meta import join_meta

if TYPE_CHECKING:
    from . import _C


class BatchConverter:
    """Converts the batches of one DataLoader, remembering the dataset keys seen so a batch
    whose samples all failed gets the same keys, and the loader's names a dataset key shadows
    (warned once each)."""

    def __init__(self, dataset: bool, captions: Dict[str, str], meta: Any,
                 learned: Optional[Dict[str, Dict[str, float]]]) -> None:
        """``dataset``: the batches come from a Python dataset (else a manifest's, whose
        ``captions`` and ``meta`` columns join by sample id); ``learned``: the costs file's
        entries to fill from the samples' measured costs, or None when there is no costs
        file."""
        self._dataset = dataset
        self._captions = captions
        self._meta = meta
        self._learned = learned
        # the dataset keys seen in batches (name -> (dtype, shape, batch size) or None for
        # a list), and the loader's names a dataset key shadows
        self._keys_seen: Dict[str, Any] = {}
        self._shadowed: set = set()

    def __call__(self, batch: "_C.Batch") -> Dict[str, Any]:
        """The batch as a dict: the dataset's keys (tensors, lists), then the loader's own
        metadata (sample_ids, errors, info, tokens; indices with a Python dataset, captions
        without), always all of it at ``batch["__datahelix__"]`` and each also at its own
        name unless a dataset key has that name (the dataset's wins there; a warning says so
        once). With on_error="skip", keys a failed batch lacks (every sample of it failed,
        or its collate_fn) are filled from the earlier batches: zeros, masks false, lists of
        None (docs/python.md, "A batch's keys")."""
        import torch
        from ._collate import LOADER_KEYS, META_KEY, row_keys

        out: Dict[str, Any] = {}
        info = batch.info
        for name, tensor in batch.tensors().items():
            t = torch.from_dlpack(tensor)
            out[name] = t
            if name == "frames" or (self._dataset and "arena" not in info):
                # (base, bytes) of the shared-memory arena holding the frames (a Python
                # dataset's: its first array); None when they came by copy (a spilled batch)
                info["arena"] = tensor.arena()
        samples = batch.samples()
        ids = [s[0] for s in samples]
        loader: Dict[str, Any] = {}
        meta = out.pop("__meta__", None)
        if meta is not None:  # a Python dataset's other values, a JSON row per sample
            rows = self._meta_rows(meta, samples)
            for key in row_keys(rows):
                out[key] = [r.get(key) for r in rows]
            loader["indices"] = [int(i) for i in ids]
        loader["tokens"] = torch.tensor([s[1] for s in samples], dtype=torch.int64)
        loader["sample_ids"] = ids
        # drop_last=False: the pads of an epoch's last step (repeats of its first samples)
        loader["padded"] = torch.tensor(batch.padded(), dtype=torch.bool)
        if not self._dataset:
            loader["captions"] = [self._captions.get(i, "") for i in ids]
            join_meta(out, ids, self._meta)  # labels by id: tensors or lists (_meta.py)
        loader["errors"] = [s[3] for s in samples]
        loader["info"] = info
        out.pop(META_KEY, None)  # never a dataset's: the worker refuses the name
        if any(s[2] for s in samples):
            self._fill_missing(out, len(samples))
        self._learn_keys(out, len(samples))
        for name in LOADER_KEYS:
            if name not in loader:
                continue
            if name in out:
                if name not in self._shadowed:
                    self._shadowed.add(name)
                    import warnings
                    warnings.warn(f"the dataset has a key '{name}', which the loader also "
                                  f"gives: batch['{name}'] is the dataset's, the loader's is "
                                  f"batch['{META_KEY}']['{name}']", stacklevel=3)
            else:
                out[name] = loader[name]
        out[META_KEY] = loader
        return out

    def _learn_keys(self, out: Dict[str, Any], b: int) -> None:
        """Remembers each dataset key of a batch (a tensor's dtype and shape, or a list), for
        the batches whose samples all failed (_fill_missing)."""
        import torch
        for name, value in out.items():
            if isinstance(value, torch.Tensor):
                self._keys_seen[name] = (value.dtype, tuple(value.shape), b)
            else:
                self._keys_seen[name] = None

    def _fill_missing(self, out: Dict[str, Any], b: int) -> None:
        import torch
        for name, seen in self._keys_seen.items():
            if name in out:
                continue
            if seen is None:
                out[name] = [None] * b
                continue
            dtype, shape, seen_b = seen
            if shape and shape[0] == seen_b:  # a batch dimension: this batch's
                shape = (b,) + shape[1:]
            out[name] = torch.zeros(shape, dtype=dtype)

    def _meta_rows(self, meta: Any, samples: List[Any]) -> List[Dict[str, Any]]:
        raw = meta.numpy()
        rows = []
        for i in range(raw.shape[0]):
            text = raw[i].tobytes().rstrip(b"\0")
            rows.append(json.loads(text) if text else {})
        if self._learned is not None:
            for row, s in zip(rows, samples):
                if s[2] == 0 and "__cpu_s" in row:
                    self._learned[s[0]] = {"cpu_s": float(row["__cpu_s"]),
                                           "tokens": float(s[1]),
                                           "out_bytes": float(row.get("__bytes", 0))}
        return rows
