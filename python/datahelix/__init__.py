"""DataHelix in PyTorch training loops (docs/python.md).

    import datahelix
    loader = datahelix.DataLoader("data/video", batch_size=2)   # rank/world from torchrun
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            frames = batch["frames"]        # uint8 B x T x 3 x H x W, a view of shared memory
            ...

Each batch is a dict of ``torch.Tensor``: ``frames`` and ``mask`` are zero-copy views of the
local DataServer's shared-memory slabs (through DLPack), released when the last tensor that
views them is freed; ``tokens`` is per sample; ``padded`` (bool per sample) marks the pads
of an epoch's last step with ``drop_last=False``; ``sample_ids``, ``captions`` and ``errors``
are lists; the manifest's labels and metadata (``batch["label"]``...) join them by sample id
(docs/python.md, "Labels and metadata").

The C binding is ``datahelix._C``; every C error code has an exception class here, all
subclasses of :class:`DataHelixError` (and of the matching builtin: ``NotFoundError`` is a
``FileNotFoundError``, ``MediaError`` an ``OSError``...).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _C
from ._exchange import _all_to_all_exchange, _refuse_side_door
from ._meta import join_meta, load_manifest_meta, warn_if_profiles_dropped
from ._spec import ArraySpec
from ._torch_args import (_pin_memory_arg, _prefetch_of, _refuse_torch_only, _seed_arg,
                          _source_or_dataset, _workers_arg)
from ._C import (  # noqa: F401  (re-exported)
    DataHelixError,
    DatasetError,
    AuthError,
    EndOfInputError,
    InfeasibleError,
    InvalidArgumentError,
    MediaError,
    NoServerError,
    NotFoundError,
    OutOfMemoryError,
    OutOfRangeError,
    ParseError,
    PermissionDeniedError,
    SchemaError,
    TimeoutError,
    TooBigError,
    UnknownNameError,
)

__all__ = [
    "DataLoader",
    "Cluster",
    "start_cluster",
    "resolve_source",
    "plan",
    "count_text_tokens",
    "blend",
    "REBALANCE_KEYS",
    "DataHelixError",
    "DatasetError",
    "AuthError",
    "get_worker_info",
    "default_collate",
    "ArraySpec",
    "EndOfInputError",
    "InfeasibleError",
    "InvalidArgumentError",
    "MediaError",
    "NoServerError",
    "NotFoundError",
    "OutOfMemoryError",
    "OutOfRangeError",
    "ParseError",
    "PermissionDeniedError",
    "SchemaError",
    "TimeoutError",
    "TooBigError",
    "UnknownNameError",
]

__version__ = "0.1.0"

_TOKEN_PLANS = {"count": 0, "balanced": 1, "packing": 2}


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
    for key in _row_keys(rows):
        out[key] = [r.get(key) for r in rows]
    return out


def _row_keys(rows: List[Dict[str, Any]]) -> List[str]:
    """The dataset keys of a batch's JSON rows, in first-seen order over all rows (a failed
    sample's row is empty: the keys cannot be read from one row), less the worker's own."""
    from ._collate import RESERVED
    keys: Dict[str, None] = {}
    for r in rows:
        for k in r:
            if k not in RESERVED:
                keys[k] = None
    return list(keys)


# A Python dataset's profile rows when nothing better is known (no estimate_cost, not in the
# learned costs): the mean of what is known, else these.
_DATASET_DEFAULT_COST = {"cpu_s": 0.01, "tokens": 1, "out_bytes": 0}


def _arena_budget_bytes() -> int:
    """The memory budget of an arena this process makes, as the C side reads it
    (dh_arena_budget_default): DH_ARENA_BUDGET (bytes, K, M or G), else a quarter of
    physical memory."""
    text = os.environ.get("DH_ARENA_BUDGET", "").strip()
    if text:
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if scale > 1 else text
        if digits.isdigit() and int(digits) > 0:
            return int(digits) * scale
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


def _load_costs(path: str) -> Dict[str, Dict[str, float]]:
    """Learned per-sample costs: ``path`` and every ``path.rank*`` (one JSON object per line:
    id, cpu_s, tokens, out_bytes), later files winning."""
    import glob
    known: Dict[str, Dict[str, float]] = {}
    for name in [path] + sorted(glob.glob(glob.escape(path) + ".rank*")):
        if not os.path.isfile(name) or name.endswith(".tmp"):
            continue
        with open(name, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    known[str(row["id"])] = {k: float(row[k]) for k in ("cpu_s", "tokens",
                                                                          "out_bytes")}
                except (ValueError, KeyError, TypeError) as e:
                    raise ParseError(f"{name}:{lineno}: not a learned-cost row ({e})") from None
    return known


def _pickle_bundle(bundle: Dict[str, Any], what: str) -> bytes:
    """The dataset bundle as bytes for the worker processes: plain pickle, or cloudpickle
    when pickle fails or something in it lives in ``__main__`` (a worker could not import
    it)."""
    import pickle
    in_main = any(getattr(v, "__module__", None) == "__main__" or
                  getattr(type(v), "__module__", None) == "__main__" for v in bundle.values()
                  if v is not None)
    if not in_main:
        try:
            return pickle.dumps(bundle, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001  (lambdas, local classes: cloudpickle below)
            pass
    try:
        import cloudpickle
    except ImportError:
        raise InvalidArgumentError(
            f"{what} cannot be pickled for the worker processes and cloudpickle is not "
            f"installed (pip install cloudpickle)") from None
    try:
        return cloudpickle.dumps(bundle, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001
        raise InvalidArgumentError(f"{what} cannot be pickled for the worker processes: "
                                   f"{type(e).__name__}: {e}") from None


def _dataset_source(dataset: Any, directory: str, *, seed: int,
                    collate_fn: Optional[Callable[..., Any]] = None,
                    worker_init_fn: Optional[Callable[[int], None]] = None,
                    costs: Optional[str] = None,
                    sample_timeout: Optional[float] = 300.0) -> Dict[str, Any]:
    """Writes a map-style dataset's profile set (``directory/profiles.jsonl``: one row per
    index, costs from ``dataset.estimate_cost(i)``, else the learned ``costs`` file, else
    their mean) and its pickle (``directory/dataset.pkl``); returns the python pipeline
    spec a DataServer runs it with."""
    if sample_timeout is not None and not 0 <= sample_timeout <= 1e7:
        raise InvalidArgumentError(f"sample_timeout must be seconds in [0, 1e7] or None, not "
                                   f"{sample_timeout!r}")
    direct = hasattr(dataset, "sample_spec") and hasattr(dataset, "load_into")
    if not (hasattr(dataset, "__getitem__") or direct) or not hasattr(dataset, "__len__"):
        raise InvalidArgumentError(
            f"dataset must be map-style (__len__, and __getitem__ or sample_spec + load_into), "
            f"not {type(dataset).__name__}")
    n = len(dataset)
    if n < 1:
        raise InvalidArgumentError("dataset is empty")
    learned = _load_costs(costs) if costs else {}
    default = dict(_DATASET_DEFAULT_COST)
    if learned:
        for k in default:
            default[k] = sum(v[k] for v in learned.values()) / len(learned)
    estimate = getattr(dataset, "estimate_cost", None)
    with open(os.path.join(directory, "profiles.jsonl"), "w", encoding="utf-8") as f:
        for i in range(n):
            cost = dict(default)
            if estimate is not None:
                given = estimate(i)
                if not isinstance(given, dict):
                    raise InvalidArgumentError(
                        f"dataset.estimate_cost({i}) returned {type(given).__name__}; expected "
                        f"a dict with cpu_s, tokens, out_bytes")
                cost.update({k: given[k] for k in ("cpu_s", "tokens", "out_bytes") if k in given})
            elif str(i) in learned:
                cost.update(learned[str(i)])
            f.write(json.dumps({
                "id": str(i), "uri": f"index:{i}", "profile_key": "python", "frames": 1,
                "height": 1, "width": 1, "tokens_est": max(0, int(round(cost["tokens"]))),
                "cpu_s_est": max(0.0, float(cost["cpu_s"])), "in_bytes": 0,
                "out_bytes": max(0, int(cost["out_bytes"]))}, separators=(",", ":")) + "\n")
    blob = _pickle_bundle({"dataset": dataset, "collate_fn": collate_fn,
                           "worker_init_fn": worker_init_fn}, f"dataset {type(dataset).__name__}")
    pkl = os.path.join(directory, "dataset.pkl")
    with open(pkl, "wb") as f:
        f.write(blob)
    return {"type": "python", "dataset": "pickle:" + pkl, "python": sys.executable,
            "path": _worker_path(), "seed": _C.epoch_seed(int(seed) & ((1 << 64) - 1), 0),
            "sample_timeout": float(sample_timeout or 0)}


def _worker_path() -> List[str]:
    """What the worker processes put before their PYTHONPATH: this package's folder, then
    this process's sys.path entries that the interpreter would not find by itself (not under
    its prefix), so the dataset's module imports there as it does here."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [here]
    own = tuple(os.path.abspath(p) + os.sep for p in {sys.prefix, sys.base_prefix})
    for entry in sys.path:
        entry = os.path.abspath(entry or os.getcwd())
        if os.path.isdir(entry) and ":" not in entry and entry not in path and \
                not (entry + os.sep).startswith(own):
            path.append(entry)
    return path
# 0: the arena is sized by the C side (docs/runtime.md, "Prefetch in bytes"): what the
# prefetch horizon needs, bounded by the memory budget (DH_ARENA_BUDGET, else a quarter of
# physical memory); its memfd is sparse, so it costs only what the batches in flight take.
_DEFAULT_ARENA = 0


def _set_arena_budget(arena_budget: Union[None, int, str]) -> None:
    """Sets the memory budget of the arenas this process makes (DH_ARENA_BUDGET, read by
    the DataServer and the embedded client when arena_bytes is 0): bytes, or a string with
    a K, M or G suffix (KiB, MiB, GiB). None leaves it as it is."""
    if arena_budget is None:
        return
    text = str(arena_budget).strip()
    digits = text[:-1] if text[-1:].upper() in ("K", "M", "G") else text
    if not digits.isdigit() or int(digits) <= 0:
        raise InvalidArgumentError(
            f"arena_budget must be a byte count > 0 (e.g. 8 << 30, '8G', '512M'), "
            f"not {arena_budget!r}")
    os.environ["DH_ARENA_BUDGET"] = text
# The coordinator a torchrun job finds without being told: MASTER_ADDR at MASTER_PORT + this.
COORDINATOR_PORT_OFFSET = 17


def resolve_source(source: Union[str, os.PathLike]) -> Dict[str, Optional[str]]:
    """Finds the profile set and the manifest of a data set.

    ``source`` is a synth/probe directory (``DIR/profiles.jsonl``, and ``DIR/manifest.jsonl``
    for captions), a manifest (its ``profiles.jsonl`` next to it) or a profile file. Returns
    ``{"profiles": path, "manifest": path or None}``; raises :class:`NotFoundError` naming
    the missing file and how to make it.
    """
    path = os.fspath(source)
    if os.path.isdir(path):
        profiles = os.path.join(path, "profiles.jsonl")
        manifest = os.path.join(path, "manifest.jsonl")
    elif os.path.basename(path) == "manifest.jsonl" or path.endswith(".manifest.jsonl"):
        manifest = path
        profiles = os.path.join(os.path.dirname(path) or ".", "profiles.jsonl")
    else:
        profiles = path
        manifest = os.path.join(os.path.dirname(path) or ".", "manifest.jsonl")
    if not os.path.exists(path):
        raise NotFoundError(f"{path}: no such data set (a synth/probe directory, a manifest "
                            f"or a profile file)")
    if not os.path.isfile(profiles):
        raise NotFoundError(
            f"{profiles}: no profile set; make it with `datahelix probe "
            f"{manifest} -o {profiles}`")
    return {"profiles": profiles, "manifest": manifest if os.path.isfile(manifest) else None}


def _load_captions(manifest: Optional[str]) -> Dict[str, str]:
    return load_manifest_meta(manifest)[0]  # captions and meta: _meta.py


def _pipeline_json(pipeline: Union[None, str, os.PathLike, Dict[str, Any]]) -> Optional[str]:
    """A pipeline spec as JSON text: a dict, a path to a JSON file, or JSON text."""
    if pipeline is None:
        return None
    if isinstance(pipeline, dict):
        return json.dumps(pipeline)
    text = os.fspath(pipeline)
    if text.lstrip().startswith("{"):
        return text
    try:
        with open(text, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise NotFoundError(f"pipeline spec {text}: {e.strerror}") from None


def _first_json_line(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        row = json.loads(next((line for line in f if line.strip()), "{}"))
    return row if isinstance(row, dict) else {}


def _warn_if_probed_otherwise(pipeline_json: Optional[str], profiles: str,
                              manifest: Optional[str]) -> None:
    """A profile row's frames, height and width are per-sample plans that override the
    pipeline's (docs/pipeline.md, "Per-sample overrides"): warns once when the loader's
    pipeline asks for another size than the first row was probed with, and that row's plan
    came from probe's spec, not from its manifest line (a mixed set's own plans)."""
    if not pipeline_json or not manifest:
        return
    try:
        spec = json.loads(pipeline_json)
        row = _first_json_line(profiles)
        if any(k in _first_json_line(manifest) for k in ("frames", "height", "width")):
            return  # the manifest gives each clip its plan
    except (ValueError, OSError):
        return  # the C side reports a bad spec or profile file, naming it
    asked = {k: spec.get(k) for k in ("frames", "height", "width") if spec.get(k)}
    probed = {k: row.get(k) for k in asked if row.get(k) and row.get(k) != asked[k]}
    if probed:
        import warnings
        warnings.warn(
            f"{profiles} was probed with {probed} per sample, which overrides the pipeline's "
            f"{ {k: asked[k] for k in probed} }: re-probe with the same spec "
            f"(datahelix probe MANIFEST -p SPEC.json -o {profiles})", stacklevel=3)


class Cluster:
    """A coordinator and/or a local DataServer running as threads of this process.

    What ``start_cluster`` returns, and what a torchrun job's rank 0 (the coordinator) and
    each node's local rank 0 (its node's DataServer) start for the others to share.
    ``endpoint`` is the coordinator's; ``close()`` stops both (also at exit).
    """

    def __init__(self, coordinator: Optional["_C.Coordinator"], endpoint: str,
                 server: Optional["_C.DataServer"], scratch_dir: Optional[str] = None):
        self.coordinator = coordinator
        self.endpoint = endpoint
        self.server = server
        self._scratch_dir = scratch_dir  # a Python dataset's pickle (removed at close)

    def arena_stats(self) -> Dict[str, int]:
        """The local DataServer's arena: slabs and allocations still held by clients."""
        if self.server is None:
            raise InvalidArgumentError("this cluster has no local DataServer")
        return self.server.arena_stats()

    def stats(self) -> Dict[str, Dict[str, Any]]:
        out: Dict[str, Dict[str, Any]] = {}
        if self.coordinator is not None:
            out["coordinator"] = self.coordinator.stats()
        if self.server is not None:
            out["server"] = self.server.stats()
        return out

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.coordinator is not None:
            self.coordinator.close()
            self.coordinator = None
        if self._scratch_dir:
            import shutil
            shutil.rmtree(self._scratch_dir, ignore_errors=True)
            self._scratch_dir = None

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_clusters: List[Cluster] = []
_clusters_lock = threading.Lock()


@atexit.register
def _close_clusters() -> None:
    with _clusters_lock:
        for c in reversed(_clusters):
            c.close()
        _clusters.clear()


# Loaders whose client calls Python back (rebalance callbacks, on its fetcher thread): closed
# at exit before the clusters (atexit runs the later registration first), so that no
# callback waits for the GIL while the interpreter shuts down.
_rebalance_loaders: "weakref.WeakSet[DataLoader]" = weakref.WeakSet()


@atexit.register
def _close_rebalance_loaders() -> None:
    for loader in list(_rebalance_loaders):
        try:
            loader.close()
        except Exception:
            pass


def start_cluster(source: Union[str, os.PathLike, None] = None, *, workers: Optional[int] = None,
                  listen: str = "tcp://127.0.0.1:*", coordinator: Optional[str] = None,
                  node: Optional[str] = None, pipeline: Any = None,
                  arena_bytes: int = _DEFAULT_ARENA, policy: str = "deadline",
                  arena_budget: Union[None, int, str] = None, dataset: Any = None,
                  collate_fn: Optional[Callable[..., Any]] = None,
                  worker_init_fn: Optional[Callable[[int], None]] = None,
                  seed: int = 0, keys: Union[None, str, os.PathLike] = None,
                  key: Optional[str] = None, log_level: Optional[str] = None,
                  sample_timeout: Optional[float] = 300.0) -> Cluster:
    """Starts a coordinator on ``listen`` (unless ``coordinator`` names one to join) and a
    local DataServer for ``node`` (default: this host) with ``workers`` decode threads
    (default: this machine's CPUs), as threads of this process. ``source`` is only checked
    (the clients name the samples). Loaders connect with ``coordinator=cluster.endpoint``.
    ``arena_bytes`` 0 (default) sizes the DataServer's arena to ``arena_budget`` (bytes or
    "8G"; default DH_ARENA_BUDGET, else a quarter of physical memory): a sparse memfd, so it
    costs only what the batches in flight take. ``dataset`` (a map-style Python dataset, with
    ``collate_fn``, ``worker_init_fn``, ``seed`` and ``sample_timeout``, as DataLoader's): the
    DataServer runs it in ``workers`` worker processes instead of the video pipeline
    (docs/datasets.md, "Your own Dataset").
    ``keys``/``key``: the CURVE key directory and this process's key in it (default
    DATAHELIX_KEYS / DATAHELIX_KEY): tcp:// endpoints admit only the directory's keys, and
    encrypt (docs/security.md). ``log_level``: the C side's log threshold (error, warn,
    info, debug; default DATAHELIX_LOG_LEVEL, else info), for this process.
    """
    _set_log_level(log_level)
    _set_arena_budget(arena_budget)
    auth = _keys(keys, key)
    scratch = None
    if dataset is not None:
        import tempfile
        if pipeline is not None:
            raise InvalidArgumentError("give a pipeline or a dataset, not both")
        scratch = tempfile.mkdtemp(prefix="datahelix-dataset-")
        pipeline = _dataset_source(dataset, scratch, seed=seed, collate_fn=collate_fn,
                                   worker_init_fn=worker_init_fn, sample_timeout=sample_timeout)
    if source is not None:
        resolve_source(source)
    coord = None
    if coordinator is None:
        coord = _C.Coordinator(listen, policy=policy, **auth)
        coordinator = coord.endpoint
    try:
        server = _C.DataServer(coordinator, _node_name(node),
                               workers=workers or os.cpu_count() or 1,
                               pipeline_json=_pipeline_json(pipeline), arena_bytes=arena_bytes,
                               **auth)
    except BaseException:
        if coord is not None:
            coord.close()
        raise
    cluster = Cluster(coord, coordinator, server, scratch)
    with _clusters_lock:
        _clusters.append(cluster)
    return cluster


def _node_name(node: Optional[str]) -> str:
    """A rank's or DataServer's node: as given, else DATAHELIX_NODE, else the host name
    (machines or containers that share a host name set DATAHELIX_NODE)."""
    return node or os.environ.get("DATAHELIX_NODE") or socket.gethostname()


def _set_log_level(log_level: Optional[str]) -> None:
    """The C side's log threshold: as given, else DATAHELIX_LOG_LEVEL (which the C side also
    reads on its own at first use); process-wide."""
    level = log_level or os.environ.get("DATAHELIX_LOG_LEVEL")
    if level:
        _C.set_log_level(level)


def _keys(keys: Union[None, str, os.PathLike], key: Optional[str]) -> Dict[str, Optional[str]]:
    """The CURVE settings of a coordinator, DataServer or client this process makes: the key
    directory (as given, else DATAHELIX_KEYS) and this process's key name in it (as given,
    else DATAHELIX_KEY, else "server"); none (plaintext) when neither gives a directory."""
    folder = os.fspath(keys) if keys is not None else os.environ.get("DATAHELIX_KEYS") or None
    if folder is None:
        if key is not None:
            raise InvalidArgumentError("key= names a key in a key directory: give keys= too "
                                       "(or DATAHELIX_KEYS)")
        return {}
    if not os.path.isdir(folder):
        raise InvalidArgumentError(f"keys={folder!r}: not a directory (make one with "
                                   "`datahelix keygen -o DIR/server`; docs/security.md)")
    return {"keys_dir": folder, "key_name": key or os.environ.get("DATAHELIX_KEY") or None}


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidArgumentError(f"environment variable {name}={value!r} is not an integer") \
            from None


# Servers a torchrun job started in this process, by coordinator endpoint (kept for the
# process's life: the other ranks of the node share them).
_job_clusters: Dict[str, Cluster] = {}


def _torchrun_coordinator(rank: int, workers: Optional[int], pipeline: Any, arena_bytes: int,
                          policy: str, auth: Optional[Dict[str, Optional[str]]] = None) -> str:
    """The coordinator of a multi-rank job when none is given: DATAHELIX_COORDINATOR, or
    tcp://MASTER_ADDR:(MASTER_PORT + 17). Rank 0 starts it; the first local rank of each
    node starts the node's DataServer; the others connect (waiting for them)."""
    endpoint = os.environ.get("DATAHELIX_COORDINATOR")
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = _env_int("MASTER_PORT")
    if not endpoint:
        if port is None:
            raise InvalidArgumentError(
                "world_size > 1 and no coordinator: set coordinator=, DATAHELIX_COORDINATOR, "
                "or run under torchrun (MASTER_ADDR/MASTER_PORT)")
        try:  # ZeroMQ takes addresses, not host names
            addr = socket.gethostbyname(addr)
        except OSError as e:
            raise InvalidArgumentError(f"MASTER_ADDR={addr!r}: cannot resolve: {e}") from None
        endpoint = f"tcp://{addr}:{port + COORDINATOR_PORT_OFFSET}"
    local_rank = _env_int("LOCAL_RANK")
    if local_rank is None:
        local_rank = rank
    if endpoint in _job_clusters:
        return endpoint
    coord = None
    if rank == 0 and not os.environ.get("DATAHELIX_COORDINATOR"):
        # a loopback master binds loopback; any other binds every interface
        bind = endpoint if addr.startswith("127.") or not endpoint.startswith(f"tcp://{addr}:") \
            else endpoint.replace(f"tcp://{addr}:", "tcp://0.0.0.0:")
        coord = _C.Coordinator(bind, policy=policy, **(auth or {}))
    server = None
    if local_rank == 0:
        # several nodes (a coordinator off loopback): the data socket binds every interface
        # and the DataServer advertises its address on the route to the coordinator
        # (DATAHELIX_ADVERTISE: a host or endpoint to advertise instead), so sidecars and
        # other nodes reach it; one node on loopback stays on loopback
        host = endpoint[len("tcp://"):].rpartition(":")[0] if endpoint.startswith("tcp://") else ""
        multi = bool(host) and not host.startswith("127.") and host != "localhost"
        server = _C.DataServer(endpoint, _node_name(None),
                               workers=workers or os.cpu_count() or 1,
                               pipeline_json=_pipeline_json(pipeline), arena_bytes=arena_bytes,
                               data_listen="tcp://0.0.0.0:*" if multi else None,
                               data_advertise=os.environ.get("DATAHELIX_ADVERTISE") or None,
                               **(auth or {}))
    cluster = Cluster(coord, endpoint, server)
    _job_clusters[endpoint] = cluster
    with _clusters_lock:
        _clusters.append(cluster)
    return endpoint


def plan(source: Union[str, os.PathLike], step: int, rank: int, world_size: int,
         batch_size: int, *, seed: int = 0, shuffle: bool = True, plan: str = "balanced",
         fanout: int = 1, plan_window: int = 1, drop_last: bool = True) -> List[int]:
    """The profile rows (indices into the data set's profile file) that ``rank`` gets at
    global step ``step``: the tier-1 plan a DataLoader with these arguments follows, worked
    out without starting a coordinator, a DataServer or a client (the pure rule of
    src/sched, ``dh_plan_rank_share``). ``source`` as for :func:`resolve_source`; ``plan``
    and ``plan_window`` as for :class:`DataLoader`; ``fanout`` is the fewest rows a rank gets
    with "packing"; ``drop_last`` as for :class:`DataLoader` (False: an epoch's last step is
    its tail, fewer rows per rank, pads included).
    Step ``s`` is step ``s % steps_per_epoch`` of epoch ``s // steps_per_epoch``.
    """
    if plan not in _TOKEN_PLANS:
        raise InvalidArgumentError(
            f"plan must be one of {sorted(_TOKEN_PLANS)}, not {plan!r}")
    profiles = resolve_source(source)["profiles"]
    return _C.plan(profiles, step, rank, world_size, batch_size, seed=seed,
                   shuffle=bool(shuffle), token_plan=_TOKEN_PLANS[plan], fanout=fanout,
                   plan_window=plan_window, drop_last=bool(drop_last))


def blend(sources: Sequence[Tuple[Union[str, os.PathLike], float]],
          out: Union[str, os.PathLike], *, seed: int = 0, samples: Optional[int] = None) -> str:
    """Blends several data sets into one, by weight (Megatron-Energon's blending, fixed per
    seed): ``sources`` is ``[(source, weight), ...]`` (each source as for
    :func:`resolve_source`, weights > 0). The blend holds ``samples`` rows (default: the
    most that no source must repeat for, ``min(len_i / share_i)``), source i's share of them
    by weight (largest remainders), drawn from it without replacement by a generator seeded
    with ``seed`` (a source asked for more rows than it has gives whole copies, then a draw;
    a copy's id gets ``#k``). Rows keep their source's plan (frames and size: the profile
    rows' per-sample overrides, from the source's own probe spec) and costs; ids become
    ``NAME/ID`` (NAME: the source's folder name, made unique). Writes ``out/profiles.jsonl``
    and ``out/manifest.jsonl`` (the captions and each row's ``meta``) and returns ``out``. The composition is the
    same every epoch; the loader's sampler shuffles it per epoch."""
    import math
    import random
    pairs = list(sources)
    if not pairs:
        raise InvalidArgumentError("blend: no sources")
    loaded, names = [], set()
    for k, pair in enumerate(pairs):
        try:
            src, weight = pair
            weight = float(weight)
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"blend: source {k} must be (source, weight), not {pair!r}") from None
        if not (weight > 0 and math.isfinite(weight)):
            raise InvalidArgumentError(f"blend: source {k} ({src}): weight {weight} must be > 0")
        paths = resolve_source(src)
        with open(paths["profiles"], encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if not rows:
            raise InvalidArgumentError(f"blend: {paths['profiles']} has no rows")
        name = os.path.basename(os.path.normpath(os.path.dirname(paths["profiles"]))) or "data"
        base, n = name, 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.add(name)
        loaded.append((name, weight, rows, load_manifest_meta(paths["manifest"])))
    total = sum(w for _, w, _, _ in loaded)
    shares = [w / total for _, w, _, _ in loaded]
    if samples is None:
        samples = int(min(len(rows) / share for (_, _, rows, _), share in zip(loaded, shares)))
    if samples < 1:
        raise InvalidArgumentError(f"blend: samples must be >= 1, not {samples}")
    exact = [share * samples for share in shares]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))[
            :samples - sum(counts)]:
        counts[i] += 1
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    profiles, manifest = [], []
    for (name, _, rows, (captions, meta)), count in zip(loaded, counts):
        picks = [(i, copy) for copy in range(count // len(rows)) for i in range(len(rows))]
        picks += [(i, count // len(rows)) for i in sorted(rng.sample(range(len(rows)),
                                                                     count % len(rows)))]
        for i, copy in picks:
            row = dict(rows[i])
            source_id = str(row["id"])
            row["id"] = f"{name}/{source_id}" + (f"#{copy}" if copy else "")
            profiles.append(json.dumps(row, ensure_ascii=False) + "\n")
            line = {"id": row["id"], "path": row["uri"], "caption": captions.get(source_id, "")}
            if meta.raw(source_id):
                line["meta"] = meta.raw(source_id)
            manifest.append(json.dumps(line, ensure_ascii=False) + "\n")
    for file, lines in (("profiles.jsonl", profiles), ("manifest.jsonl", manifest)):
        partial = os.path.join(out, file + ".part")
        with open(partial, "w", encoding="utf-8") as f:
            f.writelines(lines)
        os.replace(partial, os.path.join(out, file))
    return os.fspath(out)


def count_text_tokens(manifest: Union[str, os.PathLike], tokenizer: Any,
                      out: Union[None, str, os.PathLike] = None) -> int:
    """Counts each caption's tokens with the user's tokenizer and writes them into the
    manifest as ``"text_tokens"``, which ``datahelix probe`` then uses for the profile's
    ``text_len`` (and so ``tokens_est``: visual plus text tokens) instead of its own estimate
    of one token per 4 bytes. Run it before probe.

    ``manifest``: a manifest file, or a directory holding ``manifest.jsonl``. ``tokenizer``: a
    callable returning the caption's tokens (a sequence, or their count), or an object with
    ``encode(text)`` (a Hugging Face tokenizer). ``out``: where to write (default: the
    manifest itself, replaced atomically). Returns the number of lines given a count; a line
    without a caption gets 0.
    """
    path = os.fspath(manifest)
    if os.path.isdir(path):
        path = os.path.join(path, "manifest.jsonl")
    if not os.path.isfile(path):
        raise NotFoundError(f"{path}: no manifest")
    count = tokenizer if callable(tokenizer) else getattr(tokenizer, "encode", None)
    if count is None:
        raise InvalidArgumentError(
            "tokenizer must be callable or have encode(text) (a Hugging Face tokenizer)")
    target = os.fspath(out) if out is not None else path
    lines, n = [], 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError as e:
                raise InvalidArgumentError(f"{path}:{number}: not JSON: {e}") from None
            caption = entry.get("caption") or ""
            tokens = count(caption) if caption else 0
            tokens = tokens if isinstance(tokens, int) else len(tokens)
            if tokens < 0:
                raise InvalidArgumentError(
                    f"{path}:{number}: the tokenizer gave {tokens} tokens for {caption!r}")
            entry["text_tokens"] = tokens
            lines.append(json.dumps(entry, ensure_ascii=False) + "\n")
            n += 1
    partial = target + ".part"
    with open(partial, "w", encoding="utf-8") as f:
        f.writelines(lines)
    os.replace(partial, target)
    return n


# The keys of DataLoader(rebalance={...}) (docs/rebalancing.md): the paper's shape
# (feature_fn, sort_fn, client_ranks, buffer_size, args), "groups" as the C API names
# client_ranks, and the knobs of dh_rebalance_config_t besides; "process_group" (a
# torch.distributed group that carries cross-node moves in one all_to_all per round) or
# "exchange_fn" (any collective of the same shape), refused with CURVE keys unless
# "allow_unencrypted_exchange" is True (_exchange.py; docs/security.md).
REBALANCE_KEYS = ("feature_fn", "sort_fn", "client_ranks", "groups", "buffer_size", "min_gain",
                  "args", "n_features", "move_s_per_B", "round_timeout_ms", "late_ms",
                  "fanout", "process_group", "exchange_fn", "allow_unencrypted_exchange")


def _part_view(tensor: Any) -> Any:
    """A part's tensor (a _C.PartTensor, zero-copy) as feature_fn gets it: a torch tensor
    viewing it (DLPack), else a numpy array (buffer protocol), else the view itself."""
    try:
        import torch
        return torch.from_dlpack(tensor)
    except ImportError:
        pass
    try:
        import numpy
        return numpy.asarray(memoryview(tensor))
    except ImportError:
        return tensor


def _feature_adapter(fn: Callable[..., Any]) -> Callable[..., Any]:
    """feature_fn over torch (or numpy) views, as the C bridge calls it with _C views."""
    def feature_fn(tensors: Dict[str, Any], samples: List[Dict[str, Any]]) -> Any:
        return fn({name: _part_view(t) for name, t in tensors.items()}, samples)
    feature_fn.__wrapped__ = fn  # type: ignore[attr-defined]
    return feature_fn


def _rebalance_config(rebalance: Union[None, bool, Dict[str, Any]], batch_size: int,
                      world_size: int, keys_dir: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """DataLoader(rebalance=...) -> the _C.Client's rebalance dict plus "fanout" (parts
    per batch), or None when off. Raises InvalidArgumentError naming a bad key or value
    (checked here, before any client starts), or process_group/exchange_fn with CURVE keys
    (``keys_dir``) and no allow_unencrypted_exchange=True."""
    if rebalance is None or rebalance is False:
        return None
    if rebalance is True:
        rebalance = {}
    if not isinstance(rebalance, dict):
        raise InvalidArgumentError(
            f"rebalance must be None, True or a dict, not {type(rebalance).__name__}")
    unknown = sorted(str(k) for k in rebalance if k not in REBALANCE_KEYS)
    if unknown:
        raise InvalidArgumentError(
            f"rebalance: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"(allowed: {', '.join(REBALANCE_KEYS)})")
    _refuse_side_door(rebalance, keys_dir)
    spec = {k: v for k, v in rebalance.items()
            if k not in ("client_ranks", "fanout", "process_group", "allow_unencrypted_exchange")}
    if rebalance.get("process_group") is not None:
        if rebalance.get("exchange_fn") is not None:
            raise InvalidArgumentError(
                "rebalance: process_group makes the exchange_fn (one all_to_all over it); "
                "give one of them")
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise InvalidArgumentError(
                "rebalance['process_group'] needs torch.distributed initialized "
                "(dist.init_process_group) before the DataLoader")
        spec["exchange_fn"] = _all_to_all_exchange(rebalance["process_group"])
    if rebalance.get("client_ranks") is not None:
        if rebalance.get("groups") is not None and \
                rebalance["groups"] != rebalance["client_ranks"]:
            raise InvalidArgumentError(
                "rebalance: client_ranks and groups are one setting (groups is its C name); "
                "give one of them")
        spec["groups"] = rebalance["client_ranks"]
    fanout = rebalance.get("fanout")
    fanout = batch_size if fanout is None else fanout
    if isinstance(fanout, bool) or not isinstance(fanout, int) or not 1 <= fanout <= batch_size:
        raise InvalidArgumentError(
            f"rebalance['fanout'] (parts per batch, the unit that moves) must be in "
            f"[1, batch_size={batch_size}], not {fanout!r}")
    if spec.get("feature_fn") is not None and callable(spec["feature_fn"]):
        spec["feature_fn"] = _feature_adapter(spec["feature_fn"])
    _C.RebalanceSpec(spec, world_size)  # the C binding's checks, now rather than at iter()
    spec["fanout"] = fanout
    return spec


class _Pass:
    """One pass over the loader: ``next()`` yields its batches in order. A batch whose sample
    failed (on_error="raise") raises that sample's error and is consumed: the next
    ``next()`` goes on with the next batch, and the pass still ends after ``len(loader)``
    batches. Other errors (a timeout, a lost coordinator) raise without consuming."""

    def __init__(self, loader: "DataLoader", client: "_C.Client") -> None:
        self._loader = loader
        self._client: Optional["_C.Client"] = client

    def __iter__(self) -> "_Pass":
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def close(self) -> None:
        """Ends the pass early (as a generator's close()): its client stops; batches already
        yielded stay valid."""
        client, self._client = self._client, None
        if client is not None and self._loader._client is client:
            self._loader._close_client()

    def __next__(self) -> Dict[str, Any]:
        loader, client = self._loader, self._client
        if client is None:
            raise StopIteration
        try:
            batch = client.next()
        except DataHelixError:
            if loader._client is client and \
                    int(client.stats()["batches"]) + loader._pass_first > loader._yielded:
                loader._yielded += 1  # the failed batch was consumed
            raise
        if batch is None:
            self._client = None
            if loader._client is client:
                loader._close_client()
            raise StopIteration
        out = loader._to_torch(batch)
        loader._yielded += 1
        if loader.pin_memory:
            out = {k: v.pin_memory() if hasattr(v, "pin_memory") else v for k, v in out.items()}
        return out

class DataLoader:
    """A ``torch.utils.data.DataLoader`` for DataHelix data sets and map-style datasets:
    the same iteration, ``len()``, ``set_epoch``, worker semantics and most parameters; the
    table "torch's DataLoader parameters" of docs/python.md says which parameters mean the
    same, which differ (shuffle and drop_last default to True here) and which are refused
    (sampler, batch_sampler).

    Epochs: each new ``iter()`` moves on to the next epoch (its own seeded order and worker
    seeds); ``set_epoch(e)`` pins the next pass to epoch e, as ``DistributedSampler``.

    Args:
        source: a synth/probe directory, a manifest or a profile file (resolve_source); or
            ``[(source, weight), ...]``: the sources blended by weight (:func:`blend`, with
            this loader's seed), each sample keeping its source's plan (frames, size).
        pipeline: the decode spec (dict, JSON text or a path; docs/pipeline.md) of the
            DataServer this loader starts (embedded mode, or the node's server under
            torchrun); a server started elsewhere uses its own.
        batch_size: samples per rank per step (with ``plan="packing"`` the mean).
        shuffle, seed: the epoch order (the same on every rank, so ranks partition it) and
            each pass's base seed, ``_C.epoch_seed(seed, epoch)``: worker k seeds with base +
            k, and each sample's draws with (base, index) (docs/datasets.md, "Randomness").
            seed None: ``generator.initial_seed()`` when a generator is given, else 0.
        drop_last: True (the default): an epoch's tail that does not fill one global step
            (world_size x batch_size samples) is left out. False: as torch's
            ``DistributedSampler(drop_last=False)``, the tail is delivered: the epoch's last
            step has fewer rows, the same number on every rank (token-balanced with
            "balanced"), padded with repeats of the epoch's first samples, which
            ``batch["padded"]`` (a bool tensor per row) marks so they can be left out of the
            loss; ``len()`` is then ceil(n / (world_size x batch_size)). Not with
            ``rebalance``.
        prefetch: batches requested ahead of ``next()`` (None: ``prefetch_factor x
            num_workers`` when prefetch_factor is given, else 4).
        prefetch_max: adaptive prefetch: when ``next()`` has to wait (past the first
            ``prefetch`` batches), the horizon doubles, up to this (None: fixed at
            ``prefetch``). ``stats()["prefetch_now"]`` says where it is.
        coordinator: an endpoint to join. None: one process (world_size 1) runs embedded
            (a coordinator and a DataServer as threads of this process); under torchrun
            the job's coordinator is found or started (see docs/python.md).
        rank, world_size: default to torchrun's RANK and WORLD_SIZE (else 0 and 1).
        on_error: "raise" (a failed sample raises its error class; that batch is consumed
            and the next ``next()`` yields the next one) or "skip" (the batch comes with the
            sample's slot zeroed and its message in ``errors``).
        policy: placement policy of a coordinator this loader starts ("deadline",
            "least-request", "local", ...).
        workers, num_workers: one setting (torch's name, or this one): decode threads, or
            a Python dataset's worker processes, of a DataServer this loader starts
            (default: CPUs; 0 means 1).
        persistent_workers: an embedded loader keeps its DataServer and worker processes
            across passes (``worker_init_fn`` then runs once); False (default): started
            again each pass, as torch's.
        plan: tier-1 planning: "balanced" (token-balanced, batch_size rows per rank; the
            default), "packing" (token-balanced, rows per rank vary), "count" (rank r takes
            rows [r*B, (r+1)*B) of the order, as rank-local loaders do).
        plan_window: with "balanced" or "packing", plan this many consecutive steps of an
            epoch together (1, the default: each step alone), so heavy samples are spread
            over the steps instead of meeting in one; a sample may then come up to
            ``plan_window - 1`` steps from its place in the order (docs/planner.md,
            "Planning across steps").
        timeout: seconds ``next()`` waits for a batch before raising TimeoutError (None or
            0: forever; Ctrl-C is seen within 200 ms either way).
        arena_bytes: shared-memory arena of a DataServer this loader starts; 0 (default):
            what the prefetch horizon needs, bounded by ``arena_budget``. Each rank's
            requests keep to its share of its node's arena (docs/runtime.md).
        arena_budget: the memory an arena this process makes may take: bytes, or a string
            such as "8G" or "512M" (default: DH_ARENA_BUDGET, else a quarter of physical
            memory). Sets DH_ARENA_BUDGET for this process. A budget that cannot hold one
            step fails with a message naming the numbers.
        node: this rank's node name (default: DATAHELIX_NODE, else the host name).
        connect_timeout: seconds to wait for the coordinator and the local DataServer. An
            error names the cause: no scheme, nothing listening (refused, unknown host), a
            server that is not a coordinator (docs/python.md, "Connection errors").
        log_level: the C side's log threshold, "error", "warn", "info" or "debug" (default
            DATAHELIX_LOG_LEVEL, else "info"); process-wide.
        max_steps: stop each pass after this many batches (0: no limit).
        epochs: epochs one pass yields back to back (1): ``len()`` counts all of them and
            the next pass starts that many epochs later; 0: no end, with max_steps the only
            limit (a stream; prefetch runs on across epoch boundaries).
        rebalance: tier 2 (docs/rebalancing.md): the ranks of a group trade materialized
            parts of batches not yet yielded, when the projected gain beats the cost.
            None/False: off (the default). True: on, with the C defaults (groups by node,
            buffer_size 64, min_gain 0.05, the default policy and its cost gate). A dict
            with any of REBALANCE_KEYS: ``feature_fn(tensors, samples) -> floats`` (tensors:
            name -> torch views of one part, valid during the call; samples: [{"id",
            "tokens", "error"}]; default: tokens, bytes, decode seconds), ``sort_fn(round,
            args) -> new rank per part, or None to keep`` (runs on every rank of the group:
            it must be deterministic), ``client_ranks`` or ``groups`` (lists of ranks; a rank
            in none does not rebalance), ``buffer_size`` (samples per round across the
            group), ``min_gain``, ``args`` (JSON-able, given to sort_fn), ``n_features``
            (feature_fn's vector length; default: as returned, up to 16),
            ``move_s_per_B``, ``round_timeout_ms``, ``late_ms`` (how long past its deadline
            a rank lets a round be gathered: 0, the default, never waits; more makes
            decisions independent of timing), ``fanout`` (parts per batch, the unit
            that moves: default batch_size, single samples; parts are joined into the
            batch by one copy), ``process_group`` (a torch.distributed group of exactly
            the group's ranks, used by no one else, e.g. ``dist.new_group(backend="gloo")``:
            moves across nodes go in one all_to_all over it per round instead of
            DataServer to DataServer) or ``exchange_fn(round, ranks, send, send_counts,
            recv, recv_counts)`` (any collective of that shape); with ``keys`` either is
            refused (its payloads cross nodes unencrypted, outside CURVE) unless
            ``allow_unencrypted_exchange`` is True, which warns once. The callbacks run on
            the client's fetcher thread (holding the GIL); a failure makes next() raise an
            error naming the round.
        dataset: instead of ``source``, a map-style dataset (``__len__``, ``__getitem__``
            returning a dict of arrays, str, int, float) run by the DataServer's worker
            processes, one per worker (docs/datasets.md, "Your own Dataset"); optional
            ``estimate_cost(i) -> {"cpu_s", "tokens", "out_bytes"}`` and ``count_tokens(i,
            sample)``. A batch is a dict: its arrays stacked (``NAME_mask`` beside each),
            bool/int/float as tensors, other values as lists, and ``indices``.
        collate_fn, worker_init_fn: as torch's, run in the worker processes (pickled, with
            cloudpickle when plain pickle cannot).
        sample_timeout: with ``dataset``, seconds one call of its code (``__getitem__``,
            ``load_into``, ``collate_fn``; loading it and ``worker_init_fn`` in a new worker
            process) may run (default 300; None or 0: no limit). Past it the worker process
            is killed and replaced, and the sample fails with a DatasetError naming it and
            the time (``on_error``; docs/datasets.md, "Hangs: sample_timeout").
        costs: with ``dataset``, a JSONL file of learned per-sample costs: read at the start
            (with ``costs.rank*``) and written when a pass ends.
        prefetch_factor, pin_memory, pin_memory_device, generator: as torch's (pinning
            needs CUDA: without it a warning, once, and no pinning).
        sampler, batch_sampler, multiprocessing_context (other than "spawn"), in_order=False:
            refused, each with a message saying what to use instead.
        keys, key: a CURVE key directory (default DATAHELIX_KEYS) and this process's key in
            it (default DATAHELIX_KEY, else "server"): every tcp:// connection authenticates
            and encrypts, and what this loader starts under torchrun admits only the
            directory's keys (docs/security.md). None: plaintext.
    """

    def __init__(self, source: Union[None, str, os.PathLike, Sequence[Tuple[Any, float]]] = None,
                 pipeline: Any = None,
                 batch_size: int = 1, shuffle: bool = True, seed: Optional[int] = None,
                 drop_last: bool = True, prefetch: Optional[int] = None,
                 coordinator: Optional[str] = None,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 on_error: str = "raise", policy: str = "deadline", *,
                 workers: Optional[int] = None, plan: str = "balanced",
                 timeout: Optional[float] = None, arena_bytes: int = _DEFAULT_ARENA,
                 node: Optional[str] = None, connect_timeout: float = 30.0,
                 max_steps: int = 0, epochs: int = 1,
                 prefetch_max: Optional[int] = None,
                 arena_budget: Union[None, int, str] = None,
                 rebalance: Union[None, bool, Dict[str, Any]] = None,
                 plan_window: int = 1, dataset: Any = None,
                 collate_fn: Optional[Callable[..., Any]] = None,
                 worker_init_fn: Optional[Callable[[int], None]] = None,
                 costs: Union[None, str, os.PathLike] = None,
                 keys: Union[None, str, os.PathLike] = None,
                 key: Optional[str] = None,
                 num_workers: Optional[int] = None, persistent_workers: bool = False,
                 prefetch_factor: Optional[int] = None, pin_memory: bool = False,
                 pin_memory_device: str = "", generator: Any = None,
                 sampler: Any = None, batch_sampler: Any = None,
                 multiprocessing_context: Any = None, in_order: bool = True,
                 log_level: Optional[str] = None,
                 sample_timeout: Optional[float] = 300.0) -> None:
        _set_log_level(log_level)
        source, dataset = _source_or_dataset(source, dataset)
        _refuse_torch_only(pipeline, sampler, batch_sampler, multiprocessing_context, in_order)
        workers = _workers_arg(workers, num_workers)
        seed = _seed_arg(seed, generator)
        if prefetch is None:
            prefetch = 4 if prefetch_factor is None else _prefetch_of(prefetch_factor, workers)
        if timeout is not None and timeout <= 0:
            timeout = None  # torch's 0: no timeout
        self.pin_memory = _pin_memory_arg(pin_memory, pin_memory_device)
        self.persistent_workers = bool(persistent_workers)
        if not drop_last and rebalance:
            raise InvalidArgumentError(
                "drop_last=False does not work with rebalance: tier 2 trades full batches")
        if batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be >= 1, not {batch_size}")
        if prefetch < 1:
            raise InvalidArgumentError(f"prefetch must be >= 1, not {prefetch}")
        if prefetch_max is not None and not prefetch <= prefetch_max <= 1024:
            raise InvalidArgumentError(
                f"prefetch_max must be in [prefetch={prefetch}, 1024], not {prefetch_max}")
        if on_error not in ("raise", "skip"):
            raise InvalidArgumentError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if plan not in _TOKEN_PLANS:
            raise InvalidArgumentError(
                f"plan must be one of {sorted(_TOKEN_PLANS)}, not {plan!r}")
        if not 1 <= plan_window <= 1024:
            raise InvalidArgumentError(f"plan_window must be in [1, 1024], not {plan_window}")
        _set_arena_budget(arena_budget)
        auth = _keys(keys, key)
        self._blend_dir: Optional[str] = None
        self.dataset = dataset
        self._costs_path = os.fspath(costs) if costs is not None else None
        self._learned: Dict[str, Dict[str, float]] = {}
        if dataset is not None:
            import tempfile
            if source is not None or pipeline is not None:
                raise InvalidArgumentError(
                    "give a source (with its pipeline) or a dataset, not both")
            self._blend_dir = tempfile.mkdtemp(prefix="datahelix-dataset-")
            pipeline = _dataset_source(dataset, self._blend_dir, seed=seed,
                                       collate_fn=collate_fn, worker_init_fn=worker_init_fn,
                                       costs=self._costs_path, sample_timeout=sample_timeout)
            if self._costs_path:
                self._learned = _load_costs(self._costs_path)
            source = self._blend_dir
            if not arena_bytes and not self._learned and \
                    getattr(dataset, "estimate_cost", None) is None:
                # no sizes to size the embedded arena by: the budget (a sparse memfd costs
                # only what the batches in flight take; the byte cap learns the real sizes)
                arena_bytes = _arena_budget_bytes()
        elif collate_fn is not None or worker_init_fn is not None or costs is not None:
            raise InvalidArgumentError(
                "collate_fn, worker_init_fn and costs are for a Python dataset (dataset=)")
        elif source is None:
            raise InvalidArgumentError("give a source (a data set directory, manifest or "
                                       "profile file) or a dataset")
        if isinstance(source, (list, tuple)):
            import tempfile
            self._blend_dir = tempfile.mkdtemp(prefix="datahelix-blend-")
            source = blend(source, self._blend_dir, seed=seed)
        paths = resolve_source(source)
        self.source = os.fspath(source)
        self.profiles = paths["profiles"]
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.prefetch = prefetch
        self.on_error = on_error
        self.plan = plan
        self.plan_window = plan_window
        self.drop_last = bool(drop_last)
        self.max_steps = max_steps
        if epochs < 0:
            raise InvalidArgumentError(f"epochs must be >= 0, not {epochs}")
        if epochs == 0 and not max_steps:
            raise InvalidArgumentError("epochs=0 (no end) needs max_steps")
        self.epochs = epochs
        self.rank = rank if rank is not None else (_env_int("RANK") or 0)
        self.world_size = world_size if world_size is not None else (_env_int("WORLD_SIZE") or 1)
        if not 0 <= self.rank < self.world_size:
            raise InvalidArgumentError(f"rank {self.rank} is not in [0, {self.world_size})")
        # a Python dataset's spec: its seed is rewritten per pass (the pass's base seed)
        self._py_spec = pipeline if dataset is not None else None
        self._pipeline = _pipeline_json(pipeline)
        if dataset is None:
            _warn_if_probed_otherwise(self._pipeline, paths["profiles"], paths["manifest"])
        rebalance_spec = _rebalance_config(rebalance, batch_size, self.world_size,
                                           auth.get("keys_dir"))
        if coordinator is None and self.world_size > 1:
            coordinator = _torchrun_coordinator(self.rank, workers, pipeline, arena_bytes, policy,
                                                auth)
        self.coordinator = coordinator
        self._embedded = coordinator is None
        self._cluster: Optional[Cluster] = None  # persistent_workers: the embedded servers
        self._cluster_args = dict(workers=workers or os.cpu_count() or 1,
                                  arena_bytes=arena_bytes, policy=policy, auth=auth)
        self._client_kwargs = dict(
            coordinator=coordinator, node=_node_name(node), prefetch=prefetch,
            prefetch_max=prefetch_max or 0, seed=seed,
            shuffle=bool(shuffle), token_plan=_TOKEN_PLANS[plan], plan_window=plan_window,
            drop_last=self.drop_last, on_error=on_error,
            next_timeout_ms=-1 if timeout is None else max(1, int(timeout * 1000)),
            connect_timeout_ms=max(1, int(connect_timeout * 1000)), pipeline_json=self._pipeline,
            workers=workers or os.cpu_count() or 1, arena_bytes=arena_bytes, policy=policy,
            # the ranks that share this node's arena (torchrun sets LOCAL_WORLD_SIZE); 0 = all
            local_ranks=(_env_int("LOCAL_WORLD_SIZE") or 0) if self.world_size > 1 else 0,
            **auth)
        if rebalance_spec is not None:
            # a part is the unit that moves: fanout parts per batch (default: single samples)
            self._client_kwargs["fanout"] = rebalance_spec.pop("fanout")
            self._client_kwargs["rebalance"] = rebalance_spec
            _rebalance_loaders.add(self)
        self.rebalance = rebalance_spec is not None
        self._captions, self._meta = load_manifest_meta(paths["manifest"])
        warn_if_profiles_dropped(self.profiles, paths["manifest"], len(self._captions))
        self._epoch = 0
        self._pinned = True    # the next pass is self._epoch (set_epoch, load_state_dict, the
        #                        first pass); else it is the one after the last pass's
        self._passes = 0
        self._resume_step = 0  # load_state_dict: batches of the next pass already yielded
        self._yielded = 0      # batches of the current pass yielded (or raised) so far
        self._pass_first = 0   # the pass's first batch (its resume step)
        self._client: Optional[_C.Client] = None
        self._client_epoch = -1
        self._len: Optional[int] = None
        self._last_stats: Dict[str, Any] = {}

    # -- lifecycle ------------------------------------------------------------------------

    def _open(self, epoch: int) -> "_C.Client":
        """The client of an epoch (one per epoch: its plan starts at that epoch's steps)."""
        if self._client is not None and self._client_epoch == epoch:
            return self._client
        self._close_client()
        kwargs = dict(self._client_kwargs)
        if self._py_spec is not None:  # worker_init_fn sees this pass's seed (torch's)
            kwargs["pipeline_json"] = json.dumps(
                dict(self._py_spec, seed=_C.epoch_seed(self.seed, epoch)))
        if self._embedded and self.persistent_workers:
            kwargs["coordinator"] = self._persistent_cluster(kwargs["pipeline_json"]).endpoint
        self._client = _C.Client(self.profiles, self.rank, self.world_size, self.batch_size,
                                 epochs=self.epochs, first_epoch=epoch,
                                 max_steps=self.max_steps, first_step=self._resume_step,
                                 **kwargs)
        self._client_epoch = epoch
        self._len = int(self._client.stats()["steps_total"]) + self._resume_step
        return self._client

    def _persistent_cluster(self, pipeline_json: Optional[str]) -> Cluster:
        """persistent_workers: the coordinator and DataServer this loader keeps across
        passes (threads of this process, on loopback), started by the first pass; its
        Python worker processes live as long as the loader."""
        if self._cluster is None:
            a = self._cluster_args
            coord = _C.Coordinator("tcp://127.0.0.1:*", policy=a["policy"], **a["auth"])
            try:
                server = _C.DataServer(coord.endpoint, self._client_kwargs["node"],
                                       workers=a["workers"], pipeline_json=pipeline_json,
                                       arena_bytes=a["arena_bytes"], **a["auth"])
            except BaseException:
                coord.close()
                raise
            self._cluster = Cluster(coord, coord.endpoint, server)
        return self._cluster

    def _close_client(self) -> None:
        if self._client is not None:
            self._last_stats = self._client.stats()
            self._client.close()
            self._client = None
            self._client_epoch = -1
        self._save_costs()

    def _save_costs(self) -> None:
        """Writes the learned per-sample costs (dataset mode with ``costs=``): this rank's
        file (``costs`` itself for one rank, ``costs.rankR`` for several), replaced
        atomically; the next run's loaders read them all."""
        if not self._costs_path or not self._learned:
            return
        path = self._costs_path if self.world_size == 1 else f"{self._costs_path}.rank{self.rank}"
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for key in sorted(self._learned, key=lambda k: (len(k), k)):
                f.write(json.dumps({"id": key, **self._learned[key]}) + "\n")
        os.replace(tmp, path)
    def close(self) -> None:
        """Stops this rank's client (and servers it embeds). Tensors already yielded stay
        valid: their slabs are returned when they are freed."""
        self._close_client()
        if getattr(self, "_cluster", None) is not None:
            self._cluster.close()
            self._cluster = None
        if getattr(self, "_blend_dir", None):
            import shutil
            shutil.rmtree(self._blend_dir, ignore_errors=True)
            self._blend_dir = None

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- the torch DataLoader surface -----------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Pins the epoch the next pass yields (its own seeded order and worker seeds), as
        ``DistributedSampler.set_epoch``. After ``load_state_dict``, ``set_epoch`` of the
        saved epoch keeps the resume point (the standard loop resumes mid-epoch); another
        epoch starts at its first step. Without it, each new pass moves on to the next
        epoch (as torch's ``RandomSampler`` reshuffles every pass)."""
        if epoch < 0:
            raise InvalidArgumentError(f"epoch must be >= 0, not {epoch}")
        if int(epoch) != self._epoch:
            self._epoch = int(epoch)
            self._resume_step = 0
            self._yielded = 0
        self._pinned = True

    def __len__(self) -> int:
        """Batches this rank gets per pass (one epoch's; ``epochs`` times that with
        ``epochs`` > 1; the same on every rank), resumed batches included."""
        if self._len is None:
            self._open(self._epoch)
        assert self._len is not None
        return self._len

    def __iter__(self) -> "_Pass":
        if not self._pinned and self._passes:
            self._epoch += max(1, self.epochs)  # a new pass is the next epoch's
            self._resume_step = 0
        self._pinned = False
        self._passes += 1
        client = self._open(self._epoch)
        # The client is consumed by this pass; a new pass opens a new one.
        self._client_epoch = -1
        self._yielded = self._resume_step
        self._pass_first = self._resume_step
        self._resume_step = 0
        return _Pass(self, client)

    # -- resume ---------------------------------------------------------------------------

    _STATE_KEYS = ("seed", "shuffle", "batch_size", "world_size", "plan", "plan_window",
                   "epochs", "max_steps", "drop_last")

    def state_dict(self) -> Dict[str, Any]:
        """Where this rank's data stands, for a checkpoint (as torchdata's
        StatefulDataLoader): the epoch of the pass, the batches of it already yielded, and
        the settings the order depends on. ``load_state_dict`` of it on a new loader with
        the same settings makes the next pass yield exactly the batches that were left, in
        the order an uninterrupted run would have. A plain dict of ints, str and bool: it
        goes in a ``torch.save`` or a ``torch.distributed.checkpoint`` state as it is."""
        state: Dict[str, Any] = {"version": 1, "rank": self.rank, "epoch": self._epoch,
                                 "step": self._resume_step or self._yielded}
        for key in self._STATE_KEYS:
            state[key] = getattr(self, key)
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes from ``state_dict()``: the next pass starts at its epoch and step. Raises
        InvalidArgumentError naming the setting that differs (the order would not be the
        same), or when a pass is under way."""
        if not isinstance(state, dict) or state.get("version") != 1:
            raise InvalidArgumentError("not a DataLoader state_dict (version 1)")
        if self._client is not None:
            raise InvalidArgumentError("load_state_dict during a pass: call it before iterating")
        for key in self._STATE_KEYS:
            if key in state and state[key] != getattr(self, key):
                raise InvalidArgumentError(
                    f"state_dict: {key} was {state[key]!r}, this loader has "
                    f"{getattr(self, key)!r}: the order would differ")
        step = int(state.get("step", 0))
        if step < 0:
            raise InvalidArgumentError(f"state_dict: step {step} < 0")
        self.set_epoch(int(state.get("epoch", 0)))
        self._resume_step = step
        self._yielded = 0
        self._pinned = True

    def stats(self) -> Dict[str, Any]:
        """The client's counters (batches, samples, samples_failed, wait_s, notices,
        copied_tensors, ...), of the current or the last pass."""
        if self._client is not None:
            return self._client.stats()
        return dict(self._last_stats)

    # -- conversion -----------------------------------------------------------------------

    def _to_torch(self, batch: "_C.Batch") -> Dict[str, Any]:
        """The batch as a dict: the dataset's keys (tensors, lists), then the loader's own
        metadata (sample_ids, errors, info, tokens; indices with a Python dataset, captions
        without), always all of it at ``batch["__datahelix__"]`` and each also at its own
        name unless a dataset key has that name (the dataset's wins there; a warning says so
        once). With on_error="skip", keys a failed batch lacks (every sample of it failed,
        or its collate_fn) are filled from the earlier batches: zeros, masks false, lists of
        None (docs/python.md, "A batch's keys")."""
        import torch
        from ._collate import LOADER_KEYS, META_KEY

        out: Dict[str, Any] = {}
        info = batch.info
        for name, tensor in batch.tensors().items():
            t = torch.from_dlpack(tensor)
            out[name] = t
            if name == "frames" or (self.dataset is not None and "arena" not in info):
                # (base, bytes) of the shared-memory arena holding the frames (a Python
                # dataset's: its first array); None when they came by copy (a spilled batch)
                info["arena"] = tensor.arena()
        samples = batch.samples()
        ids = [s[0] for s in samples]
        loader: Dict[str, Any] = {}
        meta = out.pop("__meta__", None)
        if meta is not None:  # a Python dataset's other values, a JSON row per sample
            rows = self._meta_rows(meta, samples)
            for key in _row_keys(rows):
                out[key] = [r.get(key) for r in rows]
            loader["indices"] = [int(i) for i in ids]
        loader["tokens"] = torch.tensor([s[1] for s in samples], dtype=torch.int64)
        loader["sample_ids"] = ids
        # drop_last=False: the pads of an epoch's last step (repeats of its first samples)
        loader["padded"] = torch.tensor(batch.padded(), dtype=torch.bool)
        if self.dataset is None:
            loader["captions"] = [self._captions.get(i, "") for i in ids]
            join_meta(out, ids, self._meta)  # labels by id: tensors or lists (_meta.py)
        loader["errors"] = [s[3] for s in samples]
        loader["info"] = info
        out.pop(META_KEY, None)  # never a dataset's: the worker refuses the name
        # the dataset keys seen in batches (name -> (dtype, shape, batch size) or None for a
        # list), to give a batch whose samples all failed the same keys; and the loader's
        # names a dataset key shadows (warned once each)
        if "_keys_seen" not in self.__dict__:
            self._keys_seen: Dict[str, Any] = {}
            self._shadowed: set = set()
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
        if self._costs_path:
            for row, s in zip(rows, samples):
                if s[2] == 0 and "__cpu_s" in row:
                    self._learned[s[0]] = {"cpu_s": float(row["__cpu_s"]),
                                           "tokens": float(s[1]),
                                           "out_bytes": float(row.get("__bytes", 0))}
        return rows
