"""The values the C side owns come from C (src/python/values.c, docs/python.md "Values from C"):
the arena budget, the byte-count parser, the profile row writer, the dtype table and the
rebalance keys. Each test holds the Python side to the C one."""
import json
import os
import subprocess
import sys

import pytest

from conftest import CLI

PHYS_QUARTER = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


def _budget_in_child(datahelix, env_value):
    """_C.arena_budget_default() in a fresh process with DH_ARENA_BUDGET = env_value (None:
    unset)."""
    env = dict(os.environ)
    package = os.path.dirname(os.path.dirname(os.path.abspath(datahelix.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package, env.get("PYTHONPATH", "")])
    env.pop("DH_ARENA_BUDGET", None)
    if env_value is not None:
        env["DH_ARENA_BUDGET"] = env_value
    code = "import datahelix; print(datahelix._C.arena_budget_default())"
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True,
                         timeout=60).stdout
    return int(out.split()[-1])


# ---- the arena budget ---------------------------------------------------------------------

def test_arena_budget_is_the_environment_when_set(datahelix, monkeypatch):
    for text, value in (("8G", 8 << 30), ("512m", 512 << 20), ("1048576", 1 << 20),
                        ("3k", 3 << 10)):
        monkeypatch.setenv("DH_ARENA_BUDGET", text)
        assert datahelix._C.arena_budget_default() == value
        assert datahelix._C.arena_budget_default() == datahelix._C.parse_bytes(text)
    assert _budget_in_child(datahelix, "2G") == 2 << 30


def _available_bytes() -> int:
    """MemAvailable + SwapFree of /proc/meminfo, as the C side reads it."""
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0]) * 1024
    return fields.get("MemAvailable", 0) + fields.get("SwapFree", 0)


def _same_budget(a: int, b: int) -> bool:
    """Two readings of the default budget: equal while a quarter of memory bounds it; when
    half of the memory available now bounds it (a busy machine), that moves between
    readings, so within 10%."""
    return a == b or abs(a - b) <= 0.1 * max(a, b)


def test_arena_budget_unset_or_invalid_is_the_memory_quarter(datahelix, monkeypatch):
    monkeypatch.delenv("DH_ARENA_BUDGET", raising=False)
    unset = datahelix._C.arena_budget_default()
    # a quarter of physical memory, or of the memory cgroup's limit when that is lower, and
    # at most half of the memory available now (shared-memory.md section 2a)
    assert 0 < unset <= PHYS_QUARTER
    assert unset <= _available_bytes() // 2 * 1.1
    assert _same_budget(_budget_in_child(datahelix, None), unset)
    monkeypatch.setenv("DH_ARENA_BUDGET", "lots")  # C warns and falls back
    assert _same_budget(datahelix._C.arena_budget_default(), unset)


def test_the_python_copy_of_the_budget_is_gone(datahelix):
    from datahelix import cluster, loader
    assert not hasattr(cluster, "_arena_budget_bytes")
    assert not hasattr(loader, "_arena_budget_bytes")


# ---- byte counts --------------------------------------------------------------------------

ACCEPTED = {"1": 1, "4096": 4096, "8G": 8 << 30, "8g": 8 << 30, "512M": 512 << 20,
            "512m": 512 << 20, "64K": 64 << 10, "64k": 64 << 10, "007": 7}
REFUSED = ["", "0", "0G", "-1", "1.5G", "8T", "8GB", "8 G", " 8G", "8G ", "G", "x",
           "99999999999999999999", "17179869184G"]


@pytest.mark.parametrize("text", sorted(ACCEPTED))
def test_parse_bytes_accepts(datahelix, text):
    assert datahelix._C.parse_bytes(text) == ACCEPTED[text]


@pytest.mark.parametrize("text", REFUSED)
def test_parse_bytes_refuses(datahelix, text):
    with pytest.raises(datahelix.InvalidArgumentError, match="arena_budget"):
        datahelix._C.parse_bytes(text, "arena_budget")


def test_parse_bytes_refuses_what_is_not_a_str(datahelix):
    for value in (8, None, b"8G", "8G\0"):
        with pytest.raises(datahelix.InvalidArgumentError):
            datahelix._C.parse_bytes(value)


@pytest.mark.skipif(not os.path.exists(CLI), reason="the CLI is not built")
def test_the_cli_accepts_and_refuses_the_same_strings(datahelix):
    """`datahelix server --arena-budget X` parses X first: a refused X is its error, an
    accepted one gets as far as the missing --coordinator."""
    for text in list(ACCEPTED) + REFUSED:
        r = subprocess.run([CLI, "server", "--arena-budget", text], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 2
        cli_accepts = "--coordinator is required" in r.stderr
        if not cli_accepts:
            assert "--arena-budget" in r.stderr, r.stderr
        try:
            datahelix._C.parse_bytes(text)
            python_accepts = True
        except datahelix.InvalidArgumentError:
            python_accepts = False
        assert python_accepts == cli_accepts, (text, r.stderr)


def test_loader_arena_budget_uses_the_c_parser(datahelix, monkeypatch):
    from datahelix.cluster import _set_arena_budget
    monkeypatch.delenv("DH_ARENA_BUDGET", raising=False)
    _set_arena_budget("3g")  # a lower-case suffix, as C takes it
    assert os.environ["DH_ARENA_BUDGET"] == "3g"
    _set_arena_budget(5 << 20)
    assert datahelix._C.arena_budget_default() == 5 << 20
    for bad in ("8T", " 8G", 0, -1, True, 1.5, "0"):
        with pytest.raises(datahelix.InvalidArgumentError, match="arena_budget"):
            _set_arena_budget(bad)
    assert os.environ["DH_ARENA_BUDGET"] == str(5 << 20)


# ---- profile rows -------------------------------------------------------------------------

ROW = {"id": "0", "uri": "index:0", "profile_key": "python", "frames": 1, "height": 1,
       "width": 1, "tokens_est": 7, "cpu_s_est": 0.0125, "in_bytes": 0, "out_bytes": 96}


def test_write_profiles_writes_the_c_format(datahelix, tmp_path):
    path = tmp_path / "profiles.jsonl"
    rows = [ROW, dict(ROW, id="1", uri="index:1", cpu_s_est=0.0, duration_s=2.5, fps=30,
                      text_len=4, codec="h264", node=None, meta={"lang": "fr", "t": "é"})]
    assert datahelix._C.write_profiles(str(path), iter(rows)) == 2
    lines = path.read_text(encoding="utf-8").splitlines()
    # the first row has no optional field: byte for byte what json.dumps wrote before
    assert lines[0] == json.dumps(ROW, separators=(",", ":"))
    second = json.loads(lines[1])
    # node None: absent, as the C writer leaves out an absent optional field
    assert second == {k: v for k, v in rows[1].items() if k != "node"}
    assert '"t":"é"' in lines[1]  # unknown fields verbatim, not ASCII-escaped
    # the C loader reads it back: the planner over the written set
    assert datahelix._C.plan(str(path), 0, 0, 1, 2, shuffle=False) in ([0, 1], [1, 0])


@pytest.mark.parametrize("bad, match", [
    ({k: v for k, v in ROW.items() if k != "uri"}, "'uri' is missing"),
    (dict(ROW, frames=-1), "'frames'"),
    (dict(ROW, tokens_est="7"), "'tokens_est'"),
    (dict(ROW, cpu_s_est="x"), "'cpu_s_est'"),
    (dict(ROW, id=3), "'id' must be a str"),
])
def test_write_profiles_refuses_a_bad_row(datahelix, tmp_path, bad, match):
    with pytest.raises(datahelix.SchemaError, match=match):
        datahelix._C.write_profiles(str(tmp_path / "p.jsonl"), [ROW, bad])


def test_write_profiles_passes_on_the_iterators_error(datahelix, tmp_path):
    def rows():
        yield ROW
        raise KeyError("from the dataset")
    with pytest.raises(KeyError, match="from the dataset"):
        datahelix._C.write_profiles(str(tmp_path / "p.jsonl"), rows())
    with pytest.raises(OSError):
        datahelix._C.write_profiles(str(tmp_path / "no" / "dir.jsonl"), [ROW])
    if os.path.exists("/dev/full"):  # the disk fills up
        with pytest.raises(OSError):
            datahelix._C.write_profiles("/dev/full", [ROW] * 1000)


def test_a_python_datasets_profile_rows_come_from_the_c_writer(datahelix, tmp_path):
    from datahelix.sources import _dataset_source

    class Costed:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"x": i}

        def estimate_cost(self, i):
            return {"cpu_s": 0.5 * i, "tokens": 10 + i, "out_bytes": 100 * i}

    _dataset_source(Costed(), str(tmp_path), seed=0)
    lines = (tmp_path / "profiles.jsonl").read_text().splitlines()
    expected = [{"id": str(i), "uri": f"index:{i}", "profile_key": "python", "frames": 1,
                 "height": 1, "width": 1, "tokens_est": 10 + i, "cpu_s_est": 0.5 * i,
                 "in_bytes": 0, "out_bytes": 100 * i} for i in range(3)]
    assert [json.loads(line) for line in lines] == expected
    assert lines[1] == json.dumps(expected[1], separators=(",", ":"))


# ---- dtypes -------------------------------------------------------------------------------

def test_dtypes_are_the_c_table(datahelix):
    table = datahelix._C.DTYPES
    assert table["uint8"] == (1, 1, "B") and table["float32"] == (11, 4, "f")
    assert table["bfloat16"] == (10, 2, "")
    assert len({code for code, _, _ in table.values()}) == len(table)
    from datahelix import _collate, _worker
    # a Python dataset's arrays: the table's dtypes that numpy has (a buffer format)
    assert _collate.DTYPES == {n for n, (_, _, fmt) in table.items() if fmt}
    assert _worker.DTYPES is _collate.DTYPES
    np = pytest.importorskip("numpy")
    for name, (_, size, fmt) in table.items():
        if fmt:
            assert np.dtype(name).itemsize == size and np.dtype(fmt).name == name


# ---- rebalance keys -----------------------------------------------------------------------

def test_rebalance_keys_are_the_bindings(datahelix):
    keys, spec = datahelix._C.REBALANCE_KEYS, datahelix._C.REBALANCE_SPEC_KEYS
    assert datahelix.REBALANCE_KEYS is keys
    from datahelix import rebalance
    assert rebalance.REBALANCE_KEYS is keys
    assert set(spec) < set(keys) and len(set(keys)) == len(keys)
    # (allow_unencrypted_exchange is both: the DataLoader checks it, and the parse hands it
    # to the C client's own check)
    assert set(keys) - set(spec) == {"client_ranks", "fanout", "process_group"}
    # every spec key gets past the binding's parse's key check; a DataLoader-only key does not
    with pytest.raises(datahelix.InvalidArgumentError) as info:
        datahelix._C.RebalanceSpec({"fanout": 1}, 2)
    assert "'fanout'" in str(info.value)
    assert f"allowed: {', '.join(sorted(spec))})" in str(info.value)
    datahelix._C.RebalanceSpec({"buffer_size": 4, "min_gain": 0.0, "late_ms": 0}, 2)
