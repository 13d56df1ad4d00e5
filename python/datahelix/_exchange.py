"""Tier 2's cross-node exchange through torch.distributed (rebalance["process_group"] or
"exchange_fn"; docs/rebalancing.md, "Moves across nodes in one all_to_all"), and the guard
that keeps it from being a side door around CURVE (docs/security.md, "What travels where"):
with keys configured, that path carries tier-2 payloads between nodes outside the encrypted
data plane, so it is refused unless rebalance["allow_unencrypted_exchange"] is True."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from ._C import InvalidArgumentError

_plaintext_warned = False  # the opt-in's warning is said once per process


def _refuse_side_door(rebalance: Dict[str, Any], keys_dir: Optional[str]) -> None:
    """Raises InvalidArgumentError when CURVE keys are configured (``keys_dir``: keys= or
    DATAHELIX_KEYS) and the rebalance dict gives process_group or exchange_fn without
    allow_unencrypted_exchange=True; with the opt-in, warns once per process. Without keys,
    or without either setting, nothing."""
    global _plaintext_warned
    allow = rebalance.get("allow_unencrypted_exchange", False)
    if not isinstance(allow, bool):
        raise InvalidArgumentError(f"rebalance['allow_unencrypted_exchange'] must be True or "
                                   f"False, not {allow!r}")
    given = [k for k in ("process_group", "exchange_fn") if rebalance.get(k) is not None]
    if not keys_dir or not given:
        return
    if not allow:
        raise InvalidArgumentError(
            f"rebalance['{given[0]}'] with CURVE keys (keys={keys_dir!r}): process_group and "
            f"exchange_fn carry the tier-2 payloads that move across nodes over "
            f"torch.distributed, unencrypted, outside CURVE. Leave both out (the DataServers "
            f"then forward those payloads over CURVE), or opt in with "
            f"rebalance['allow_unencrypted_exchange']=True (docs/security.md)")
    if not _plaintext_warned:
        import warnings
        warnings.warn(
            f"rebalance['allow_unencrypted_exchange']=True: tier-2 payloads that move across "
            f"nodes cross in plaintext over torch.distributed ({given[0]}), outside the CURVE "
            f"encryption of keys={keys_dir!r} (docs/security.md)", stacklevel=4)
        _plaintext_warned = True


def _all_to_all_exchange(group: Any) -> Callable[..., None]:
    """rebalance["process_group"] -> the exchange_fn that carries a round's cross-node moves
    in one ``torch.distributed.all_to_all_single`` over ``group``, whose ranks must be
    exactly the load-balance group's (torch's global ranks = DataHelix ranks). It runs on
    the client's fetcher thread, so the group must be one the training loop does not use
    (``dist.new_group(ranks, backend="gloo")``: collectives on one group from two threads
    would interleave); give it a timeout, which bounds a member that does not come."""
    import torch
    import torch.distributed as dist

    def exchange(round_no: int, ranks: List[int], send: memoryview, send_counts: List[int],
                 recv: memoryview, recv_counts: List[int]) -> None:
        members = dist.get_process_group_ranks(group)
        if list(members) != list(ranks):
            raise ValueError(
                f"rebalance['process_group'] holds ranks {list(members)}, but the "
                f"load-balance group is {list(ranks)}: give a group of exactly its ranks "
                f"(dist.new_group({list(ranks)}, backend='gloo'))")
        empty = torch.empty(0, dtype=torch.uint8)
        out = torch.frombuffer(recv, dtype=torch.uint8) if len(recv) else empty
        inp = torch.frombuffer(send, dtype=torch.uint8) if len(send) else empty
        dist.all_to_all_single(out, inp, output_split_sizes=list(recv_counts),
                               input_split_sizes=list(send_counts), group=group)
        del out, inp  # the views end with the call

    exchange.process_group = group  # type: ignore[attr-defined]
    return exchange
