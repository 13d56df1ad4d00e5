"""torch.distributed.checkpoint (docs/python.md, "Training stacks"): the DataLoader is a DCP
Stateful; saved under one key by every rank of a 2-rank job (torchrun, gloo, CPU) with a DDP
model and its optimizer, checkpointed after step 3 and SIGKILLed after step 5, it resumes on 1
rank (keeping the per-rank batch) and, separately, on 3 ranks (keeping the global batch),
elastic_keep choosing since DCP's load passes no keep: each sample of the epoch once across
the first run's checkpointed batches and the resumed run's (stack_job.py).

What DCP hands a loader: it flattens each rank's state into one value per key
("loader.step", "loader.rank", ...) and writes each key once, from one of the ranks (its
dedup spreads the keys over the ranks), so every loader of the new job, whatever its rank and
world size, gets the same dict, a per-key mix of the old ranks' states. They agree on every
key but `rank`, which load_state_dict does not use, so the mix is any rank's state."""
import json
import os

import pytest

import stack_job
from stack_job import SEED, SYNTH

N, W1, B1, SAVE_AT, HANG_AT = 54, 2, 3, 3, 5
SCRIPT = "stack_dcp_rank.py"


@pytest.mark.parametrize("world2,keep,batch2", [(1, "rank_batch", 3), (3, "global_batch", 2)])
def test_killed_job_resumes_on_another_world_size(tmp_path, world2, keep, batch2):
    ids = stack_job.make_profiles(tmp_path / "profiles.jsonl", N)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()

    def args(run, batch, *more):
        return [tmp_path / "profiles.jsonl", out, run, ckpt, batch, keep, SAVE_AT, HANG_AT,
                *more]
    # DCP writes CKPT/.metadata (atomically) once every rank's data is written
    first = stack_job.first_run(SCRIPT, lambda: os.path.exists(ckpt / ".metadata"), str(out),
                                args("first", B1), SAVE_AT, HANG_AT, tmp_path / "first.log")
    stack_job.run_to_end(SCRIPT, world2, args("resumed", batch2, "--resume"),
                         tmp_path / "resumed.log")
    resumed = stack_job.records(str(out), "resumed", world2)
    start = stack_job.check_exactly_once(ids, first, resumed, SAVE_AT, HANG_AT, batch2,
                                         world2)
    # position 3 x (2 x 3) = 18 of the order: step 6 of 3-sample steps, 3 of 6-sample ones
    assert start == SAVE_AT * W1 * B1 // (world2 * batch2)
    assert start + len(resumed[0]) == N // (world2 * batch2)
    saved = [json.loads((out / f"saved.rank{r}.json").read_text()) for r in range(W1)]
    handed = [json.loads((out / f"handed.rank{r}.json").read_text()) for r in range(world2)]
    assert all(len(h) == 1 for h in handed), "load_state_dict called once per rank"
    assert all(h == handed[0] for h in handed), "every new rank got the same state"
    got = handed[0][0]
    # which rank wrote each of the loader's keys: DCP's dedup spread them over both
    from torch.distributed.checkpoint import FileSystemReader
    files = {i.fqn: d.relative_path
             for i, d in FileSystemReader(str(ckpt)).read_metadata().storage_data.items()
             if i.fqn.startswith("loader.")}
    assert set(files) == {f"loader.{k}" for k in saved[0]}
    assert len(set(files.values())) == W1, files
    assert got["rank"] in range(W1)
    for st in saved:  # the old ranks' states differ by rank alone; DCP's is any of them
        assert {k: v for k, v in st.items() if k != "rank"} == \
            {k: v for k, v in got.items() if k != "rank"}


def test_elastic_keep_chooses_where_the_caller_passes_no_keep(datahelix, tmp_path):
    """elastic_keep is the keep of load_state_dict(state) without one (DCP's call, and
    accelerator.load_state's); an explicit keep still wins; a bad value is refused. And
    len() before load_state_dict (Accelerate scripts size their schedule first) does not
    count as a pass: the resumed pass is the one a loader without len() yields."""
    profiles = str(tmp_path / "profiles.jsonl")
    stack_job.make_profiles(profiles, N)
    from torch.distributed.checkpoint.stateful import Stateful
    with datahelix.start_cluster(profiles, workers=1, pipeline=SYNTH,
                                 arena_bytes=64 << 20) as cluster:
        def new(world, batch, rank=0, **kw):
            return datahelix.DataLoader(profiles, pipeline=SYNTH, batch_size=batch, seed=SEED,
                                        coordinator=cluster.endpoint, rank=rank,
                                        world_size=world, timeout=60, **kw)
        old = new(W1, B1, rank=1)
        assert isinstance(old, Stateful)
        st = dict(old.state_dict(), step=SAVE_AT, position=SAVE_AT * W1 * B1)
        old.close()
        with pytest.raises(datahelix.InvalidArgumentError, match="elastic_keep must be one"):
            new(1, 3, elastic_keep="both")
        dl = new(1, 3, elastic_keep="global_batch")
        with pytest.raises(datahelix.InvalidArgumentError, match="needs batch_size 6"):
            dl.load_state_dict(st)  # without elastic_keep, batch 3 keeps the per-rank batch
        dl.load_state_dict(st, keep="rank_batch")
        assert dl.state_dict()["keep"] == "rank_batch" and dl.state_dict()["step"] == 6
        dl.close()
        ref = new(1, 6)
        ref.load_state_dict(st)
        want = [b["sample_ids"] for b in ref]
        ref.close()
        dl = new(1, 6, elastic_keep="global_batch")
        assert len(dl) == N // 6
        dl.load_state_dict(st)
        assert len(dl) == N // 6 and dl.state_dict()["keep"] == "global_batch"
        it = iter(dl)
        got = [next(it)["sample_ids"]]
        with pytest.raises(datahelix.InvalidArgumentError, match="during a pass"):
            dl.load_state_dict(st)
        got += [b["sample_ids"] for b in it]
        assert got == want and len(got) == N // 6 - SAVE_AT
        dl.close()
