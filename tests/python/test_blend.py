"""datahelix.blend and DataLoader([(source, weight), ...]): several data sets blended by
weight, deterministic per seed, each sample keeping its source's plan (docs/datasets.md,
"Blending sources")."""
import json
import os
import subprocess

import pytest

from conftest import CLI, make_dataset


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory):
    """Two data sets of the same ids (v0000000...), probed with different plans: 'small'
    at 4 frames of 32x32, 'large' at 8 frames of 48x48."""
    root = tmp_path_factory.mktemp("blend")
    out = []
    for name, frames, side, count in (("small", 4, 32, 8), ("large", 8, 48, 6)):
        src, ids = make_dataset(root / name, count, seed=len(name))
        # the plan comes from each source's probe spec: drop synth's per-clip plans
        with open(f"{src}/manifest.jsonl") as f:
            lines = [{k: v for k, v in json.loads(x).items()
                      if k not in ("frames", "height", "width")} for x in f if x.strip()]
        with open(f"{src}/manifest.jsonl", "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in lines)
        spec = root / f"{name}.json"
        spec.write_text(json.dumps({"frames": frames, "height": side, "width": side}))
        env = dict(os.environ, DH_CALIBRATION_CACHE=str(root / "calib.json"))
        subprocess.run([CLI, "probe", f"{src}/manifest.jsonl", "-o", f"{src}/profiles.jsonl",
                        "-p", str(spec)], check=True, capture_output=True, env=env)
        out.append((src, ids))
    return out


def rows(path):
    with open(os.path.join(path, "profiles.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_blend_draws_each_share_by_weight_and_seed(datahelix, two_sets, tmp_path):
    (small, small_ids), (large, large_ids) = two_sets
    a = rows(datahelix.blend([(small, 3), (large, 1)], tmp_path / "a", seed=1, samples=8))
    ids = [r["id"] for r in a]
    assert len(ids) == len(set(ids)) == 8
    assert sum(i.startswith("small/") for i in ids) == 6  # 3/4 of 8
    assert sum(i.startswith("large/") for i in ids) == 2
    assert {i.split("/", 1)[1] for i in ids if i.startswith("small/")} <= set(small_ids)
    # each row keeps its source's plan
    assert all((r["frames"], r["height"]) == ((4, 32) if r["id"].startswith("small/")
                                              else (8, 48)) for r in a)
    again = rows(datahelix.blend([(small, 3), (large, 1)], tmp_path / "b", seed=1, samples=8))
    assert again == a  # deterministic per seed
    other = rows(datahelix.blend([(small, 3), (large, 1)], tmp_path / "c", seed=2, samples=8))
    assert [r["id"] for r in other] != ids
    # default size: the most that no source repeats for (small: 8 / 0.75 -> 10; large:
    # 6 / 0.25 -> 24), so 10 rows: 8 small (all of them) and 2 large (largest remainder)
    d = rows(datahelix.blend([(small, 3), (large, 1)], tmp_path / "d"))
    assert len(d) == 10 and sum(r["id"].startswith("small/") for r in d) == 8
    # more than a source has: whole copies, their ids marked
    e = rows(datahelix.blend([(large, 1)], tmp_path / "e", samples=9))
    assert len({r["id"] for r in e}) == 9 and sum("#1" in r["id"] for r in e) == 3
    with open(tmp_path / "a" / "manifest.jsonl") as f:
        captions = [json.loads(line) for line in f]
    assert [c["id"] for c in captions] == ids and all(c["caption"] for c in captions)
    for bad, match in (([], "no sources"), ([(small, 0)], "weight 0.0 must be > 0"),
                       ([(small,)], "must be \\(source, weight\\)")):
        with pytest.raises(datahelix.InvalidArgumentError, match=match):
            datahelix.blend(bad, tmp_path / "x")


def test_loader_over_a_blend_yields_it_once_with_each_sources_plan(datahelix, two_sets):
    (small, _), (large, _) = two_sets
    seen = []
    with datahelix.DataLoader([(small, 1), (large, 1)], batch_size=2, seed=4, workers=2,
                              arena_bytes=64 << 20, timeout=60) as dl:
        blend_dir = dl._blend_dir
        for b in dl:
            for i, sid in enumerate(b["sample_ids"]):
                t = int(b["mask"][i].sum())
                assert t == (4 if sid.startswith("small/") else 8), (sid, t)
                seen.append(sid)
            assert b["captions"] and all(b["captions"])
    assert len(seen) == len(set(seen)) == 12  # min(8 / 0.5, 6 / 0.5) = 12: 6 of each
    assert sum(s.startswith("small/") for s in seen) == 6
    assert not os.path.exists(blend_dir)  # close() removed the loader's blend
