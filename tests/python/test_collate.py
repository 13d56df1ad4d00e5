"""Collation of a Python dataset's samples (docs/datasets.md, "The default collate"; python/
datahelix/_collate.py): an odd-typed sample fails alone wherever it sits, a collate_fn failure
names the whole batch, on_error="skip" keeps every key, and the loader's metadata never takes a
dataset key's place (docs/python.md, "A batch's keys")."""
import re

import numpy as np
import pytest

import collate_datasets as cd


def loader(datahelix, ds, **kw):
    # plan="count", no shuffle: batch k holds indices [4k, 4k+4) in order, so the odd
    # sample's slot is known
    kw.setdefault("batch_size", 4)
    return datahelix.DataLoader(dataset=ds, shuffle=False, plan="count", workers=1,
                                timeout=60, **kw)


@pytest.mark.parametrize("odd", [0, 5])  # first in its batch (slot 0), and not (slot 1)
def test_an_odd_typed_sample_raises_naming_it_wherever_it_sits(datahelix, odd):
    with loader(datahelix, cd.OddOne(n=8, odd=odd)) as dl:
        it = iter(dl)
        if odd >= 4:
            assert next(it)["indices"] == [0, 1, 2, 3]
        with pytest.raises(datahelix.DatasetError) as err:
            next(it)
    msg = str(err.value)
    assert f"sample '{odd}' (dataset[{odd}]) (batch slot {odd % 4})" in msg, msg
    # the reference: the batch's other samples, or what this worker process delivered before
    assert re.search(r"key 'image' is str, (the batch's other samples have|earlier batches "
                     r"had) arrays uint8 rank 3", msg), msg


@pytest.mark.parametrize("odd", [0, 6])
def test_with_skip_an_odd_typed_sample_fails_alone_and_the_batch_keeps_its_type(datahelix, odd):
    with loader(datahelix, cd.OddOne(n=8, odd=odd), on_error="skip") as dl:
        batches = list(dl)
    assert [b["indices"] for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    b = batches[odd // 4]
    slot = odd % 4
    assert str(b["image"].dtype) == "torch.uint8" and tuple(b["image"].shape) == (4, 4, 5, 3)
    assert b["image_mask"][slot].sum() == 0 and not b["image"][slot].any()
    assert int(b["tokens"][slot]) == 0
    assert "key 'image' is str" in b["errors"][slot] and f"batch slot {slot}" in b["errors"][slot]
    for row, i in enumerate(b["indices"]):
        if row != slot:
            assert b["errors"][row] is None
            assert np.array_equal(b["image"][row].numpy(), cd.image(i))
            assert bool(b["image_mask"][row].all())
            assert int(b["label"][row]) == i * 10 and b["caption"][row] == f"image {i}"


def test_a_collate_fn_failure_names_every_sample_of_the_batch(datahelix):
    with loader(datahelix, cd.OddOne(n=8), collate_fn=cd.collate_failing_on_30) as dl:
        with pytest.raises(datahelix.DatasetError) as err:
            next(iter(dl))
    msg = str(err.value)
    assert "collate_fn failed on the batch of samples '0' (dataset[0]), '1' (dataset[1]), " \
           "'2' (dataset[2]), '3' (dataset[3])" in msg, msg
    assert "ValueError: boom on labels [0, 10, 20, 30]" in msg, msg


def test_skip_keeps_every_key_of_a_batch_with_failed_samples(datahelix):
    # batch 1: both samples raise; batch 2: its first sample raises (slot 0: the row whose
    # keys the old code read); batch 3: collate_fn-free, the odd sample in slot 1
    ds = cd.OddOne(n=8, fail=(2, 3, 4), odd=7)
    with loader(datahelix, ds, batch_size=2, on_error="skip") as dl:
        batches = list(dl)
    assert [b["indices"] for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    keys = {"image", "image_mask", "label", "caption"}
    for b in batches:
        assert keys <= set(b), sorted(b)
        assert tuple(b["image"].shape) == (2, 4, 5, 3) and str(b["image"].dtype) == "torch.uint8"
    every = batches[1]
    assert not every["image"].any() and not every["image_mask"].any()
    assert every["label"].tolist() == [0, 0] and every["caption"] == [None, None]
    assert all("ValueError: cannot read image" in e for e in every["errors"])
    assert every["tokens"].tolist() == [0, 0]
    first = batches[2]
    assert first["caption"] == [None, "image 5"] and first["label"].tolist() == [0, 50]
    assert "cannot read image 4" in first["errors"][0] and first["errors"][1] is None


def test_skip_keeps_the_keys_when_the_collate_fn_fails(datahelix):
    with loader(datahelix, cd.OddOne(n=8), collate_fn=cd.collate_failing_on_30,
                batch_size=2, on_error="skip") as dl:
        batches = list(dl)
    bad = batches[1]
    assert bad["indices"] == [2, 3]
    assert {"image", "label", "caption"} <= set(bad), sorted(bad)
    assert not bad["image"].any() and bad["caption"] == [None, None]
    assert all("'2' (dataset[2]), '3' (dataset[3])" in e for e in bad["errors"])


def test_a_dataset_key_named_like_the_loaders_metadata_is_kept(datahelix):
    with loader(datahelix, cd.LoaderNames()) as dl:
        with pytest.warns(UserWarning, match="batch\\['__datahelix__'\\]\\['tokens'\\]"):
            batches = list(dl)
    for b in batches:
        idx = b["indices"]
        assert b["errors"] == [f"mine {i}" for i in idx]  # the dataset's
        assert b["info"].tolist() == idx
        assert b["tokens"].shape[0] == 4 and "tokens_mask" in b
        for row, i in enumerate(idx):
            n = 3 + i % 2
            assert b["tokens"][row, :n].tolist() == list(range(i, i + n))
        own = b["__datahelix__"]  # the loader's, all of it
        assert own["errors"] == [None] * 4 and own["indices"] == idx
        assert own["tokens"].tolist() == [3 + i % 2 for i in idx]
        assert own["sample_ids"] == [str(i) for i in idx] == b["sample_ids"]
        assert own["info"]["step"] == b["__datahelix__"]["info"]["step"]


@pytest.mark.parametrize("odd", [0, 2])
def test_the_public_default_collate_checks_the_same(datahelix, odd):
    samples = [cd.OddOne(n=3, odd=odd)[i] for i in range(3)]
    with pytest.raises(datahelix.DatasetError) as err:
        datahelix.default_collate(samples)
    assert f"sample {odd} (batch slot {odd})" in str(err.value)
    assert "key 'image' is str, the batch's other samples have arrays uint8 rank 3" in \
        str(err.value)
    ok = datahelix.default_collate([s for k, s in enumerate(samples) if k != odd])
    assert ok["image"].shape == (2, 4, 5, 3) and ok["image_mask"].all()
