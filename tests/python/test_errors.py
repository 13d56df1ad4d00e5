"""The C error table as Python exception classes."""
import errno

import pytest


def test_every_c_error_has_a_class(datahelix):
    table = datahelix._C.error_table()
    assert len(table) >= 14
    for c_name, code, py_name in table:
        assert py_name, f"C error {c_name} has no Python class"
        cls = getattr(datahelix, py_name)
        assert issubclass(cls, datahelix.DataHelixError)
        with pytest.raises(cls) as info:
            datahelix._C.raise_error(code, "ctx")
        assert info.value.code == code and info.value.name == "DH_E" + c_name
        assert str(info.value).startswith("ctx: ")


def test_classes_are_also_the_builtin_ones(datahelix):
    assert issubclass(datahelix.NotFoundError, FileNotFoundError)
    assert issubclass(datahelix.MediaError, OSError)
    assert issubclass(datahelix.InvalidArgumentError, ValueError)
    with pytest.raises(FileNotFoundError):
        datahelix._C.raise_error(-errno.ENOENT, "open")


def test_a_c_failure_carries_the_c_message(datahelix, tmp_path):
    bad = tmp_path / "profiles.jsonl"
    bad.write_text('{"id": 1}\n')
    with pytest.raises(datahelix.DataHelixError) as info:
        datahelix._C.Client(str(bad), 0, 1, 1)
    assert str(bad) in str(info.value)


def test_a_dataserver_that_cannot_start_says_why(datahelix):
    """An arena over the machine's memory fails at start naming its size and the limit;
    a malformed shm_allow_uids names the parameter (docs/shared-memory.md §2a, §3)."""
    with pytest.raises(datahelix.OutOfMemoryError) as info:
        datahelix._C.DataServer("tcp://127.0.0.1:1", "n0", workers=1, arena_bytes=1 << 49)
    assert "562949953421312 bytes" in str(info.value) and "exceed" in str(info.value)
    with pytest.raises(datahelix.InvalidArgumentError) as info:
        datahelix._C.DataServer("tcp://127.0.0.1:1", "n0", workers=1, arena_bytes=1 << 22,
                                shm_allow_uids="1000,nobody")
    assert "shm_allow_uids" in str(info.value) and "'1000,nobody'" in str(info.value)
    server = datahelix._C.DataServer("tcp://127.0.0.1:1", "n0", workers=1, arena_bytes=1 << 22,
                                     shm_allow_uids="1000,65534")
    server.close()
