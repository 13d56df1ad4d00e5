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

This file only re-exports. The package: ``loader`` (DataLoader), ``cluster`` (Cluster,
start_cluster, torchrun discovery, process-wide settings), ``sources`` (data sets on disk:
resolve_source, plan, blend, count_text_tokens, a Python dataset's profile set and pickle),
``rebalance`` (DataLoader(rebalance=...)), ``workers`` (get_worker_info, default_collate);
the private ``_worker`` (the worker process), ``_collate``, ``_meta``, ``_exchange``,
``_spec``, ``_torch_args`` beneath them (docs/python.md, "Package layout").
"""

from __future__ import annotations

from . import _C  # noqa: F401  (datahelix._C)
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
from ._spec import ArraySpec
from .cluster import COORDINATOR_PORT_OFFSET, Cluster, start_cluster  # noqa: F401
from .loader import DataLoader
from .rebalance import REBALANCE_KEYS
from .sources import blend, count_text_tokens, plan, resolve_source
from .workers import default_collate, get_worker_info

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
