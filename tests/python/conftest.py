"""Fixtures of the Python suite (run by `make test-python`, part of `make test`).

The package under test is build/python/datahelix (what `make` builds), or an installed
datahelix when DH_PYTHON_PATH is empty. Data sets are made with the CLI (DH_CLI, default
build/datahelix): small kinetics-s clips, probed with a calibration cache in the session's
temporary folder.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_path = os.environ.get("DH_PYTHON_PATH", os.path.join(ROOT, "build", "python"))
if _path:
    sys.path.insert(0, _path)

CLI = os.environ.get("DH_CLI", os.path.join(ROOT, "build", "datahelix"))

# Every placement of a coordinator (embedded, or a process the tests start) is checked against
# dh_place on a snapshot rebuilt from every server: a server change that the placement index
# missed aborts the coordinator, so the test fails (docs/runtime.md).
os.environ.setdefault("DH_PLACE_CHECK", "1")


def make_dataset(out, count, seed=1, mix="kinetics-s", corrupt=()):
    """synth + probe into `out` (absolute paths); then truncate the clips of `corrupt`
    (manifest indices) so that decoding them fails while their profile rows exist."""
    out = os.path.abspath(str(out))
    env = dict(os.environ, DH_CALIBRATION_CACHE=os.path.join(os.path.dirname(out), "calib.json"))
    subprocess.run([CLI, "synth", "--out", out, "--mix", mix, "--count", str(count),
                    "--seed", str(seed)], check=True, capture_output=True, env=env)
    subprocess.run([CLI, "probe", os.path.join(out, "manifest.jsonl"), "-o",
                    os.path.join(out, "profiles.jsonl")], check=True, capture_output=True, env=env)
    with open(os.path.join(out, "manifest.jsonl")) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    for i in corrupt:
        path = os.path.join(out, entries[i]["path"])
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(size // 3)
            f.write(b"\0" * (size - size // 3))
    return out, [e["id"] for e in entries]


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """12 clips, all readable: (dir, ids)."""
    return make_dataset(tmp_path_factory.mktemp("video") / "set", 12)


@pytest.fixture(scope="session")
def corrupt_dataset(tmp_path_factory):
    """8 clips, clip 3 corrupted after probing: (dir, ids, bad id)."""
    out, ids = make_dataset(tmp_path_factory.mktemp("corrupt") / "set", 8, seed=2, corrupt=(3,))
    return out, ids, ids[3]


@pytest.fixture(scope="session")
def datahelix():
    import datahelix as dh
    return dh


def torchrun_port():
    """A MASTER_PORT for torchrun whose +17 (the coordinator's, datahelix's torchrun rule) is
    free too, both below the kernel's ephemeral range: a port the OS hands out to outgoing
    connections (every test's sockets) can take P + 17 between this check and the bind, which
    failed a CI run with 'Address already in use'."""
    import random
    import socket
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low - 17)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 17))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair below the ephemeral range")


def pytest_report_header(config):
    return f"datahelix from {_path or 'site-packages'}; CLI {CLI}"


@pytest.fixture
def cli():
    if not os.access(CLI, os.X_OK):
        pytest.skip(f"{CLI} not built")
    return CLI


