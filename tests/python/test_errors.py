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
