"""The DataLoader: its arguments, one client per pass, and its resume state (each batch's
conversion is _convert.py's, the resume arithmetic resume.py's)."""

from __future__ import annotations

import json
import os
import sys
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _C
from ._C import DataHelixError, InvalidArgumentError
from ._convert import BatchConverter
from ._meta import load_manifest_meta, warn_if_profiles_dropped
from ._torch_args import (_pin_memory_arg, _prefetch_of, _refuse_torch_only, _seed_arg,
                          _source_or_dataset, _workers_arg)
from .cluster import (_DEFAULT_ARENA, Cluster, _env_int, _keys,
                      _node_name, _rebalance_loaders, _set_arena_budget, _set_log_level,
                      _torchrun_coordinator)
from . import resume as _resume
from .rebalance import _rebalance_config
from .sources import (_TOKEN_PLANS, _dataset_source, _load_costs, _pipeline_json,
                      _warn_if_probed_otherwise, _with_sample_timeout, blend, resolve_source)


def _dist_group() -> Optional[Tuple[int, int]]:
    """(rank, world size) of torch.distributed's default process group when one is
    initialized in this process, else None (torch.distributed is not imported for this)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def _job_rank_world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """The rank and world size a loader takes when not given: torchrun's RANK and WORLD_SIZE;
    without RANK in the environment, those of an initialized torch.distributed process group
    (Lightning's DDP launcher sets WORLD_SIZE and LOCAL_RANK but not RANK, and creates the
    group before calling ``train_dataloader()``); else 0 and 1."""
    env_rank = _env_int("RANK")
    group = _dist_group() if env_rank is None else None
    if group is not None:
        found = group
    else:
        found = (env_rank or 0, _env_int("WORLD_SIZE") or 1)
    return (found[0] if rank is None else rank,
            found[1] if world_size is None else world_size)


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
        if loader._client is client:
            loader._untouched = False
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
        source: a synth/probe directory, a manifest or a profile file (resolve_source), local
            or at an http(s):// or s3:// URL (``s3://bucket/prefix/manifest.jsonl`` with its
            ``profiles.jsonl`` next to it; docs/datasets.md "Data in object storage"); or
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
        rank, world_size: default to torchrun's RANK and WORLD_SIZE; without RANK, to an
            initialized torch.distributed process group's (Lightning's DDP); else 0 and 1.
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
            such as "8G" or "512M" (``_C.parse_bytes``; default: DH_ARENA_BUDGET, else a
            quarter of physical memory or of the memory cgroup's limit). Sets DH_ARENA_BUDGET for this process. A budget that cannot hold one
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
            the time (``on_error``; docs/datasets.md, "Hangs: sample_timeout"). With a
            video source, seconds one sample's read and decode may take: past it the sample
            fails naming it and the time, and its decode thread is abandoned for a new one
            (docs/runtime.md, "Deadlines").
        costs: with ``dataset``, a JSONL file of learned per-sample costs: read at the start
            (with ``costs.rank*``) and written when a pass ends.
        prefetch_factor, pin_memory, pin_memory_device, generator: as torch's (pinning
            needs CUDA: without it a warning, once, and no pinning).
        sampler, batch_sampler, multiprocessing_context (other than "spawn"), in_order=False:
            refused, each with a message saying what to use instead.
        elastic_keep: what ``load_state_dict(state)`` keeps fixed when ``state`` was saved
            at another world size and no ``keep`` is given: "global_batch", "rank_batch",
            or None (the default: what this loader's batch_size keeps). For callers that
            pass no ``keep``: torch.distributed.checkpoint's ``Stateful`` load,
            ``accelerator.load_state`` (docs/python.md, "Training stacks").
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
                 sample_timeout: Optional[float] = 300.0,
                 elastic_keep: Optional[str] = None) -> None:
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
        if elastic_keep is not None and elastic_keep not in _resume.KEEP:
            raise InvalidArgumentError(f"elastic_keep must be one of {list(_resume.KEEP)} "
                                       f"or None, not {elastic_keep!r}")
        self.elastic_keep = elastic_keep
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
                arena_bytes = _C.arena_budget_default()
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
        # the remote reader's settings as the environment says now (DH_CA_BUNDLE, the AWS
        # variables): this loader's and its embedded DataServers' reads (docs/remote.md)
        _C.remote_reload_settings()
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
        self._job_inferred = rank is None or world_size is None
        self.rank, self.world_size = _job_rank_world(rank, world_size)
        if not 0 <= self.rank < self.world_size:
            raise InvalidArgumentError(f"rank {self.rank} is not in [0, {self.world_size})")
        # a Python dataset's spec: its seed is rewritten per pass (the pass's base seed)
        self._py_spec = pipeline if dataset is not None else None
        self._pipeline = _pipeline_json(pipeline)
        if dataset is None:  # the native decode's deadline (docs/runtime.md, "Deadlines")
            self._pipeline = _with_sample_timeout(self._pipeline, sample_timeout)
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
        captions, meta = load_manifest_meta(paths["manifest"])
        warn_if_profiles_dropped(self.profiles, paths["manifest"], len(captions))
        self._to_torch = BatchConverter(dataset is not None, captions, meta,
                                        self._learned if self._costs_path else None)
        self._epoch = 0
        self._pinned = True    # the next pass is self._epoch (set_epoch, load_state_dict, the
        #                        first pass); else it is the one after the last pass's
        self._passes = 0
        self._untouched = False  # the current pass has had no next() yet (an iter() to check)
        self._pass_ref: Optional["weakref.ref[_Pass]"] = None  # the current pass's iterator
        self._load_pinned = False  # load_state_dict pinned the next pass and set_epoch did not
        self._resume_step = 0  # load_state_dict: batches of the next pass already yielded
        self._resume_sample = 0  # and the sample its epoch is cut from (an elastic resume)
        self._pass_sample = 0  # the sample the current (or last) pass's epoch was cut from
        # the loader's count minus the pass's own step (an elastic resume keeping the per-rank
        # batch goes on counting from the saved step): of the next pass, of the current one
        self._resume_shift = 0
        self._pass_shift = 0
        self._len_told: Optional[int] = None  # what len() last returned (load_state_dict)
        self._keep: Optional[str] = None  # what the last elastic resume kept fixed
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
        group = _dist_group() if self._job_inferred else None
        if group is not None and group != (self.rank, self.world_size):
            raise InvalidArgumentError(
                f"this DataLoader took rank {self.rank} of world size {self.world_size} when it "
                f"was made, but torch.distributed's process group is now rank {group[0]} of "
                f"{group[1]}: make the loader once the group exists (under Lightning in "
                f"train_dataloader(), not in __init__ or prepare_data), or give rank= and "
                f"world_size=")
        kwargs = dict(self._client_kwargs)
        if self._py_spec is not None:  # worker_init_fn sees this pass's seed (torch's)
            kwargs["pipeline_json"] = json.dumps(
                dict(self._py_spec, seed=_C.epoch_seed(self.seed, epoch)))
        if self._embedded and self.persistent_workers:
            kwargs["coordinator"] = self._persistent_cluster(kwargs["pipeline_json"]).endpoint
        self._client = _C.Client(self.profiles, self.rank, self.world_size, self.batch_size,
                                 epochs=self.epochs, first_epoch=epoch,
                                 max_steps=self.max_steps, first_step=self._resume_step,
                                 first_sample=self._resume_sample, **kwargs)
        self._client_epoch = epoch
        self._len = int(self._client.stats()["steps_total"]) + self._resume_step + \
            self._resume_shift
        return self._client

    def _persistent_cluster(self, pipeline_json: Optional[str]) -> Cluster:
        """persistent_workers: the coordinator and DataServer this loader keeps across
        passes (threads of this process, on loopback), started by the first pass; its
        Python worker processes live as long as the loader."""
        if self._cluster is None:
            a = self._cluster_args
            self._cluster = Cluster(_C.Cluster(
                listen="tcp://127.0.0.1:*", policy=a["policy"],
                node=self._client_kwargs["node"], workers=a["workers"],
                pipeline_json=pipeline_json, arena_bytes=a["arena_bytes"], **a["auth"]))
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
            self._resume_step = self._resume_sample = self._pass_sample = 0
            self._resume_shift = self._pass_shift = 0
            self._yielded = 0
        self._pinned = True
        self._load_pinned = False

    def __len__(self) -> int:
        """Batches this rank gets per pass (one epoch's; ``epochs`` times that with
        ``epochs`` > 1; the same on every rank), resumed batches included: after
        ``load_state_dict``, ``state_dict()["step"]`` plus the batches left."""
        if self._len is None:
            self._open(self._epoch)
        assert self._len is not None
        self._len_told = self._len
        return self._len

    def __iter__(self) -> "_Pass":
        if self._untouched and self._client is not None and self._client_epoch == -1 and \
                not self._pinned:
            # no batch was taken from the last pass (Lightning calls iter() once to check that
            # the loader is iterable): this one replaces it, at the same epoch and step, with
            # its client (and what it prefetched); the abandoned iterator ends
            old = self._pass_ref() if self._pass_ref is not None else None
            if old is not None:
                old._client = None
            self._client_epoch = self._epoch
            self._resume_step = self._pass_first
            self._resume_sample = self._pass_sample
            self._resume_shift = self._pass_shift
            self._pinned = True
        if not self._pinned and self._passes:
            self._epoch += max(1, self.epochs)  # a new pass is the next epoch's
            self._resume_step = self._resume_sample = self._resume_shift = 0
        resumed, self._load_pinned = self._load_pinned, False
        self._pinned = False
        self._passes += 1
        client = self._open(self._epoch)
        if resumed and self._resume_step and self.epochs and \
                self._len == self._resume_step + self._resume_shift:
            # a state taken after the pass's last batch, iterated without set_epoch (as
            # Lightning does after a checkpoint at an epoch's end): the next epoch, from its
            # first step, not an empty pass
            self._close_client()
            self._epoch += max(1, self.epochs)
            self._resume_step = self._resume_sample = self._resume_shift = 0
            client = self._open(self._epoch)
        self._untouched = True
        # The client is consumed by this pass; a new pass opens a new one.
        self._client_epoch = -1
        self._yielded = self._resume_step
        self._pass_first = self._resume_step
        self._pass_sample = self._resume_sample
        self._pass_shift = self._resume_shift
        self._resume_step = self._resume_sample = self._resume_shift = 0
        it = _Pass(self, client)
        self._pass_ref = weakref.ref(it)
        return it

    # -- resume ---------------------------------------------------------------------------

    KEEP = _resume.KEEP

    def state_dict(self) -> Dict[str, Any]:
        """Where this rank's data stands, for a checkpoint (as torchdata's
        StatefulDataLoader): the epoch of the pass, the batches of it already yielded, and
        the settings the order depends on. ``load_state_dict`` of it on a new loader with
        the same settings makes the next pass yield exactly the batches that were left, in
        the order an uninterrupted run would have; on a loader of another world size it
        resumes elastically (docs/python.md, "Elastic resume"). ``step`` goes on from the
        saved count after an elastic resume (not the pass's own steps), ``position`` is
        where the next step's window starts in the epoch's order (``first_sample`` plus the
        pass's own steps x world_size x batch_size), ``first_sample`` the sample the pass's
        epoch was cut from (0 but after an elastic resume inside a step), ``keep`` what the
        last elastic resume kept fixed (None: none happened). A plain dict
        of ints, str, bool and None: it goes in a ``torch.save`` or a
        ``torch.distributed.checkpoint`` state as it is."""
        own = self._resume_step or self._yielded  # the pass's own steps
        state: Dict[str, Any] = {"version": 1, "rank": self.rank, "epoch": self._epoch,
                                 "step": own + self._pass_shift}
        for key in _resume.STATE_KEYS:
            state[key] = getattr(self, key)
        state["position"] = self._pass_sample + own * self.world_size * self.batch_size
        state["first_sample"] = self._pass_sample
        state["keep"] = self._keep
        return state

    @staticmethod
    def merge_states(states: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
        """One state from the ``state_dict()`` of several ranks of a job (all of them or
        any): they must agree on everything but ``rank`` (the plan is the same for all, so
        any one is enough); the result has ``ranks`` (theirs, sorted) instead of ``rank``
        and loads on any rank, of any world size (``load_state_dict``). Raises
        InvalidArgumentError naming the ranks and the key where two states differ, and for
        a rank given twice or outside the states' world size."""
        return _resume.merge_states(states)

    def _elastic_step(self, state: Dict[str, Any], keep: Optional[str]) -> Tuple[int, int]:
        """The pass's own step, and the sample the pass is cut from, at which this loader
        resumes a state of another world size (resume.elastic_step). Sets self._keep."""
        step2, first, self._keep = _resume.elastic_step(
            state, keep, world_size=self.world_size, batch_size=self.batch_size,
            epochs=self.epochs, max_steps=self.max_steps, plan_window=self.plan_window)
        return step2, first

    def load_state_dict(self, state: Dict[str, Any], keep: Optional[str] = None) -> None:
        """Resumes from ``state_dict()`` (one rank's, or ``merge_states`` of several): the
        next pass starts at its epoch and step. A state of another world size resumes
        elastically (docs/python.md, "Elastic resume"): at the same position of the epoch's
        order, keeping fixed the global batch (``keep="global_batch"``: this loader's
        batch_size must be the saved world_size x batch_size / world_size) or the per-rank
        batch (``keep="rank_batch"``); None: the loader's ``elastic_keep``, else what its
        batch_size keeps. ``rank`` (or ``ranks``) is not used: any rank's state resumes
        every rank. Raises InvalidArgumentError naming the setting that differs (the order
        would not be the same), a batch or step that does not fit the new world size
        (naming both), or when a pass is under way (``len()`` alone starts none)."""
        if not isinstance(state, dict) or state.get("version") != 1:
            raise InvalidArgumentError("not a DataLoader state_dict (version 1)")
        if self._client is not None:
            if self._client_epoch == -1 and not self._untouched:  # a pass holds it
                raise InvalidArgumentError(
                    "load_state_dict during a pass: call it before iterating")
            self._close_client()  # len()'s client, or a pass no batch was taken from
        if keep is None:
            keep = self.elastic_keep
        settings = {key: getattr(self, key) for key in _resume.STATE_KEYS}
        elastic = _resume.check_order(state, keep, settings)
        step, first = _resume.resume_point(state)
        if elastic:
            if "batch_size" not in state:
                raise InvalidArgumentError("state_dict: no batch_size, cannot resume at "
                                           "another world size")
            step, first = self._elastic_step(state, keep)
        else:
            self._keep = state.get("keep")
        # the loader's count goes on from the saved one: the resumed pass's first batch is
        # step state["step"] (not its own step when the global batch changed), and len() is
        # that plus the batches left, so a trainer's restored batch counter and it agree.
        # On a smaller global batch the samples consumed fill more (smaller) steps: the
        # count then starts at those, ceil(position / G), so that len() is never less than
        # a fresh epoch's at this size (Lightning keeps the first epoch's len() for all)
        count = int(state.get("step", step))
        if elastic:
            g2 = self.world_size * self.batch_size
            count = max(count, -(-(first + step * g2) // g2))  # ceil(position / G)
        self.set_epoch(int(state.get("epoch", 0)))
        self._resume_step = step
        self._resume_sample = self._pass_sample = first
        self._resume_shift = self._pass_shift = count - step
        self._yielded = 0
        self._pinned = True
        self._len = None  # len() counts from the resumed pass's client
        self._load_pinned = True
        told, self._len_told = self._len_told, None
        if told is not None and len(self) > told:
            import warnings
            warnings.warn(
                f"DataLoader.load_state_dict: len() was {told} before this state was loaded, "
                f"the resumed pass has {self._len} batches (step {count} and "
                f"{self._len - count} left, world size {state.get('world_size')} -> "
                f"{self.world_size}): a trainer that took len() before (Lightning's epoch "
                f"limit) stops {self._len - told} batches early; load the state before len() "
                f"(docs/python.md, \"PyTorch Lightning\")", stacklevel=2)
        self._len_told = None  # len() here told no one

    def stats(self) -> Dict[str, Any]:
        """The client's counters (batches, samples, samples_failed, wait_s, notices,
        copied_tensors, ...), of the current or the last pass."""
        if self._client is not None:
            return self._client.stats()
        return dict(self._last_stats)
