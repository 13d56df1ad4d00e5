"""A data set stored as WebDataset tar shards, read in place (docs/datasets.md).

The clips of a synth set are packed into two tar shards with their captions (KEY.mp4 +
KEY.txt, WebDataset's layout); a manifest addresses each clip as its tar member's byte range
("offset", "size"); probe and the DataLoader then read the members inside the tars, never
extracted: the shards' folder holds nothing else afterwards, every sample comes once, and
its frames equal those decoded from the loose clip files.
"""
import json
import os
import subprocess
import tarfile

import numpy as np

from conftest import CLI

SPEC = {"frames": 4, "sampling": "uniform", "resize": "short-side+center-crop", "height": 64,
        "width": 64, "layout": "THWC", "dtype": "uint8"}


def pack_shards(src, out, per_shard):
    """WebDataset-style shards of the set's clips: KEY.mp4 and KEY.txt per sample. Returns
    the manifest lines for the members, from tarfile's own offsets."""
    with open(os.path.join(src, "manifest.jsonl")) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    lines = []
    for s in range(0, len(entries), per_shard):
        name = f"shard-{s // per_shard:03d}.tar"
        path = os.path.join(out, name)
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
            for e in entries[s:s + per_shard]:
                t.add(os.path.join(src, e["path"]), arcname=f"{e['id']}.mp4")
                caption = os.path.join(out, "caption.tmp")
                with open(caption, "w") as c:
                    c.write(e.get("caption", ""))
                t.add(caption, arcname=f"{e['id']}.txt")
                os.remove(caption)
        by_id = {e["id"]: e for e in entries}
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.name.endswith(".mp4"):
                    e = by_id[m.name[:-4]]
                    line = {"id": e["id"], "path": name, "offset": m.offset_data, "size": m.size,
                            "caption": e.get("caption", "")}
                    # the clip's own plan (frames, size), as the loose set's manifest has it
                    line.update({k: e[k] for k in ("frames", "height", "width") if k in e})
                    lines.append(line)
    return lines


def frames_by_id(datahelix, source, spec):
    out = {}
    with datahelix.DataLoader(source, pipeline=spec, batch_size=2, shuffle=False, workers=2,
                              arena_bytes=64 << 20, timeout=60) as dl:
        for b in dl:
            for i, sid in enumerate(b["sample_ids"]):
                assert sid not in out, f"{sid} came twice"
                out[sid] = b["frames"][i].numpy().copy()
    return out


def test_tar_shards_are_read_in_place(datahelix, dataset, tmp_path):
    src, ids = dataset
    shards = tmp_path / "shards"
    shards.mkdir()
    lines = pack_shards(src, str(shards), per_shard=5)  # 12 clips: shards of 5, 5 and 2
    (shards / "manifest.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    env = dict(os.environ, DH_CALIBRATION_CACHE=str(tmp_path / "calib.json"))
    for where in (str(shards), src):
        r = subprocess.run([CLI, "probe", os.path.join(where, "manifest.jsonl"), "-o",
                            str(tmp_path / f"profiles-{len(where)}.jsonl"), "-p",
                            str(tmp_path / "spec.json")], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        assert "0 files skipped" in r.stderr, r.stderr
    os.replace(tmp_path / f"profiles-{len(str(shards))}.jsonl", shards / "profiles.jsonl")
    rows = [json.loads(x) for x in (shards / "profiles.jsonl").read_text().splitlines()]
    assert len(rows) == len(ids)
    assert all(row["uri"].startswith("subfile,,start,") for row in rows), rows[0]
    # in_bytes (what decoding the plan reads) is counted within the member, not the shard
    sizes = {x["id"]: x["size"] for x in lines}
    assert all(0 < row["in_bytes"] <= sizes[row["id"]] for row in rows), \
        [(row["in_bytes"], sizes[row["id"]]) for row in rows]

    loose_dir = tmp_path / "loose"
    loose_dir.mkdir()
    os.replace(tmp_path / f"profiles-{len(src)}.jsonl", loose_dir / "profiles.jsonl")
    got = frames_by_id(datahelix, str(shards), SPEC)
    # the loose clips, through the same spec (their profiles name the files in `src`)
    want = frames_by_id(datahelix, str(loose_dir), SPEC)
    assert sorted(got) == sorted(ids) == sorted(want)
    for sid in ids:
        assert np.array_equal(got[sid], want[sid]), sid
    # nothing was extracted next to the shards
    assert sorted(os.listdir(shards)) == sorted(
        ["manifest.jsonl", "profiles.jsonl"] + [f"shard-{k:03d}.tar" for k in range(3)])


def test_corrupt_tar_member_error_names_sample_member_and_shard(datahelix, dataset, tmp_path):
    """A tar member corrupted after probing: the sample's error names the sample id, the
    member and the shard (src/media/tar_member.c). Before: 'subfile,,start,76800,end,
    137107,,:/.../shard-000.tar: decoding near frame 4', no id and no member."""
    src, ids = dataset
    shards = tmp_path / "shards"
    shards.mkdir()
    lines = pack_shards(src, str(shards), per_shard=len(ids))
    (shards / "manifest.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    env = dict(os.environ, DH_CALIBRATION_CACHE=str(tmp_path / "calib.json"))
    r = subprocess.run([CLI, "probe", str(shards / "manifest.jsonl"), "-o",
                        str(shards / "profiles.jsonl"), "-p", str(tmp_path / "spec.json")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    bad = lines[2]
    with open(shards / bad["path"], "r+b") as f:  # zero the member's last two thirds
        f.seek(bad["offset"] + bad["size"] // 3)
        f.write(b"\0" * (bad["size"] - bad["size"] // 3))
    shard = os.path.realpath(shards / bad["path"])
    errors = {}
    with datahelix.DataLoader(str(shards), pipeline=SPEC, batch_size=2, shuffle=False, workers=1,
                              on_error="skip", arena_bytes=64 << 20, timeout=60) as dl:
        for b in dl:
            for sid, err in zip(b["sample_ids"], b["errors"]):
                if err is not None:
                    errors[sid] = err
    assert list(errors) == [bad["id"]], errors
    err = errors[bad["id"]]
    assert err.startswith(f"sample {bad['id']} (member {bad['id']}.mp4 of shard {shard}): "), err
    assert "subfile," not in err
    # probe's skip message of that member says the same
    r = subprocess.run([CLI, "probe", str(shards / "manifest.jsonl"), "-o",
                        str(tmp_path / "again.jsonl"), "-p", str(tmp_path / "spec.json")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert (f"probe: skipped {bad['id']} (unreadable): sample {bad['id']} (member "
            f"{bad['id']}.mp4 of shard {shard}): ") in r.stderr, r.stderr
