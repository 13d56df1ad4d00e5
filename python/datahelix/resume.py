"""Resume (docs/python.md, "Resume" and "Elastic resume"): the settings a state must match,
merging the ranks' states, and the step (and sample) at which a loader of another world size
or batch resumes a saved one. Pure functions of the states and the loader's settings;
``DataLoader.merge_states`` and ``DataLoader.load_state_dict`` call them."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._C import InvalidArgumentError

#: what an elastic resume may keep fixed: the global batch or the per-rank batch
KEEP = ("global_batch", "rank_batch")
#: the loader's settings a pass's order depends on (a state saves them, a resume checks them)
STATE_KEYS = ("seed", "shuffle", "batch_size", "world_size", "plan", "plan_window", "epochs",
              "max_steps", "drop_last")
#: of those, the ones an elastic resume (another world size) may change
ELASTIC_KEYS = ("batch_size", "world_size")


def check_order(state: Dict[str, Any], keep: Optional[str], settings: Dict[str, Any]) -> bool:
    """Whether a loader with these ``settings`` (STATE_KEYS) resumes ``state`` elastically
    (another world size). Raises InvalidArgumentError for an unknown ``keep`` and naming a
    setting that differs where the order would not be the same."""
    elastic = "world_size" in state and state["world_size"] != settings["world_size"]
    if keep is not None and keep not in KEEP:
        raise InvalidArgumentError(f"keep must be one of {list(KEEP)} or None, not {keep!r}")
    for key in STATE_KEYS:
        if elastic and key in ELASTIC_KEYS:
            continue
        if key in state and state[key] != settings[key]:
            raise InvalidArgumentError(
                f"state_dict: {key} was {state[key]!r}, this loader has {settings[key]!r}: "
                f"the order would differ")
    return elastic


def merge_states(states: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """``DataLoader.merge_states``: one state from several ranks' (they must agree on all
    but ``rank``)."""
    states = list(states)
    if not states:
        raise InvalidArgumentError("merge_states: no states")
    for st in states:
        if not isinstance(st, dict) or st.get("version") != 1:
            raise InvalidArgumentError("merge_states: not a DataLoader state_dict (version 1)")
    ranks: List[int] = []
    for st in states:
        rs = st["ranks"] if "ranks" in st else [st.get("rank", 0)]
        ranks += [int(r) for r in rs]
    if len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise InvalidArgumentError(f"merge_states: rank(s) {dup} given more than once")
    first = states[0]
    first_ranks = first["ranks"] if "ranks" in first else [first.get("rank", 0)]
    keys = sorted(set().union(*states) - {"rank", "ranks"})
    for st in states[1:]:
        st_ranks = st["ranks"] if "ranks" in st else [st.get("rank", 0)]
        for key in keys:
            if st.get(key) != first.get(key):
                raise InvalidArgumentError(
                    f"merge_states: ranks {first_ranks[0]} and {st_ranks[0]} disagree on "
                    f"{key}: {first.get(key)!r} and {st.get(key)!r} (resume from states "
                    f"of one checkpoint)")
    world = int(first.get("world_size", 1))
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        raise InvalidArgumentError(
            f"merge_states: rank(s) {sorted(bad)} not in [0, {world}) (world_size {world})")
    merged = {k: v for k, v in first.items() if k not in ("rank", "ranks")}
    merged["ranks"] = sorted(ranks)
    return merged


def resume_point(state: Dict[str, Any]) -> Tuple[int, int]:
    """The saved pass's own step and the sample its epoch was cut from (``first_sample``: 0
    but after an elastic resume from inside a step, docs/python.md). Its steps are counted
    from that sample: the own step is ``(position - first_sample) / (world_size x
    batch_size)``, which differs from the state's ``step`` (the loader's count, which goes on
    from the count it was resumed at) after an elastic resume that kept the per-rank batch. A
    state without ``first_sample`` (written before it existed) counts its own steps in
    ``step`` and was cut from ``position - step x world_size x batch_size``."""
    step = int(state.get("step", 0))
    if step < 0:
        raise InvalidArgumentError(f"state_dict: step {step} < 0")
    g = int(state.get("world_size", 1)) * int(state.get("batch_size", 1))
    position = int(state.get("position", step * g))
    if "first_sample" not in state:
        first = position - step * g
        if first < 0:
            raise InvalidArgumentError(
                f"state_dict: position {position} is before step {step}'s window (step x "
                f"world_size x batch_size = {step * g}): not a DataLoader state_dict")
        return step, first
    first = int(state["first_sample"])
    if first < 0 or position < first or (position - first) % g:
        raise InvalidArgumentError(
            f"state_dict: position {position} is not first_sample {first} plus whole steps "
            f"of world_size x batch_size = {g}: not a DataLoader state_dict")
    return (position - first) // g, first


def elastic_step(state: Dict[str, Any], keep: Optional[str], *, world_size: int,
                 batch_size: int, epochs: int, max_steps: int,
                 plan_window: int) -> Tuple[int, int, str]:
    """Where a loader (world size W2, batch B2) resumes a state saved at world size W1,
    batch B1, own step k of a pass cut from sample F (0 but after an elastic resume from
    inside a step): the same position P = F + k x W1 x B1 of the order, at W2 x B2 samples a
    step. Returns (step, first sample, keep): the own step of a pass cut from that sample (the
    client's first_step and first_sample), and what the resume keeps ("global_batch" or
    "rank_batch"). From a step boundary of the new global batch the pass is the epoch's own
    (first sample 0); else it is cut from P, its plan windows counted from there. (The
    loader's count, ``step``, goes on from the saved one either way: DataLoader.)"""
    step, first1 = resume_point(state)
    w1, b1 = int(state["world_size"]), int(state["batch_size"])
    w2, b2 = world_size, batch_size
    g1 = w1 * b1
    pos = first1 + step * g1
    if keep is None:  # what the new loader's batch_size keeps (both only when w1 == w2)
        keep = "rank_batch" if b2 == b1 else "global_batch" if w2 * b2 == g1 else None
        if keep is None:
            need = (f", or batch_size {g1 // w2} to keep the global batch {g1}"
                    if g1 % w2 == 0 else f" (the global batch {g1} does not split over "
                    f"world size {w2})")
            raise InvalidArgumentError(
                f"state_dict: saved at world size {w1} x batch_size {b1}, this loader has "
                f"world size {w2} x batch_size {b2}: use batch_size {b1} to keep the "
                f"per-rank batch{need}")
    elif keep not in KEEP:
        raise InvalidArgumentError(f"keep must be one of {list(KEEP)} or None, "
                                   f"not {keep!r}")
    pw = plan_window
    if pw > 1 and step % pw:
        raise InvalidArgumentError(
            f"state_dict: with plan_window {pw} an elastic resume (world size {w1} -> "
            f"{w2}) needs the saved step to end a plan window (step {step} at world size "
            f"{w1} is inside one): a window's plan moves samples between its steps "
            f"differently for each world size")
    if keep == "global_batch":
        if g1 % w2:
            raise InvalidArgumentError(
                f"keep='global_batch': the global batch {g1} (world size {w1} x "
                f"batch_size {b1}) does not split over world size {w2} ({g1} / {w2} is "
                f"not an integer); keep='rank_batch' or another world size")
        if b2 != g1 // w2:
            raise InvalidArgumentError(
                f"keep='global_batch': world size {w1} x batch_size {b1} needs batch_size "
                f"{g1 // w2} at world size {w2}, this loader has {b2}")
        return step, first1, keep  # the same steps, of the same cut
    if b2 != b1:
        raise InvalidArgumentError(
            f"keep='rank_batch': batch_size was {b1}, this loader has {b2}")
    if epochs != 1 or max_steps:
        raise InvalidArgumentError(
            "keep='rank_batch' across world sizes needs epochs=1 and max_steps=0 "
            "(steps per epoch change with the global batch)")
    g2 = w2 * b2
    if pos % g2 == 0 and (pos // g2) % pw == 0:
        return pos // g2, 0, keep  # a step boundary (and plan window) of the epoch's own
    return 0, pos, keep  # inside a step: the pass is cut from the position
