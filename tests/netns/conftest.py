"""Fixtures of the multi-node tests (tests/netns, run by `make test-python` as root): the
package from build/python (DH_PYTHON_PATH), the CLI from DH_CLI (default build/datahelix);
every test is skipped, with the reason, where network namespaces cannot be made."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_path = os.environ.get("DH_PYTHON_PATH", os.path.join(ROOT, "build", "python"))
if _path:
    sys.path.insert(0, _path)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.abspath(os.environ.get("DH_CLI", os.path.join(ROOT, "build", "datahelix")))

import netns  # noqa: E402

_why = netns.unavailable()


@pytest.fixture
def net3():
    """Three nodes: node-a and node-b (training nodes), cpu-1 (a sidecar-only node)."""
    if _why:
        pytest.skip(_why)
    net = netns.Net(3, mbit=200)
    yield net
    net.close()
