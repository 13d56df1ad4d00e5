"""Labels and metadata of a video data set, joined into each batch by sample id.

``datahelix manifest`` writes a sample's labels and other metadata as the ``"meta"`` object
of its manifest line (a CSV's ``--meta-col`` columns, a tar sample's ``.cls``/``.json``
members, a folder's ``.json`` sidecar: docs/datasets.md). They do not travel through the
coordinator: the client reads the manifest once, as it does for captions, and joins them by
sample id (docs/python.md, "Labels and metadata").

The rules, fixed per manifest so a key keeps its type in every batch:

- a key whose value is a number (bool, int or float) in every line of the manifest becomes
  a tensor: ``torch.bool`` when all are bools, ``torch.float64`` when any is a float (as
  ``torch.utils.data.default_collate`` makes Python floats), else ``torch.int64``;
- any other key is a list, ``None`` where a sample has no value;
- a key named like one of the loader's own batch keys (:data:`RESERVED`) is renamed
  ``meta_KEY`` (and warned about once), so metadata never overwrites ``frames``,
  ``sample_ids``...
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Dict, List, Optional, Tuple

from ._C import ParseError
from ._collate import LOADER_KEYS, META_KEY, scalar_dtype

# The loader's own keys of a video batch (and of a Python dataset's: ``indices``).
# the video pipeline's arrays and the loader's own names (one list: _collate.py)
RESERVED = frozenset(("frames", "mask", META_KEY) + LOADER_KEYS)

_warned: set = set()


class ManifestMeta:
    """The ``meta`` of every manifest line, by id, with each key's batch kind."""

    def __init__(self, by_id: Dict[str, Dict[str, Any]], kinds: Dict[str, str],
                 renamed: Dict[str, str]):
        self.by_id = by_id      # id -> {batch key: value}
        self.kinds = kinds      # batch key -> "bool" | "int64" | "float64" | "list"
        self.renamed = renamed  # manifest key -> batch key, for reserved names

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def raw(self, sample_id: str) -> Optional[Dict[str, Any]]:
        """The manifest's own ``meta`` of a sample (keys as written), or None: what
        :func:`datahelix.blend` carries into a blended manifest."""
        row = self.by_id.get(sample_id)
        if not row:
            return None
        back = {v: k for k, v in self.renamed.items()}
        return {back.get(k, k): v for k, v in row.items()}


def _kind(value: Any) -> str:
    """A value's column kind: its scalar dtype (as the default collate's), else "list"."""
    return scalar_dtype(value) or "list"


def _merge_kind(a: Optional[str], b: str) -> str:
    if a is None or a == b:
        return b
    if "list" in (a, b):
        return "list"
    if "float64" in (a, b):
        return "float64"
    return "int64"  # bool and int: ints (True -> 1), as torch.tensor([True, 2]) does


def load_manifest_meta(manifest: Optional[str]) -> Tuple[Dict[str, str], ManifestMeta]:
    """Reads a manifest once: ``(captions by id, ManifestMeta)``. No manifest: both empty.
    Raises ParseError naming the file and line for a line that is not JSON."""
    captions: Dict[str, str] = {}
    by_id: Dict[str, Dict[str, Any]] = {}
    kinds: Dict[str, str] = {}
    renamed: Dict[str, str] = {}
    rows = 0
    if manifest:
        with open(manifest, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ParseError(f"{manifest}:{lineno}: {e.msg}") from None
                if not isinstance(entry, dict) or "id" not in entry:
                    continue
                rows += 1
                sid = str(entry["id"])
                captions[sid] = str(entry.get("caption", ""))
                meta = entry.get("meta")
                if not isinstance(meta, dict) or not meta:
                    continue
                row = {}
                for key, value in meta.items():
                    if value is None:
                        continue
                    if key in RESERVED:
                        renamed[key] = "meta_" + key
                        key = renamed[key]
                    row[key] = value
                    kinds[key] = _merge_kind(kinds.get(key), _kind(value))
                by_id[sid] = row
    # a key some line lacks has a missing value: a list, with None there
    for key in kinds:
        if kinds[key] != "list" and sum(1 for r in by_id.values() if key in r) < rows:
            kinds[key] = "list"
    if renamed and manifest not in _warned:
        _warned.add(manifest)
        names = ", ".join(f"{k!r} as {v!r}" for k, v in sorted(renamed.items()))
        warnings.warn(f"{manifest}: metadata keys named like the loader's own batch keys are "
                      f"renamed: {names}", stacklevel=3)
    return captions, ManifestMeta(by_id, kinds, renamed)


def join_meta(out: Dict[str, Any], ids: List[str], meta: ManifestMeta) -> None:
    """Adds each metadata key of ``meta`` to the batch ``out`` for the samples ``ids``: a
    tensor for a numeric key, else a list (None where a sample has no value). Never replaces
    a key already in ``out``."""
    if not meta:
        return
    import torch
    rows = [meta.by_id.get(i, {}) for i in ids]
    for key, kind in meta.kinds.items():
        if key in out:
            continue
        values = [r.get(key) for r in rows]
        if kind == "list" or any(v is None for v in values):
            out[key] = values
        else:
            out[key] = torch.tensor(values, dtype=getattr(torch, kind))


def warn_if_profiles_dropped(profiles: str, manifest: Optional[str], manifest_rows: int) -> None:
    """Warns once per profile set when it has fewer rows than its manifest: clips that
    ``datahelix probe`` skipped are not in any batch."""
    if not manifest or manifest_rows == 0 or (profiles, manifest) in _warned:
        return
    try:
        with open(profiles, encoding="utf-8") as f:
            rows = sum(1 for line in f if line.strip())
    except OSError:
        return
    if rows < manifest_rows:
        _warned.add((profiles, manifest))
        warnings.warn(
            f"{profiles} has {rows} rows but its manifest {manifest} has {manifest_rows}: "
            f"{manifest_rows - rows} clips are not in any batch (skipped by `datahelix probe`, "
            f"whose summary names them; `datahelix probe --strict` fails instead)",
            stacklevel=3)


__all__ = ["RESERVED", "ManifestMeta", "load_manifest_meta", "join_meta",
           "warn_if_profiles_dropped"]
