"""The default collate's structure check, shared by the worker process (python/datahelix/
_worker.py) and ``datahelix.default_collate``, and the names the loader reserves for its own
metadata (docs/datasets.md, "The default collate"; docs/python.md, "A batch's keys").

A batch's structure is, per key, its kind (array, scalar, str, other), dtype and rank, and the
batch's key set. It is taken from the structure the worker process already delivered (its
earlier batches) where it knows one, else from the batch's own majority (a tie goes to the
richer kind: array over scalar over str over other), never from whichever sample happens to
come first; every sample is then checked against it, and one that differs fails alone with a
message naming its slot, the key and both types. So a batch's key never changes type because
one sample was odd: a str among arrays fails that sample, wherever it sits in the batch.
Cost: one pass over the samples' values (no copy), before anything is written.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _C

# The dtypes a Python dataset's arrays may have: those of the C table (DH_DTYPE_MAP, as
# _C.DTYPES) that numpy has, i.e. that have a buffer-protocol format (not bfloat16).
DTYPES = frozenset(name for name, (_code, _size, fmt) in _C.DTYPES.items() if fmt)

# The loader's own metadata: always at batch["__datahelix__"][name], and at batch[name] too
# unless the dataset has a key of that name (the dataset's key wins there; docs/python.md).
META_KEY = "__datahelix__"
LOADER_KEYS = ("sample_ids", "errors", "info", "indices", "tokens", "captions", "padded")
# Names the worker's own transport uses (the JSON rows' array, their cost fields): a dataset
# key with one of them fails its sample, as it could not reach the batch intact.
RESERVED = frozenset({META_KEY, "__meta__", "__cpu_s", "__bytes"})

# kinds, richest first (a tie between two kinds of one key goes to the richer one: a str where
# the others have arrays is the usual mistake, an array where the others have str is not)
_RANK = {"array": 0, "scalar": 1, "str": 2, "other": 3}


class SampleError(Exception):
    """A sample the batch cannot carry (wrong type, keys unlike the batch's)."""


def as_array(value: Any) -> Optional[np.ndarray]:
    """The value as a numpy array, or None when it is not an array."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return None


def scalar_dtype(value: Any) -> Optional[str]:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    return None


# A value's signature: (kind, dtype, rank). Kinds: "array" (rank >= 1), "scalar" (a Python
# bool/int/float or a 0-d array: both become one B-long array), "str", "other" (lists,
# dicts, ...: JSON rows), "none" (None: fits any str or other key, an optional value).
Sig = Tuple[str, str, int]


def signature(value: Any) -> Sig:
    arr = as_array(value)
    if arr is not None:
        return ("array" if arr.ndim else "scalar", arr.dtype.name, arr.ndim)
    sdt = scalar_dtype(value)
    if sdt is not None:
        return ("scalar", sdt, 0)
    if value is None:
        return ("none", "", 0)
    if isinstance(value, str):
        return ("str", "", 0)
    return ("other", "", 0)


def describe(value: Any) -> str:
    """How a message names a value's type: ``str``, ``ndarray uint8 rank 3``, ``int``."""
    arr = as_array(value)
    name = type(value).__name__
    if arr is not None:
        return f"{name} {arr.dtype.name} rank {arr.ndim}"
    return name


def describe_sig(sig: Sig) -> str:
    kind, dtype, rank = sig
    if kind == "array":
        return f"arrays {dtype} rank {rank}"
    if kind == "scalar":
        return {"bool": "bool", "int64": "int", "float64": "float"}.get(dtype, f"{dtype} scalars")
    return {"str": "str", "other": "values that are not arrays (lists, dicts)",
            "none": "None"}[kind]


def fits(sig: Sig, ref: Sig) -> bool:
    if sig == ref:
        return True
    value_kinds = ("str", "other", "none")
    return (sig[0] == "none" and ref[0] in value_kinds) or (ref[0] == "none" and
                                                           sig[0] in value_kinds)


class Structure:
    """What a worker process has delivered so far: the key set and each key's signature
    (None kinds are not remembered: None is no evidence of a key's type)."""

    def __init__(self) -> None:
        self.keys: Optional[Tuple[str, ...]] = None
        self.sigs: Dict[str, Sig] = {}


def _majority(items: List[Any], rank: Any = None) -> Any:
    counts = Counter(items)
    best = max(counts.values())
    tied = [x for x in counts if counts[x] == best]  # in first-seen order
    if rank is not None and len(tied) > 1:
        tied.sort(key=rank)
    return tied[0]


def check(samples: List[Optional[Dict[str, Any]]], known: Optional[Structure] = None
          ) -> Tuple[Dict[str, Sig], Dict[str, Tuple[int, ...]], Dict[int, str]]:
    """The batch's structure and the samples that do not fit it: (key -> signature in the
    samples' key order, key -> trailing shape of each array key, slot -> message). None
    samples (failed already) are left alone. `known` (the structure of earlier batches) is
    the reference where it has one; it is not updated here (see `remember`)."""
    failures: Dict[int, str] = {}
    live = [k for k, s in enumerate(samples) if s is not None]
    for k in live:
        s = samples[k]
        assert s is not None
        for key in s:
            if not isinstance(key, str):
                failures[k] = f"key {key!r} is {type(key).__name__}; a sample's keys are str"
                break
            if key in RESERVED:
                failures[k] = (f"key '{key}' is reserved for the loader's own use "
                               f"(docs/python.md, \"A batch's keys\"): rename it")
                break
    live = [k for k in live if k not in failures]
    if not live:
        return {}, {}, failures
    keysets = {k: tuple(samples[k]) for k in live}  # type: ignore[arg-type]
    if known is not None and known.keys is not None:
        ref_keys, whose = set(known.keys), "earlier batches had"
        order: Tuple[str, ...] = known.keys
    else:
        order = _majority([tuple(sorted(ks)) for ks in keysets.values()],
                          rank=lambda ks: -len(ks))
        ref_keys, whose = set(order), "the batch's other samples have"
        order = next(ks for ks in keysets.values() if set(ks) == ref_keys)
    for k in live:
        have = set(keysets[k])
        if have != ref_keys:
            parts = []
            if ref_keys - have:
                parts.append(f"lacks {sorted(ref_keys - have)}")
            if have - ref_keys:
                parts.append(f"has {sorted(have - ref_keys)} besides")
            failures[k] = (f"has keys {sorted(have)} ({', '.join(parts)}); {whose} "
                           f"{sorted(ref_keys)}")
    live = [k for k in live if k not in failures]
    sigs: Dict[str, Sig] = {}
    trailing: Dict[str, Tuple[int, ...]] = {}
    for key in order:
        if not live:
            break
        vals = {k: samples[k][key] for k in live}  # type: ignore[index]
        ss = {k: signature(v) for k, v in vals.items()}
        if known is not None and key in known.sigs:
            ref, whose = known.sigs[key], "earlier batches had"
        else:
            evidence = [s for s in ss.values() if s[0] != "none"]
            ref = _majority(evidence, rank=lambda s: _RANK[s[0]]) if evidence else \
                ("none", "", 0)
            whose = "the batch's other samples have"
        for k, sig in ss.items():
            if not fits(sig, ref):
                failures[k] = f"key '{key}' is {describe(vals[k])}, {whose} {describe_sig(ref)}"
        if ref[0] in ("array", "scalar") and ref[1] not in DTYPES:
            for k, sig in ss.items():
                if sig == ref:
                    failures[k] = (f"key '{key}' has dtype {ref[1]}; DataHelix carries "
                                   f"{', '.join(sorted(DTYPES))}")
        live = [k for k in live if k not in failures]
        if ref[0] == "array" and live:
            shapes = {k: tuple(as_array(vals[k]).shape[1:]) for k in live}  # type: ignore[union-attr]
            want = _majority(list(shapes.values()))
            for k, shape in shapes.items():
                if shape != want:
                    failures[k] = (f"key '{key}' has shape {list(as_array(vals[k]).shape)}, "
                                   f"the batch's other samples [*, {', '.join(map(str, want))}]"
                                   f" (only the leading dimension may vary; give a collate_fn "
                                   f"for anything else)")
            trailing[key] = want
            live = [k for k in live if k not in failures]
        sigs[key] = ref
    for key, ref in sigs.items():
        if ref[0] == "array" and f"{key}_mask" in sigs:
            for k in live:
                failures[k] = (f"key '{key}_mask' collides with the mask the default collate "
                               f"makes for the array '{key}': rename it, or give a collate_fn")
            live = []
    if not live:
        return {}, {}, failures
    return sigs, trailing, failures


def remember(known: Structure, sigs: Dict[str, Sig]) -> None:
    """Records a delivered batch's structure as the reference for the next ones."""
    if not sigs:
        return
    if known.keys is None:
        known.keys = tuple(sigs)
    for key, sig in sigs.items():
        if sig[0] != "none":
            known.sigs.setdefault(key, sig)


def row_keys(rows: List[Dict[str, Any]]) -> List[str]:
    """The dataset keys of a batch's JSON rows, in first-seen order over all rows (a failed
    sample's row is empty: the keys cannot be read from one row), less the worker's own."""
    keys: Dict[str, None] = {}
    for r in rows:
        for k in r:
            if k not in RESERVED:
                keys[k] = None
    return list(keys)
