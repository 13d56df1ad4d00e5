"""No side door for tier 2 (python/datahelix/_exchange.py; docs/security.md, "What travels
where"): with CURVE keys configured, rebalance["process_group"] / ["exchange_fn"] (which carry
cross-node tier-2 payloads over torch.distributed, unencrypted) are refused unless
rebalance["allow_unencrypted_exchange"] is True, which warns once per process. Without keys
nothing changes. Argument checks only: nothing starts."""
import subprocess
import warnings

import pytest

from conftest import CLI

LOADER = dict(batch_size=2, rank=0, world_size=2, coordinator="tcp://127.0.0.1:1")


def no_exchange(rnd, ranks, send, send_counts, recv, recv_counts):
    raise AssertionError("never called: nothing starts")


@pytest.fixture
def profiles(tmp_path):
    """A data set directory that resolve_source accepts (no client reads it)."""
    (tmp_path / "profiles.jsonl").write_text("")
    return str(tmp_path)


@pytest.fixture
def keys(tmp_path, monkeypatch):
    """A CURVE key directory (datahelix keygen), and no DATAHELIX_KEYS of the caller's."""
    monkeypatch.delenv("DATAHELIX_KEYS", raising=False)
    monkeypatch.delenv("DATAHELIX_KEY", raising=False)
    folder = tmp_path / "keys"
    folder.mkdir()
    subprocess.run([CLI, "keygen", "-o", str(folder / "server")], check=True,
                   capture_output=True)
    return str(folder)


@pytest.fixture
def fresh_warning():
    """The opt-in's warning is said once per process: again for this test."""
    from datahelix import _exchange
    _exchange._plaintext_warned = False
    yield
    _exchange._plaintext_warned = False


def side_door_warnings(caught):
    return [w for w in caught if "allow_unencrypted_exchange" in str(w.message)]


def assert_refusal_names_everything(message, given):
    assert f"rebalance['{given}']" in message, message
    for what in ("process_group", "exchange_fn", "allow_unencrypted_exchange", "CURVE",
                 "torch.distributed", "docs/security.md"):
        assert what in message, message


def test_keys_and_a_process_group_are_refused(datahelix, profiles, keys):
    with pytest.raises(ValueError) as info:  # InvalidArgumentError is a ValueError
        datahelix.DataLoader(profiles, keys=keys, rebalance={"process_group": object()},
                             **LOADER)
    assert isinstance(info.value, datahelix.InvalidArgumentError)
    assert_refusal_names_everything(str(info.value), "process_group")


def test_keys_and_an_exchange_fn_are_refused(datahelix, profiles, keys, monkeypatch):
    with pytest.raises(datahelix.InvalidArgumentError) as info:
        datahelix.DataLoader(profiles, keys=keys, rebalance={"exchange_fn": no_exchange},
                             **LOADER)
    assert_refusal_names_everything(str(info.value), "exchange_fn")
    # keys from the environment count as keys=
    monkeypatch.setenv("DATAHELIX_KEYS", keys)
    with pytest.raises(datahelix.InvalidArgumentError, match="allow_unencrypted_exchange"):
        datahelix.DataLoader(profiles, rebalance={"exchange_fn": no_exchange}, **LOADER)
    # an opt-in that is not True is no opt-in
    for allow in (False, None):
        with pytest.raises(datahelix.InvalidArgumentError, match="allow_unencrypted_exchange"):
            datahelix.DataLoader(profiles, rebalance={"exchange_fn": no_exchange,
                                                      "allow_unencrypted_exchange": allow},
                                 **LOADER)
    with pytest.raises(datahelix.InvalidArgumentError, match="must be True or False"):
        datahelix.DataLoader(profiles, rebalance={"exchange_fn": no_exchange,
                                                  "allow_unencrypted_exchange": "yes"},
                             **LOADER)


def test_the_opt_in_allows_it_and_warns_once(datahelix, profiles, keys, fresh_warning):
    spec = {"exchange_fn": no_exchange, "allow_unencrypted_exchange": True}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            dl = datahelix.DataLoader(profiles, keys=keys, rebalance=dict(spec), **LOADER)
            assert dl.rebalance
            # the opt-in reaches the C client, which checks it too (client.c)
            assert dl._client_kwargs["rebalance"]["allow_unencrypted_exchange"] is True
            assert dl._client_kwargs["rebalance"]["exchange_fn"] is no_exchange
        # process_group with the opt-in passes the guard to its own next check
        with pytest.raises(datahelix.InvalidArgumentError, match="torch.distributed initialized"):
            datahelix.DataLoader(profiles, keys=keys, **LOADER, rebalance={
                "process_group": object(), "allow_unencrypted_exchange": True})
    said = side_door_warnings(caught)
    assert len(said) == 1, [str(w.message) for w in caught]
    msg = str(said[0].message)
    assert said[0].category is UserWarning
    for what in ("plaintext", "torch.distributed", "exchange_fn", "CURVE", keys):
        assert what in msg, msg
    assert said[0].filename == __file__  # points at the caller's DataLoader(...)


def test_a_client_made_directly_is_refused_too(datahelix, profiles, keys, fresh_warning):
    """The C client's own check (dh_client_new): a _C.Client given CURVE keys and an
    exchange_fn without the opt-in is refused before it starts, whoever made it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dl = datahelix.DataLoader(profiles, keys=keys, **LOADER, rebalance={
            "exchange_fn": no_exchange, "allow_unencrypted_exchange": True})
    kwargs = dict(dl._client_kwargs)
    assert kwargs.get("keys_dir") == keys
    kwargs["rebalance"] = {"exchange_fn": no_exchange}
    with pytest.raises(datahelix.InvalidArgumentError) as info:
        datahelix._C.Client(dl.profiles, dl.rank, dl.world_size, dl.batch_size, **kwargs)
    for what in ("exchange_fn with CURVE keys", keys, "allow_unencrypted_exchange = 1"):
        assert what in str(info.value), str(info.value)


def test_without_keys_nothing_changes(datahelix, profiles, monkeypatch, fresh_warning):
    monkeypatch.delenv("DATAHELIX_KEYS", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dl = datahelix.DataLoader(profiles, rebalance={"exchange_fn": no_exchange}, **LOADER)
        assert dl._client_kwargs["rebalance"]["exchange_fn"] is no_exchange
        dl = datahelix.DataLoader(profiles, **LOADER, rebalance={
            "exchange_fn": no_exchange, "allow_unencrypted_exchange": True})
        assert dl._client_kwargs["rebalance"]["exchange_fn"] is no_exchange
        with pytest.raises(datahelix.InvalidArgumentError, match="torch.distributed initialized"):
            datahelix.DataLoader(profiles, rebalance={"process_group": object()}, **LOADER)
    assert side_door_warnings(caught) == [], [str(w.message) for w in caught]


def test_keys_without_an_exchange_are_unchanged(datahelix, profiles, keys, fresh_warning):
    # tier 2 with keys and no process_group/exchange_fn: the DataServers forward over CURVE
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dl = datahelix.DataLoader(profiles, keys=keys, rebalance=True, **LOADER)
        assert dl.rebalance and "exchange_fn" not in dl._client_kwargs["rebalance"]
    assert side_door_warnings(caught) == []
