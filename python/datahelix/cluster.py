"""The servers of this process and how it finds them: Cluster and start_cluster, the
torchrun job's coordinator and node servers, closing them at exit, and the process-wide
settings they read (node name, log level, CURVE keys, arena budget, environment integers)."""

from __future__ import annotations

import atexit
import os
import socket
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Union

from . import _C
from ._C import InvalidArgumentError
from .sources import _dataset_source, _pipeline_json, resolve_source


# 0: the arena is sized by the C side (docs/runtime.md, "Prefetch in bytes"): what the
# prefetch horizon needs, bounded by the memory budget (_C.arena_budget_default():
# DH_ARENA_BUDGET, else a quarter of physical memory or of the memory cgroup's limit); its
# memfd is sparse, so it costs only what the batches in flight take.
_DEFAULT_ARENA = 0


def _set_arena_budget(arena_budget: Union[None, int, str]) -> None:
    """Sets the memory budget of the arenas this process makes (DH_ARENA_BUDGET, read by
    the DataServer and the embedded client when arena_bytes is 0): bytes, or a byte count as
    the C side parses it (_C.parse_bytes: digits with an optional K, M or G suffix). None
    leaves it as it is."""
    if arena_budget is None:
        return
    if isinstance(arena_budget, bool) or not isinstance(arena_budget, (int, str)):
        raise InvalidArgumentError(
            f"arena_budget must be a byte count > 0 (e.g. 8 << 30, '8G', '512M'), "
            f"not {arena_budget!r}")
    text = str(arena_budget)
    _C.parse_bytes(text, "arena_budget")  # raises InvalidArgumentError naming it
    os.environ["DH_ARENA_BUDGET"] = text


# The coordinator a torchrun job finds without being told: MASTER_ADDR at MASTER_PORT + this.
COORDINATOR_PORT_OFFSET = 17


class _CoordinatorPart:
    """``Cluster.coordinator``: the cluster's coordinator (``stats()``, ``endpoint``)."""

    def __init__(self, core: "_C.Cluster"):
        self._core = core

    @property
    def endpoint(self) -> Optional[str]:
        return self._core.endpoint

    def stats(self) -> Dict[str, Any]:
        return self._core.coordinator_stats()

    metrics_table = staticmethod(_C.Coordinator.metrics_table)


class _ServerPart:
    """``Cluster.server``: the cluster's DataServer (``stats()``, ``arena_stats()``,
    ``name``, ``endpoint``: its data endpoint)."""

    def __init__(self, core: "_C.Cluster"):
        self._core = core

    @property
    def name(self) -> str:
        return self._core.server_name

    @property
    def endpoint(self) -> str:
        return self._core.server_endpoint

    def stats(self) -> Dict[str, Any]:
        return self._core.server_stats()

    def arena_stats(self) -> Dict[str, int]:
        return self._core.server_arena_stats()

    metrics_table = staticmethod(_C.DataServer.metrics_table)


class Cluster:
    """A coordinator and/or a local DataServer running as threads of this process.

    What ``start_cluster`` returns, and what a torchrun job's rank 0 (the coordinator) and
    each node's local rank 0 (its node's DataServer) start for the others to share: one
    ``_C.Cluster`` (the C library's in-process cluster, include/datahelix/cluster.h), or none
    for a rank that only connects. ``endpoint`` is the coordinator's; ``coordinator`` and
    ``server`` are its parts (None when it runs none); ``close()`` stops both (also at exit).
    """

    def __init__(self, core: Optional["_C.Cluster"], endpoint: Optional[str] = None,
                 scratch_dir: Optional[str] = None):
        self._core = core
        self.endpoint = endpoint if endpoint is not None else core.endpoint if core else None
        self.coordinator = _CoordinatorPart(core) if core and core.has_coordinator else None
        self.server = _ServerPart(core) if core and core.has_server else None
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
        self.coordinator = None
        self.server = None
        if self._core is not None:
            self._core.close()  # every server stopped, then the coordinator
            self._core = None
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
_rebalance_loaders: "weakref.WeakSet[Any]" = weakref.WeakSet()  # DataLoaders (loader.py)


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
    try:
        core = _C.Cluster(listen=listen if coordinator is None else None, join=coordinator,
                          policy=policy, node=_node_name(node),
                          workers=workers or os.cpu_count() or 1,
                          pipeline_json=_pipeline_json(pipeline), arena_bytes=arena_bytes,
                          **auth)
    except BaseException:
        if scratch:
            import shutil
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    cluster = Cluster(core, scratch_dir=scratch)
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
    bind = None
    if rank == 0 and not os.environ.get("DATAHELIX_COORDINATOR"):
        # a loopback master binds loopback; any other binds every interface
        bind = endpoint if addr.startswith("127.") or not endpoint.startswith(f"tcp://{addr}:") \
            else endpoint.replace(f"tcp://{addr}:", "tcp://0.0.0.0:")
    server: Dict[str, Any] = {}
    if local_rank == 0:
        # several nodes (a coordinator off loopback): the data socket binds every interface
        # and the DataServer advertises its address on the route to the coordinator
        # (DATAHELIX_ADVERTISE: a host or endpoint to advertise instead), so sidecars and
        # other nodes reach it; one node on loopback stays on loopback
        host = endpoint[len("tcp://"):].rpartition(":")[0] if endpoint.startswith("tcp://") else ""
        multi = bool(host) and not host.startswith("127.") and host != "localhost"
        server = dict(node=_node_name(None), workers=workers or os.cpu_count() or 1,
                      pipeline_json=_pipeline_json(pipeline), arena_bytes=arena_bytes,
                      data_listen="tcp://0.0.0.0:*" if multi else None,
                      data_advertise=os.environ.get("DATAHELIX_ADVERTISE") or None)
    core = None
    if bind is not None or server:
        # rank 0: the coordinator on `bind` (the servers and clients connect to `endpoint`),
        # with this node's DataServer when it is also local rank 0; another node's local
        # rank 0: a DataServer joining `endpoint`
        where = dict(listen=bind, advertise=endpoint) if bind is not None else \
            dict(listen=None, join=endpoint)
        core = _C.Cluster(policy=policy, **where, **server, **(auth or {}))
    cluster = Cluster(core, endpoint)
    _job_clusters[endpoint] = cluster
    with _clusters_lock:
        _clusters.append(cluster)
    return endpoint
