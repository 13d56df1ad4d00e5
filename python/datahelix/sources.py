"""Data sets on disk, before any server runs: finding a source's profile set and manifest,
the tier-1 plan worked out offline, blending and token counting, pipeline specs, and a
Python dataset's profile set, learned costs and pickle for the worker processes."""

from __future__ import annotations

import atexit
import json
import os
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _C
from ._C import InvalidArgumentError, NotFoundError, ParseError
from ._meta import load_manifest_meta


_TOKEN_PLANS = {"count": 0, "balanced": 1, "packing": 2}


# A Python dataset's profile rows when nothing better is known (no estimate_cost, not in the
# learned costs): the mean of what is known, else these.
_DATASET_DEFAULT_COST = {"cpu_s": 0.01, "tokens": 1, "out_bytes": 0}


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

    def rows() -> Iterator[Dict[str, Any]]:
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
            yield {"id": str(i), "uri": f"index:{i}", "profile_key": "python", "frames": 1,
                   "height": 1, "width": 1, "tokens_est": max(0, int(round(cost["tokens"]))),
                   "cpu_s_est": max(0.0, float(cost["cpu_s"])), "in_bytes": 0,
                   "out_bytes": max(0, int(cost["out_bytes"]))}

    # the C writer (dh_profile_row_write): profiles.jsonl has one writer
    _C.write_profiles(os.path.join(directory, "profiles.jsonl"), rows())
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


_URL_SCHEMES = ("http://", "https://", "s3://")


def is_url(path: str) -> bool:
    """Whether ``path`` is an http://, https:// or s3:// URL (read by the C remote reader)."""
    return path[:8].lower().startswith(_URL_SCHEMES)


def _resolve_url(url: str) -> Dict[str, Optional[str]]:
    """A data set at a URL: ``.../manifest.jsonl`` (its ``profiles.jsonl`` next to it) or a
    profile file (its ``manifest.jsonl`` next to it, optional). Both are read whole through
    the C remote reader (its S3 settings: the AWS environment and files) into a local folder
    that lives as long as the process; the clips stay where they are, read by range requests
    from the profile rows' URLs."""
    import tempfile
    base, _, name = url.split("?", 1)[0].rpartition("/")
    if name == "manifest.jsonl" or name.endswith(".manifest.jsonl"):
        manifest_url, profiles_url = url, base + "/profiles.jsonl"
    else:
        manifest_url, profiles_url = base + "/manifest.jsonl", url
    manifest_data: Optional[bytes] = None
    if manifest_url == url:  # the manifest named: its own error first (a 404 names it)
        manifest_data = _C.remote_read(manifest_url)
    try:
        profiles_data = _C.remote_read(profiles_url)
    except NotFoundError:
        raise NotFoundError(
            f"{profiles_url}: no profile set; make it with `datahelix probe {manifest_url} "
            f"-o profiles.jsonl` and put it next to the manifest") from None
    if manifest_data is None:
        try:
            manifest_data = _C.remote_read(manifest_url)
        except NotFoundError:
            pass  # a profile file alone: no captions
    local = tempfile.mkdtemp(prefix="datahelix-remote-")
    _remote_dirs.append(local)
    profiles = os.path.join(local, "profiles.jsonl")
    with open(profiles, "wb") as f:
        f.write(profiles_data)
    manifest = None
    if manifest_data is not None:
        manifest = os.path.join(local, "manifest.jsonl")
        with open(manifest, "wb") as f:
            f.write(manifest_data)
    return {"profiles": profiles, "manifest": manifest}


_remote_dirs: List[str] = []


@atexit.register
def _remove_remote_dirs() -> None:
    import shutil
    for d in _remote_dirs:
        shutil.rmtree(d, ignore_errors=True)


def resolve_source(source: Union[str, os.PathLike]) -> Dict[str, Optional[str]]:
    """Finds the profile set and the manifest of a data set.

    ``source`` is a synth/probe directory (``DIR/profiles.jsonl``, and ``DIR/manifest.jsonl``
    for captions), a manifest (its ``profiles.jsonl`` next to it) or a profile file. Returns
    ``{"profiles": path, "manifest": path or None}``; raises :class:`NotFoundError` naming
    the missing file and how to make it.
    """
    path = os.fspath(source)
    if is_url(path):
        return _resolve_url(path)
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


def _with_sample_timeout(pipeline_json: Optional[str],
                         sample_timeout: Optional[float]) -> Optional[str]:
    """A video (or synthetic) pipeline spec with the loader's ``sample_timeout`` (the
    DataServer's deadline on one sample's read and decode, docs/runtime.md "Deadlines"),
    unless the spec sets its own or the argument is the default (the C side's 300 s)."""
    if sample_timeout is not None and not 0 <= sample_timeout <= 1e7:
        raise InvalidArgumentError(f"sample_timeout must be seconds in [0, 1e7] or None, not "
                                   f"{sample_timeout!r}")
    if sample_timeout == 300.0:
        return pipeline_json
    try:
        spec = json.loads(pipeline_json) if pipeline_json else {}
    except ValueError:
        return pipeline_json  # the C side reports a bad spec, naming it
    if not isinstance(spec, dict) or "sample_timeout" in spec or spec.get("type") == "synthetic":
        return pipeline_json
    spec["sample_timeout"] = float(sample_timeout or 0)
    return json.dumps(spec)


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
    profiles: List[Dict[str, Any]] = []
    manifest: List[str] = []
    for (name, _, rows, (captions, meta)), count in zip(loaded, counts):
        picks = [(i, copy) for copy in range(count // len(rows)) for i in range(len(rows))]
        picks += [(i, count // len(rows)) for i in sorted(rng.sample(range(len(rows)),
                                                                     count % len(rows)))]
        for i, copy in picks:
            row = dict(rows[i])
            source_id = str(row["id"])
            row["id"] = f"{name}/{source_id}" + (f"#{copy}" if copy else "")
            profiles.append(row)
            line = {"id": row["id"], "path": row["uri"], "caption": captions.get(source_id, "")}
            if meta.raw(source_id):
                line["meta"] = meta.raw(source_id)
            manifest.append(json.dumps(line, ensure_ascii=False) + "\n")
    partial = os.path.join(out, "profiles.jsonl.part")
    _C.write_profiles(partial, profiles)  # the C writer: profiles.jsonl has one writer
    os.replace(partial, os.path.join(out, "profiles.jsonl"))
    partial = os.path.join(out, "manifest.jsonl.part")
    with open(partial, "w", encoding="utf-8") as f:
        f.writelines(manifest)
    os.replace(partial, os.path.join(out, "manifest.jsonl"))
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
