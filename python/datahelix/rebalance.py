"""DataLoader(rebalance=...): its keys, their checks, and the C binding's rebalance spec made
from them (feature_fn over torch views of a part, process_group as an exchange_fn)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

from . import _C
from ._C import InvalidArgumentError
from ._exchange import _all_to_all_exchange, _refuse_side_door


# The keys of DataLoader(rebalance={...}) (docs/rebalancing.md), one list owned by the C
# binding (src/python/rebalance.c): the paper's shape (feature_fn, sort_fn, client_ranks,
# buffer_size, args), "groups" as the C API names client_ranks, and the knobs of
# dh_rebalance_config_t besides; "process_group" (a torch.distributed group that carries
# cross-node moves in one all_to_all per round) or "exchange_fn" (any collective of the same
# shape), refused with CURVE keys unless "allow_unencrypted_exchange" is True (_exchange.py;
# docs/security.md). Those the binding's parse reads are _C.REBALANCE_SPEC_KEYS; the others
# (client_ranks, fanout, process_group, allow_unencrypted_exchange) are turned into them here.
REBALANCE_KEYS = _C.REBALANCE_KEYS


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
    spec = {k: v for k, v in rebalance.items() if k in _C.REBALANCE_SPEC_KEYS}
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
