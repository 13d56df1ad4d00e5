"""torch.utils.data.DataLoader's parameters as DataLoader takes them (docs/python.md,
"torch's DataLoader parameters"): the aliases, the refusals with what to use instead, and
the conversions (generator -> seed, prefetch_factor -> prefetch, pin_memory's warning)."""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

from ._C import InvalidArgumentError

def _source_or_dataset(source: Any, dataset: Any) -> Tuple[Any, Any]:
    """torch's first argument is the dataset: a map-style object given as ``source`` is
    taken as ``dataset``."""
    if source is not None and dataset is None and \
            not isinstance(source, (str, os.PathLike, list, tuple)) and \
            hasattr(source, "__len__") and \
            (hasattr(source, "__getitem__") or hasattr(source, "load_into")):
        return None, source
    return source, dataset


def _refuse_torch_only(pipeline: Any, sampler: Any, batch_sampler: Any, context: Any,
                       in_order: bool) -> None:
    """The torch.utils.data.DataLoader arguments this loader refuses, each with what to use
    instead (docs/python.md, "torch's DataLoader parameters")."""
    if isinstance(pipeline, int) and not isinstance(pipeline, bool):
        raise InvalidArgumentError(
            f"pipeline={pipeline!r}: the second positional parameter is the decode pipeline "
            f"(torch's is batch_size); give batch_size={pipeline} by keyword")
    if sampler is not None or batch_sampler is not None:
        which = "sampler" if sampler is not None else "batch_sampler"
        raise InvalidArgumentError(
            f"{which} is not supported: the order is the loader's own seeded, token-balanced "
            f"plan, the same on every rank (shuffle=, seed=, plan=, plan_window=; "
            f"set_epoch() for the epoch); weight sources with DataLoader([(src, w), ...])")
    if context not in (None, "spawn"):
        raise InvalidArgumentError(
            f"multiprocessing_context={context!r}: a Python dataset's worker processes are "
            f"always started fresh (as 'spawn') by the DataServer")
    if not in_order:
        raise InvalidArgumentError("in_order=False is not supported: batches are always "
                                   "yielded in order (a late sample is waited for)")


def _workers_arg(workers: Optional[int], num_workers: Optional[int]) -> Optional[int]:
    """workers= and torch's num_workers= are one setting; 0 (torch: load in the main
    process) means one worker here."""
    if workers is not None and num_workers is not None and workers != num_workers:
        raise InvalidArgumentError(
            f"workers={workers} and num_workers={num_workers}: one setting, give one")
    n = workers if workers is not None else num_workers
    if n is not None and n < 0:
        raise InvalidArgumentError(f"num_workers must be >= 0, not {n}")
    return None if n is None else max(1, int(n))


def _seed_arg(seed: Optional[int], generator: Any) -> int:
    """The loader's seed: seed=, else a torch.Generator's initial_seed() (the order and each
    pass's worker seeds derive from it; the generator is not advanced), else 0."""
    if generator is None:
        return 0 if seed is None else int(seed)
    initial = getattr(generator, "initial_seed", None)
    if initial is None:
        raise InvalidArgumentError(
            f"generator must be a torch.Generator, not {type(generator).__name__}")
    if seed is not None and int(seed) != int(initial()):
        raise InvalidArgumentError(
            f"seed={seed} and generator (initial_seed {initial()}): give one of them")
    return int(initial())


def _prefetch_of(prefetch_factor: int, workers: Optional[int]) -> int:
    """torch's prefetch_factor: batches loaded ahead per worker, so prefetch_factor x
    num_workers in all."""
    if prefetch_factor < 1:
        raise InvalidArgumentError(f"prefetch_factor must be >= 1, not {prefetch_factor}")
    return int(prefetch_factor) * (workers or os.cpu_count() or 1)


_pin_warned = False  # the warning is said once per process


def _pin_memory_arg(pin_memory: bool, device: str) -> bool:
    """pin_memory: pinned only where CUDA is; without it, warned once (as torch does) and
    off."""
    global _pin_warned
    if not pin_memory:
        return False
    import torch
    if torch.cuda.is_available() and device in ("", "cuda"):
        return True
    if not _pin_warned:
        import warnings
        warnings.warn("pin_memory=True but no CUDA device is available: batches are not "
                      "pinned", stacklevel=3)
        _pin_warned = True
    return False
