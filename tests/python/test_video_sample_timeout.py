"""sample_timeout on the native video pipeline (docs/runtime.md, "Deadlines"), through
DataLoader: a clip replaced by a FIFO nobody writes blocks its DataServer worker thread in
open(2); past sample_timeout the sample fails naming itself, its path and the time, its batch
mate and every other clip arrive, and the stuck thread, released by opening the FIFO for
writing, exits."""
import json
import os
import time

from conftest import make_dataset


def test_a_stalled_clip_fails_past_sample_timeout_and_the_rest_arrives(datahelix, tmp_path):
    src, ids = make_dataset(tmp_path / "set", 6, seed=4)
    with open(os.path.join(src, "manifest.jsonl")) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    stuck = ids[2]
    fifo = os.path.join(src, entries[2]["path"])
    os.remove(fifo)
    os.mkfifo(fifo)
    seen, failed = [], []
    t0 = time.monotonic()
    with datahelix.DataLoader(src, batch_size=2, workers=2, on_error="skip", timeout=60,
                              sample_timeout=1.5, arena_bytes=128 << 20) as dl:
        for b in dl:
            for i, (sid, err) in enumerate(zip(b["sample_ids"], b["errors"])):
                seen.append(sid)
                if err is not None:
                    failed.append(sid)
                    assert f"sample '{stuck}' ({fifo}): open or read ran past sample_timeout " \
                           f"1.5 s (no answer after 1." in err, err
                    assert int(b["tokens"][i]) == 0
                else:
                    assert int(b["tokens"][i]) > 0
        assert dl.stats()["samples_failed"] == 1
        # the stuck thread is still blocked in open(): release it (it exits, abandoned)
        fd = os.open(fifo, os.O_WRONLY)
        os.close(fd)
    assert time.monotonic() - t0 < 40
    assert failed == [stuck] and sorted(seen) == sorted(ids)
