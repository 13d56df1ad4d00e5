"""Labels and metadata through every path (python/datahelix/_meta.py, docs/python.md "Labels
and metadata", docs/datasets.md): a CSV's label column (--meta-col), WebDataset tar shards'
.cls and .json members, a folder's .json sidecars, and a blend of sources, each through
`datahelix manifest`, `datahelix probe` and the DataLoader, reach `batch["label"]` as an int64
tensor matching each sample's id. Before: every label was dropped, only captions came
through. Also: the loader warns when probe dropped clips of the manifest.
"""
import json
import os
import shutil
import subprocess
import tarfile
import warnings

import pytest

from conftest import CLI

SPEC = {"frames": 4, "sampling": "uniform", "resize": "short-side+center-crop", "height": 32,
        "width": 32, "layout": "THWC", "dtype": "uint8"}


def run(*args, env=None):
    r = subprocess.run([CLI, *args], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stderr


def probe(folder, tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    env = dict(os.environ, DH_CALIBRATION_CACHE=str(tmp_path / "calib.json"))
    return run("probe", os.path.join(folder, "manifest.jsonl"), "-o",
               os.path.join(folder, "profiles.jsonl"), "-p", str(tmp_path / "spec.json"), env=env)


def batches(datahelix, source):
    with datahelix.DataLoader(source, pipeline=SPEC, batch_size=3, shuffle=False, workers=2,
                              arena_bytes=64 << 20, timeout=60) as dl:
        return list(dl)


def clips(dataset):
    src, ids = dataset
    with open(os.path.join(src, "manifest.jsonl")) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    return src, entries


def check_labels(bs, want, key="label"):
    """Every sample came once, with want[id] in batch[key] (an int64 tensor)."""
    import torch
    seen = {}
    for b in bs:
        assert isinstance(b[key], torch.Tensor) and b[key].dtype == torch.int64, b[key]
        assert b[key].shape == (len(b["sample_ids"]),)
        for sid, v in zip(b["sample_ids"], b[key].tolist()):
            seen[sid] = v
    assert seen == want


@pytest.fixture(scope="module")
def csv_set(dataset, tmp_path_factory):
    """The clips through a labels CSV: label (int), score (float), tag (text), maybe (one empty
    cell), frames (a reserved name). Returns (folder, {id: label})."""
    src, entries = clips(dataset)
    out = tmp_path_factory.mktemp("csvset")
    rows = ["path,caption,label,score,tag,maybe,frames"]
    labels, frames = {}, {}
    for k, e in enumerate(entries):
        labels[e["path"]] = k % 5
        frames[os.path.join(src, e["path"])] = k + 100
        rows.append(f"{os.path.join(src, e['path'])},cap {k},{k % 5},{k / 4},t{k},"
                    f"{'' if k == 0 else k},{k + 100}")
    (out / "labels.csv").write_text("\n".join(rows) + "\n")
    run("manifest", "--from-csv", str(out / "labels.csv"), "--path-col", "path",
        "--caption-col", "caption", "--id-col", "path", "--meta-col", "*", "-o",
        str(out / "manifest.jsonl"))
    probe(str(out), out)
    ids = {os.path.join(src, p): v for p, v in labels.items()}
    return str(out), ids, frames


def test_csv_labels_reach_the_batch(datahelix, csv_set):
    import torch
    folder, want, want_frames = csv_set
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bs = batches(datahelix, folder)
    check_labels(bs, want)
    for b in bs:
        assert b["score"].dtype == torch.float64  # floats as default_collate makes them
        assert all(isinstance(t, str) and t.startswith("t") for t in b["tag"])
        assert isinstance(b["maybe"], list)  # a missing value: a list, None there
        # a metadata key named like the loader's own is renamed, never overwrites it
        assert b["frames"].dtype == torch.uint8 and b["frames"].dim() == 5
        assert b["meta_frames"].tolist() == [want_frames[s] for s in b["sample_ids"]]
    firsts = [b["maybe"][i] for b in bs for i, s in enumerate(b["sample_ids"])]
    assert firsts.count(None) == 1
    assert all(isinstance(v, int) for v in firsts if v is not None)
    assert any("renamed" in str(w.message) and "'frames'" in str(w.message) for w in caught)


def test_tar_cls_and_json_members_reach_the_batch(datahelix, dataset, tmp_path):
    """Shards as WebDataset's TarWriter writes them: KEY.mp4, KEY.cls ("3"), KEY.json."""
    src, entries = clips(dataset)
    shards = tmp_path / "shards"
    shards.mkdir()
    want_cls, want_label = {}, {}
    for s in range(0, len(entries), 5):
        with tarfile.open(shards / f"shard-{s // 5:03d}.tar", "w") as t:
            for k, e in enumerate(entries[s:s + 5], s):
                key = f"sample{k:04d}"
                t.add(os.path.join(src, e["path"]), arcname=f"{key}.mp4")
                for ext, data in (("cls", str(k % 7).encode()),
                                  ("json", json.dumps({"caption": f"c{k}", "label": k % 3,
                                                       "origin": "tar"}).encode())):
                    p = tmp_path / "member"
                    p.write_bytes(data)
                    t.add(p, arcname=f"{key}.{ext}")
                sid = f"shard-{s // 5:03d}/{key}"
                want_cls[sid], want_label[sid] = k % 7, k % 3
    (tmp_path / "member").unlink()
    shard_list = [str(p) for p in sorted(shards.glob("*.tar"))]
    args = []
    for p in shard_list:
        args += ["--from-tar", p]
    run("manifest", *args, "-o", str(shards / "manifest.jsonl"))
    probe(str(shards), tmp_path)
    bs = batches(datahelix, str(shards))
    check_labels(bs, want_cls, "cls")
    check_labels(bs, want_label, "label")
    assert all(o == "tar" for b in bs for o in b["origin"])
    assert [c for b in bs for c in b["captions"]] == [f"c{k}" for k in range(len(entries))]


@pytest.fixture(scope="module")
def dir_set(dataset, tmp_path_factory):
    """The clips copied into a folder with .json sidecars {"caption", "label"}."""
    src, entries = clips(dataset)
    out = tmp_path_factory.mktemp("dirset")
    want = {}
    for k, e in enumerate(entries):
        name = f"c{k:03d}"
        shutil.copy(os.path.join(src, e["path"]), out / f"{name}.mp4")
        (out / f"{name}.json").write_text(json.dumps({"caption": "x", "label": 10 + k}))
        want[f"{name}.mp4"] = 10 + k
    run("manifest", "--from-dir", str(out), "-o", str(out / "manifest.jsonl"))
    probe(str(out), out)
    return str(out), want


def test_dir_sidecar_labels_reach_the_batch(datahelix, dir_set):
    folder, want = dir_set
    check_labels(batches(datahelix, folder), want)


def test_blend_carries_each_sources_labels(datahelix, csv_set, dir_set, tmp_path):
    """blend() writes each source row's meta into the blended manifest: NAME/ID keeps ID's
    label."""
    csv_folder, csv_want, _ = csv_set
    dir_folder, dir_want = dir_set
    out = datahelix.blend([(csv_folder, 1.0), (dir_folder, 1.0)], str(tmp_path / "blend"), seed=3)
    with open(os.path.join(out, "manifest.jsonl")) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    assert lines and all("meta" in x for x in lines)
    csv_name = os.path.basename(csv_folder)
    dir_name = os.path.basename(dir_folder)
    want = {}
    for x in lines:
        name, _, sid = x["id"].partition("/")
        want[x["id"]] = csv_want[sid] if name == csv_name else dir_want[sid]
        assert name in (csv_name, dir_name)
    assert {x["id"].partition("/")[0] for x in lines} == {csv_name, dir_name}
    bs = batches(datahelix, out)
    # the blend's label: ints in both sources, so a tensor
    check_labels(bs, want)


def test_loader_warns_when_probe_dropped_clips(datahelix, csv_set, tmp_path):
    """A profile set smaller than its manifest: one warning naming both counts and probe."""
    folder = csv_set[0]
    copy = tmp_path / "dropped"
    shutil.copytree(folder, copy)
    with open(copy / "manifest.jsonl", "a") as f:
        f.write(json.dumps({"id": "gone", "path": "/nonexistent/gone.mp4"}) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dl = datahelix.DataLoader(str(copy), pipeline=SPEC, batch_size=3, workers=1,
                                  arena_bytes=64 << 20)
        dl.close()
        dl = datahelix.DataLoader(str(copy), pipeline=SPEC, batch_size=3, workers=1,
                                  arena_bytes=64 << 20)
        dl.close()
    msgs = [str(w.message) for w in caught if "datahelix probe" in str(w.message)]
    n = sum(1 for _ in open(copy / "profiles.jsonl"))
    assert len(msgs) == 1, msgs
    assert f"has {n} rows" in msgs[0] and f"has {n + 1}" in msgs[0]


def test_meta_kinds_are_fixed_per_manifest(tmp_path):
    """Unit rules of _meta: bools, ints, floats, a key missing somewhere, nested values."""
    import torch
    from datahelix._meta import join_meta, load_manifest_meta
    m = tmp_path / "manifest.jsonl"
    m.write_text("".join(json.dumps(x) + "\n" for x in [
        {"id": "a", "path": "a", "meta": {"b": True, "i": 1, "f": 1, "s": "x", "l": [1], "o": 1}},
        {"id": "b", "path": "b", "meta": {"b": False, "i": 2, "f": 2.5, "s": "y", "l": [2]}},
    ]))
    captions, meta = load_manifest_meta(str(m))
    assert captions == {"a": "", "b": ""}
    assert meta.kinds == {"b": "bool", "i": "int64", "f": "float64", "s": "list", "l": "list",
                          "o": "list"}
    out = {"frames": "kept"}
    join_meta(out, ["b", "a", "zzz"], meta)
    assert out["frames"] == "kept"
    # an id without a row: a list with None, even for a numeric key
    assert out["i"] == [2, 1, None] and out["o"] == [None, 1, None]
    out = {}
    join_meta(out, ["b", "a"], meta)
    assert out["b"].dtype == torch.bool and out["b"].tolist() == [False, True]
    assert out["i"].dtype == torch.int64 and out["f"].dtype == torch.float64
    assert out["f"].tolist() == [2.5, 1.0] and out["l"] == [[2], [1]]
