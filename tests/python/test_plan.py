"""datahelix._C.plan: the client's tier-1 rule without a client (src/sched, dh_plan_rank_share).

It must give what a connected client plans (Client.plan), and share each step's window among
the ranks: every row of the window to exactly one rank, in every plan mode.
"""
import pytest


def test_plan_without_a_client_is_the_clients_plan(datahelix, dataset):
    profiles = dataset[0] + "/profiles.jsonl"
    c = datahelix._C.Client(profiles, 0, 2, 2, workers=1, arena_bytes=64 << 20, max_steps=1,
                            seed=5)
    try:
        for step in range(3):
            for rank in range(2):
                assert datahelix._C.plan(profiles, step, rank, 2, 2, seed=5) == c.plan(step, rank)
    finally:
        c.close()


@pytest.mark.parametrize("token_plan", [0, 1, 2])
def test_plan_shares_each_window_once(datahelix, dataset, token_plan):
    profiles = dataset[0] + "/profiles.jsonl"
    ranks, batch = 3, 2
    for step in range(4):  # 12 rows, 6 a step: steps 0-1 are epoch 0, 2-3 epoch 1
        shares = [datahelix._C.plan(profiles, step, r, ranks, batch, seed=1,
                                    token_plan=token_plan) for r in range(ranks)]
        rows = [row for share in shares for row in share]
        assert len(rows) == ranks * batch and len(set(rows)) == len(rows)
        if token_plan != 2:
            assert all(len(share) == batch for share in shares)
        again = [datahelix._C.plan(profiles, step, r, ranks, batch, seed=1,
                                   token_plan=token_plan) for r in range(ranks)]
        assert again == shares  # deterministic


def test_plan_names_bad_arguments(datahelix, dataset, tmp_path):
    profiles = dataset[0] + "/profiles.jsonl"
    with pytest.raises(ValueError, match="rank 2"):
        datahelix._C.plan(profiles, 0, 2, 2, 2)
    with pytest.raises(ValueError, match="fewer than ranks x batch"):
        datahelix._C.plan(profiles, 0, 0, 4, 4)
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(datahelix.DataHelixError, match="nope.jsonl"):
        datahelix._C.plan(missing, 0, 0, 2, 2)


def test_package_plan_takes_the_loaders_arguments(datahelix, dataset):
    src = dataset[0]
    assert datahelix.plan(src, 1, 0, 2, 3, seed=2, plan="count") == \
        datahelix._C.plan(src + "/profiles.jsonl", 1, 0, 2, 3, seed=2, token_plan=0)
    with pytest.raises(datahelix.InvalidArgumentError, match="plan must be one of"):
        datahelix.plan(src, 0, 0, 2, 2, plan="greedy")

