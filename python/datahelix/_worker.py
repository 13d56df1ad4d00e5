"""A DataServer's Python worker process: runs the user's map-style Dataset (docs/datasets.md,
"Your own Dataset"; the C side is src/runtime/dataserver_pyworker.c, which starts this module as
``python -m datahelix._worker`` with its socket as fd DATAHELIX_WORKER_FD).

Per request: ``dataset[i]`` for each sample (timed), the batch collated as a plan of arrays
(name, dtype, shape and how to fill it), the plan's shapes sent to the DataServer
(``alloc``), which answers with where each array goes (``write``: an offset in the arena
memfd or in this worker's scratch memfd, both passed once by SCM_RIGHTS); each array is then
written straight into its slab (the one copy), and ``done`` sent. Values that are not
arrays (str, None, lists, dicts) travel as one JSON row per sample in the ``__meta__`` array,
with the sample's measured cost.
"""

from __future__ import annotations

import importlib
import json
import mmap
import os
import pickle
import random
import signal
import socket
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ._collate import (DTYPES, SampleError, Structure, as_array, check, remember,
                       scalar_dtype)
from ._spec import ArraySpec

MSG_CAP = 200 << 10  # stay under the DataServer's 256 KiB limit
ERROR_CAP = 4000  # characters of one sample's error kept (the traceback's end)
META = "__meta__"


class WorkerInfo:
    """What ``datahelix.get_worker_info()`` returns inside a worker process (as
    ``torch.utils.data.get_worker_info()``): id, num_workers, seed, dataset."""

    def __init__(self, id: int, num_workers: int, seed: int, dataset: Any) -> None:
        self.id = id
        self.num_workers = num_workers
        self.seed = seed
        self.dataset = dataset

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed})"


_info: Optional[WorkerInfo] = None


def get_worker_info() -> Optional[WorkerInfo]:
    return _info


def _trim(text: str, cap: int = ERROR_CAP) -> str:
    return text if len(text) <= cap else "..." + text[-(cap - 3):]


_as_array = as_array
_scalar_dtype = scalar_dtype


def _check_dtype(name: str, arr: np.ndarray) -> str:
    dt = arr.dtype.name
    if dt not in DTYPES:
        raise SampleError(f"array '{name}' has dtype {dt}; DataHelix carries "
                          f"{', '.join(sorted(DTYPES))}")
    return dt


Plan = List[Tuple[str, str, Tuple[int, ...], Callable[[np.ndarray], None]]]


def default_collate(samples: List[Optional[Dict[str, Any]]],
                    known: Optional[Structure] = None
                    ) -> Tuple[Plan, List[Dict[str, Any]], Dict[int, str]]:
    """The batch plan of a list of sample dicts (None: a failed sample, whose slot is zeros),
    and the samples that do not fit the batch (slot -> why; their slots are zeros too).

    Arrays are stacked along a new first dimension (B x shape), their leading dimension
    padded to the batch's longest, with ``NAME_mask`` (bool B x L) true where a row is real;
    bool, int and float become B-long bool, int64 and float64 arrays; every other value
    (str, None, lists, dicts) goes to the sample's JSON row. Every array of one or more
    dimensions gets its mask, varying or not, so a batch's keys do not depend on its draw.
    The batch's structure (key set; per key kind, dtype, rank; an array's trailing
    dimensions) is `known`'s where it has one, else the batch's majority (_collate.check):
    a sample unlike it is left out of the plan and named in the failures, wherever it sits;
    what the batch carries becomes part of `known`."""
    b = len(samples)
    sigs, trailing, failures = check(samples, known)
    if known is not None:
        remember(known, sigs)
    samples = [None if k in failures else s for k, s in enumerate(samples)]
    rows: List[Dict[str, Any]] = [{} for _ in range(b)]
    plan: Plan = []
    for key, (kind, dt, _rank) in sigs.items():
        if kind == "array":
            arrs = [None if s is None else _as_array(s[key]) for s in samples]
            longest = max(a.shape[0] for a in arrs if a is not None)
            shape = (b, longest) + trailing[key]

            def fill_padded(dest: np.ndarray, arrs: List[Optional[np.ndarray]] = arrs) -> None:
                for i, a in enumerate(arrs):
                    n = 0 if a is None else a.shape[0]
                    if n:
                        dest[i, :n] = a
                    if n < dest.shape[1]:
                        dest[i, n:] = 0

            def fill_mask(dest: np.ndarray, arrs: List[Optional[np.ndarray]] = arrs,
                          longest: int = longest) -> None:
                if all(a is not None and a.shape[0] == longest for a in arrs):
                    dest.fill(True)  # nothing padded: one pass
                    return
                for i, a in enumerate(arrs):
                    n = 0 if a is None else a.shape[0]
                    dest[i, :n] = True
                    dest[i, n:] = False
            plan.append((key, dt, shape, fill_padded))
            plan.append((f"{key}_mask", "bool", (b, longest), fill_mask))
        elif kind == "scalar":
            vals = [0 if s is None else s[key] for s in samples]

            def fill(dest: np.ndarray, vals: List[Any] = vals) -> None:
                for i, v in enumerate(vals):
                    dest[i] = v
            plan.append((key, dt, (b,), fill))
        else:
            for i, s in enumerate(samples):
                if s is not None:
                    rows[i][key] = s[key]
    return plan, rows, failures


def _plan_of_collated(out: Any, n: int) -> Tuple[Plan, List[Dict[str, Any]]]:
    """A user collate_fn's dict as a plan: arrays as they are; other values must be lists of
    one JSON value per collated sample (they go to the samples' rows)."""
    if not isinstance(out, dict):
        raise SampleError(f"collate_fn returned {type(out).__name__}; it must return a dict")
    plan: Plan = []
    rows: List[Dict[str, Any]] = [{} for _ in range(n)]
    for key, value in out.items():
        arr = _as_array(value)
        if arr is not None:
            dt = _check_dtype(key, arr)
            plan.append((key, dt, tuple(arr.shape),
                         lambda dest, arr=arr: np.copyto(dest, arr, casting="no")))
        elif isinstance(value, list) and len(value) == n:
            for i, v in enumerate(value):
                rows[i][key] = v
        else:
            raise SampleError(f"collate_fn's '{key}' is {type(value).__name__}: a value that is "
                              f"not an array must be a list with one entry per sample ({n})")
    return plan, rows


def _tokens(dataset: Any, index: int, sample: Dict[str, Any]) -> int:
    count = getattr(dataset, "count_tokens", None)
    if count is not None:
        return max(0, int(count(index, sample)))
    lead = 0
    biggest = -1
    for v in sample.values():
        a = _as_array(v)
        if a is not None and a.ndim > 0 and a.nbytes > biggest:
            biggest = a.nbytes
            lead = int(a.shape[0])
    return lead if biggest >= 0 else 1


def _seed_generators(seed: int) -> None:
    """Seeds Python's random, NumPy's global generator and torch (when imported), as
    torch's DataLoader seeds each worker."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def _sample_seed(base: int, index: int) -> int:
    """A sample's seed: splitmix64 of (base, index), in [0, 2^63)."""
    mask = (1 << 64) - 1
    x = (base ^ ((index * 0x9E3779B97F4A7C15) & mask)) & mask
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return (x ^ (x >> 31)) >> 1


def _spec_view(spec: ArraySpec) -> np.ndarray:
    """An ArraySpec as a read-only array of its shape and dtype over one element (strides 0):
    what _collate.check needs of it, at no memory cost (its dtype is checked already)."""
    return np.lib.stride_tricks.as_strided(np.zeros((), dtype=spec.dtype), shape=spec.shape,
                                           strides=(0,) * len(spec.shape), writeable=False)


def _index_of(desc: Dict[str, str]) -> int:
    uri = desc.get("uri", "")
    text = uri[6:] if uri.startswith("index:") else desc.get("id", "")
    return int(text)


class Worker:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.dataset: Any = None
        self.collate_fn: Optional[Callable[..., Any]] = None
        self.base_seed = 0
        self.maps: Dict[str, mmap.mmap] = {}
        self.fds: Dict[str, int] = {}
        self.known = Structure()  # what this process's batches carried (_collate.check)
        self.report_begin = True  # the task's "begin": the DataServer has a sample_timeout

    # -- messages -----------------------------------------------------------------------

    def send(self, msg: Dict[str, Any]) -> None:
        self.sock.send(json.dumps(msg, separators=(",", ":")).encode())

    def begin(self, slot: int, what: str, index: Any = "") -> None:
        """Tells the DataServer that the user's code starts for batch slot `slot` (-1: the
        batch's collate_fn): its sample_timeout counts from now (dataserver_pyworker.c)."""
        if self.report_begin:
            self.send({"op": "begin", "slot": slot, "what": what, "index": str(index)})

    def recv(self) -> Optional[Dict[str, Any]]:
        try:
            data, ancdata, _flags, _addr = self.sock.recvmsg(1 << 20, socket.CMSG_SPACE(8))
        except ConnectionResetError:  # the DataServer closed its end with our messages unread
            return None
        if not data:
            return None
        msg = json.loads(data)
        fds: List[int] = []
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(np.frombuffer(payload[: len(payload) - len(payload) % 4],
                                         dtype=np.int32).tolist())
        for name, fd in zip(msg.get("fds", []), fds):
            if name in self.fds:
                os.close(self.fds[name])
            self.fds[name] = fd
            self.maps.pop(name, None)
        return msg

    def mapping(self, name: str, size: int = 0) -> mmap.mmap:
        m = self.maps.get(name)
        if m is None or (size and len(m) < size):
            fd = self.fds[name]
            m = mmap.mmap(fd, size or os.fstat(fd).st_size)
            self.maps[name] = m
        return m

    # -- the life cycle -----------------------------------------------------------------

    def init(self, msg: Dict[str, Any]) -> None:
        global _info
        spec = msg["dataset"]
        worker_init_fn = None
        if spec.startswith("pickle:"):
            with open(spec[7:], "rb") as f:
                bundle = pickle.load(f)
            self.dataset = bundle["dataset"]
            self.collate_fn = bundle.get("collate_fn")
            worker_init_fn = bundle.get("worker_init_fn")
        else:
            module, _, attr = spec.partition(":")
            if not module or not attr:
                raise ValueError(f"dataset {spec!r}: expected MODULE:FACTORY")
            obj = getattr(importlib.import_module(module), attr)
            self.dataset = obj() if callable(obj) and not hasattr(obj, "__getitem__") else obj
        seed = int(msg["seed"])
        _seed_generators(seed)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)
        _info = WorkerInfo(int(msg["worker_id"]), int(msg["num_workers"]), seed, self.dataset)
        self.base_seed = seed - _info.id
        if worker_init_fn is not None:
            worker_init_fn(_info.id)

    def seed_sample(self, desc: Dict[str, Any], index: int) -> None:
        """Before a sample's __getitem__ / load_into: the task's base seed (its pass's, from
        the client: dh_rng_epoch_seed(loader seed, epoch)) becomes this worker's (WorkerInfo.seed
        = base + id, as torch's workers), and Python's random, NumPy's global generator and
        torch are seeded from (base, index): a sample's draws depend on the loader's seed, the
        epoch and the sample, not on which worker loads it or what it loaded before
        (docs/datasets.md, "Randomness")."""
        base = desc.get("seed")
        if base is None or _info is None:
            return
        base = int(base)
        if base != self.base_seed:
            self.base_seed = base
            _info.seed = base + _info.id
        _seed_generators(_sample_seed(base, index))

    def run_task(self, descs: List[Dict[str, str]]) -> None:
        if self.collate_fn is None and hasattr(self.dataset, "sample_spec") and \
                hasattr(self.dataset, "load_into"):
            self.run_task_direct(descs)
            return
        n = len(descs)
        samples: List[Optional[Dict[str, Any]]] = [None] * n
        results: List[Dict[str, Any]] = [{} for _ in range(n)]
        indices: List[int] = []
        for k, d in enumerate(descs):
            t0 = time.perf_counter()
            index = -1
            if "failed" in d:  # it ran past sample_timeout in a process killed for it
                results[k]["error"] = str(d["failed"])
                results[k]["cpu_s"] = 0.0
                continue
            try:
                index = _index_of(d)
                indices.append(index)
                self.seed_sample(d, index)
                self.begin(k, "__getitem__", index)
                value = self.dataset[index]
                if not isinstance(value, dict):
                    raise SampleError(
                        f"returned {type(value).__name__}; a sample is a dict of arrays (numpy "
                        f"or torch), str, int, float")
                samples[k] = value
                results[k]["tokens"] = _tokens(self.dataset, index, value)
            except BaseException as e:  # noqa: BLE001  (user code: anything is reported)
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                results[k]["error"] = self._error(d, index, e)
            results[k]["cpu_s"] = time.perf_counter() - t0
        plan, rows, samples = self._collate(descs, samples, results)
        for k in range(n):
            rows[k]["__cpu_s"] = results[k]["cpu_s"]
            if samples[k] is not None:
                rows[k]["__bytes"] = sum(a.nbytes for a in (_as_array(v) for v in samples[k].values())
                                         if a is not None)
        encoded = [json.dumps(r, separators=(",", ":"), default=_json_default).encode()
                   for r in rows]
        width = max((len(e) for e in encoded), default=0)

        def fill_meta(dest: np.ndarray) -> None:
            dest[:] = 0
            for i, e in enumerate(encoded):
                dest[i, : len(e)] = np.frombuffer(e, dtype=np.uint8)
        plan.append((META, "uint8", (n, width), fill_meta))
        self.exchange(plan, results)

    def _send_capped(self, msg: Dict[str, Any], results: List[Dict[str, Any]]) -> None:
        text = json.dumps(msg, separators=(",", ":"))
        cap = ERROR_CAP
        while len(text) > MSG_CAP and cap > 100:  # many long tracebacks: keep their ends
            cap //= 2
            for r in results:
                if "error" in r:
                    r["error"] = _trim(r["error"], cap)
            text = json.dumps(msg, separators=(",", ":"))
        self.sock.send(text.encode())

    def exchange(self, plan: Plan, results: List[Dict[str, Any]],
                 after: Optional[Callable[[Dict[str, np.ndarray]], None]] = None) -> None:
        """Sends the plan's shapes (alloc), fills each array where the DataServer put it,
        then `after(dests)` (the direct path's loads, which update `results`), and says done
        (with the samples' results when `after` ran)."""
        self._send_capped({"op": "alloc",
                           "tensors": [{"name": p[0], "dtype": p[1], "shape": list(p[2])}
                                       for p in plan],
                           "samples": results}, results)
        answer = self.recv()
        if answer is None:
            sys.exit(0)
        dests: Dict[str, np.ndarray] = {}
        try:
            for (name, dt, shape, fill), at in zip(plan, answer.get("tensors", [])):
                where = at["in"]
                if where == "none":
                    dests[name] = np.zeros(shape, dtype=dt)
                    continue
                size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                m = self.mapping(where, int(answer.get("scratch_bytes", 0)) if where == "scratch"
                                 else 0)
                dest = np.ndarray(shape, dtype=dt, buffer=m, offset=int(at["offset"]))
                assert dest.nbytes == size
                if fill is not None:
                    fill(dest)
                dests[name] = dest
            if after is not None and len(dests) == len(plan):
                after(dests)
        except Exception:  # noqa: BLE001
            self.send({"op": "error", "error": _trim(traceback.format_exc())})
            return
        if after is not None and len(dests) == len(plan):
            self._send_capped({"op": "done", "samples": results}, results)
        else:
            self.send({"op": "done"})

    def run_task_direct(self, descs: List[Dict[str, str]]) -> None:
        """A dataset with sample_spec(i) and load_into(i, arrays): the specs give the batch's
        shapes, the DataServer places the batch, and load_into writes each sample's arrays
        into its rows of the slabs: no copy of the sample's bytes on this side."""
        n = len(descs)
        specs: List[Optional[Dict[str, Any]]] = [None] * n
        results: List[Dict[str, Any]] = [{"cpu_s": 0.0} for _ in range(n)]
        indices = [-1] * n
        for k, d in enumerate(descs):
            t0 = time.perf_counter()
            if "failed" in d:  # it ran past sample_timeout in a process killed for it
                results[k]["error"] = str(d["failed"])
                continue
            try:
                indices[k] = _index_of(d)
                self.begin(k, "sample_spec", indices[k])
                spec = self.dataset.sample_spec(indices[k])
                if not isinstance(spec, dict):
                    raise SampleError(f"sample_spec returned {type(spec).__name__}, not a dict")
                for key, v in spec.items():
                    if isinstance(v, ArraySpec) and v.dtype not in DTYPES:
                        raise SampleError(f"array '{key}' has dtype {v.dtype}; DataHelix "
                                          f"carries {', '.join(sorted(DTYPES))}")
                specs[k] = spec
            except BaseException as e:  # noqa: BLE001
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                results[k]["error"] = self._error(d, indices[k], e, "sample_spec")
            results[k]["cpu_s"] = time.perf_counter() - t0
        # the batch's structure, as the default collate's (_collate.check: the majority or
        # what this process delivered before, not the first sample); a sample unlike it
        # fails alone
        views = [None if s is None else {key: _spec_view(v) if isinstance(v, ArraySpec) else v
                                         for key, v in s.items()} for s in specs]
        sigs, _trailing, failures = check(views, self.known)
        for k, why in failures.items():
            results[k]["error"] = _trim(f"{self._head(descs[k], indices[k])} (batch slot {k}) "
                                        f"does not fit the batch: {why}")
            specs[k] = None
        first = next((s for s in specs if s is not None), None)
        arrays = [key for key in sigs if isinstance(first[key], ArraySpec)] if first else []
        for k, s in enumerate(specs):
            if s is not None and not all(isinstance(s[a], ArraySpec) for a in arrays):
                bad = next(a for a in arrays if not isinstance(s[a], ArraySpec))
                results[k]["error"] = _trim(
                    f"{self._head(descs[k], indices[k])} (batch slot {k}) does not fit the "
                    f"batch: key '{bad}' is {type(s[bad]).__name__}, the batch's other samples "
                    f"have an ArraySpec")
                specs[k] = None
        first = next((s for s in specs if s is not None), None)
        if first is not None:
            remember(self.known, sigs)
        values = [None if s is None else {key: v for key, v in s.items()
                                          if not isinstance(v, ArraySpec)} for s in specs]
        plan: Plan
        if first is None:
            plan, rows = [], [{} for _ in range(n)]
            arrays = []
        else:
            plan, rows, _ = default_collate(values) if any(v for v in values if v) else \
                ([], [{} for _ in range(n)], {})
        lengths: Dict[str, List[int]] = {}
        for a in arrays:
            assert first is not None
            fs = first[a]
            if not fs.shape:
                plan.append((a, fs.dtype, (n,), None))
                continue
            lens = [0 if s is None else s[a].shape[0] for s in specs]
            lengths[a] = lens
            plan.append((a, fs.dtype, (n, max(lens)) + fs.shape[1:], None))

            def fill_mask(dest: np.ndarray, lens: List[int] = lens) -> None:
                for i, ln in enumerate(lens):
                    dest[i, :ln] = True
                    dest[i, ln:] = False
            plan.append((f"{a}_mask", "bool", (n, max(lens)), fill_mask))
        # the JSON rows: known now but for the measured cost, written after the loads; the
        # width reserves room for the two numbers
        encoded = [json.dumps(r, separators=(",", ":"), default=_json_default).encode()
                   for r in rows]
        width = max((len(e) for e in encoded), default=0) + 64
        plan.append((META, "uint8", (n, width), None))

        def write_meta(dest: np.ndarray) -> None:
            dest[:] = 0
            for i, r in enumerate(rows):
                r["__cpu_s"] = float(results[i]["cpu_s"])
                if specs[i] is not None and "error" not in results[i]:
                    r["__bytes"] = int(sum(int(np.prod(specs[i][a].shape, dtype=np.int64)) *
                                           np.dtype(specs[i][a].dtype).itemsize
                                           for a in arrays))
                e = json.dumps(r, separators=(",", ":"), default=_json_default).encode()
                dest[i, : len(e)] = np.frombuffer(e[:width], dtype=np.uint8)

        def load(dests: Dict[str, np.ndarray]) -> None:
            for k in range(n):
                if specs[k] is None:
                    for a in arrays:
                        dests[a][k] = 0
                    continue
                views = {}
                for a in arrays:
                    if a in lengths:
                        ln = lengths[a][k]
                        dests[a][k, ln:] = 0
                        views[a] = dests[a][k, :ln]
                    else:
                        views[a] = dests[a][k]
                t0 = time.perf_counter()
                try:
                    self.seed_sample(descs[k], indices[k])
                    self.begin(k, "load_into", indices[k])
                    self.dataset.load_into(indices[k], views)
                    biggest = max(views.values(), key=lambda v: v.nbytes, default=None)
                    count = getattr(self.dataset, "count_tokens", None)
                    results[k]["tokens"] = int(count(indices[k], views)) if count else (
                        int(biggest.shape[0]) if biggest is not None and biggest.ndim else 1)
                except BaseException as e:  # noqa: BLE001
                    if isinstance(e, (KeyboardInterrupt, SystemExit)):
                        raise
                    results[k]["error"] = self._error(descs[k], indices[k], e, "load_into")
                    for a in arrays:
                        dests[a][k] = 0
                    if lengths:
                        for a in lengths:
                            dests[f"{a}_mask"][k] = False
                results[k]["cpu_s"] += time.perf_counter() - t0
            write_meta(dests[META])
        self.exchange(plan, results, after=load)

    def _error(self, desc: Dict[str, str], index: int, e: BaseException, where: str = "") -> str:
        idx = index if index >= 0 else desc.get("uri", "")[6:]
        head = f"sample '{desc.get('id', '')}' (dataset[{idx}])"
        if where:
            head += f" {where}"
        if isinstance(e, SampleError):
            return _trim(f"{head}: {e}")
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        return _trim(f"{head}: {type(e).__name__}: {e}\n{tb}")

    def _collate(self, descs: List[Dict[str, str]], samples: List[Optional[Dict[str, Any]]],
                 results: List[Dict[str, Any]]
                 ) -> Tuple[Plan, List[Dict[str, Any]], List[Optional[Dict[str, Any]]]]:
        """The batch's plan and JSON rows, and the samples it carries. A sample that does not
        fit the batch's structure fails alone (named, with its slot, the key and both types;
        its slot zeroed); a collate_fn (or collate) failure fails the batch's samples with one
        message naming all of them and the exception."""
        n = len(samples)
        empty: List[Dict[str, Any]] = [{} for _ in range(n)]
        try:
            if self.collate_fn is not None:
                ok = [k for k, s in enumerate(samples) if s is not None]
                if not ok:
                    return [], empty, samples
                self.begin(-1, "collate_fn")
                plan, ok_rows = _plan_of_collated(self.collate_fn([samples[k] for k in ok]),
                                                  len(ok))
                rows = [{} for _ in range(n)]
                for k, row in zip(ok, ok_rows):
                    rows[k] = row
                return plan, rows, samples
            self.begin(-1, "the default collate")
            plan, rows, failures = default_collate(samples, self.known)
        except BaseException as e:  # noqa: BLE001  (user code: anything is reported)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            message = self._batch_error(descs, samples, e)
            for k, s in enumerate(samples):
                if s is not None:
                    results[k]["error"] = message
            return [], empty, [None] * n
        for k, why in failures.items():
            results[k]["error"] = _trim(f"{self._head(descs[k], -1)} (batch slot {k}) does not "
                                        f"fit the batch: {why}")
        samples = [None if k in failures else s for k, s in enumerate(samples)]
        return plan, rows, samples

    def _batch_error(self, descs: List[Dict[str, str]],
                     samples: List[Optional[Dict[str, Any]]], e: BaseException) -> str:
        """One message for a failure of the batch as a whole (a collate_fn that raised or
        returned what cannot be placed): every sample it was given, by id and index, and the
        exception with its traceback; not one innocent sample."""
        given = [k for k, s in enumerate(samples) if s is not None]
        names = ", ".join(f"'{descs[k].get('id', '')}' (dataset[{_uri_index(descs[k])}])"
                          for k in given)
        left = [k for k in range(len(samples)) if k not in given]
        where = "collate_fn" if self.collate_fn is not None else "the default collate"
        head = f"{where} failed on the batch of samples {names}"
        if left:
            head += (" (left out, failed before: " +
                     ", ".join(f"'{descs[k].get('id', '')}'" for k in left) + ")")
        if isinstance(e, SampleError):
            return _trim(f"{head}: {e}")
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        return _trim(f"{head}: {type(e).__name__}: {e}\n{tb}")

    def _head(self, desc: Dict[str, str], index: int) -> str:
        idx = index if index >= 0 else _uri_index(desc)
        return f"sample '{desc.get('id', '')}' (dataset[{idx}])"


def _uri_index(desc: Dict[str, str]) -> str:
    uri = desc.get("uri", "")
    return uri[6:] if uri.startswith("index:") else desc.get("id", "")


def _json_default(value: Any) -> Any:
    a = _as_array(value)
    if a is not None:
        return a.tolist()
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return repr(value)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the DataServer's to handle
    fd = int(os.environ.get("DATAHELIX_WORKER_FD", "3"))
    sock = socket.socket(fileno=fd)
    worker = Worker(sock)
    msg = worker.recv()
    if msg is None:
        return
    try:
        worker.report_begin = bool(msg.get("begin", True))
        worker.begin(-3, "loading the dataset")  # its sample_timeout counts from here
        worker.init(msg)
    except BaseException as e:  # noqa: BLE001
        worker.send({"op": "fatal", "error": _trim(
            "".join(traceback.format_exception(type(e), e, e.__traceback__)), 16000)})
        return
    try:
        worker.send({"op": "ready"})
    except OSError:  # the DataServer stopped (or gave up on it) while it started
        return
    while True:
        msg = worker.recv()
        if msg is None or msg.get("op") == "exit":
            return
        if msg.get("op") == "task":
            worker.report_begin = bool(msg.get("begin", True))
            try:
                worker.run_task(msg["samples"])
            except (BrokenPipeError, ConnectionResetError):  # the DataServer closed its end
                return


if __name__ == "__main__":
    # `python -m datahelix._worker` runs this file as __main__; the state get_worker_info()
    # reads lives in the package's datahelix._worker, so that one runs
    from datahelix import _worker as _package_worker
    _package_worker.main()
    sys.stdout.flush()
    os._exit(0)
