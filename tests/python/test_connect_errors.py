"""A rank whose coordinator= is wrong is told why, within connect_timeout (docs/python.md,
"Connection errors"): no scheme, nothing listening (refused, unknown host), or a server there
that does not speak ZeroMQ (torchrun's TCPStore at MASTER_PORT, any other TCP server). Each
case runs against a real peer this test starts. Before, each of these waited 30 s and blamed
"no local DataServer" or "the peer requires CURVE keys"."""
import socket
import subprocess
import threading
import time

import pytest

from conftest import CLI

TIMEOUT_S = 2.0  # connect_timeout of every case
SLACK_S = 2.5    # the probe (<= 1 s) and the process's own start on a loaded machine


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    out = tmp_path_factory.mktemp("connect") / "p.jsonl"
    subprocess.run([CLI, "gen-profiles", "--mix", "kinetics-mixed", "--count", "8", "-o",
                    str(out)], check=True, capture_output=True)
    return str(out)


def first_batch(datahelix, profiles, endpoint, timeout_s=TIMEOUT_S):
    loader = datahelix.DataLoader(profiles, batch_size=2, coordinator=endpoint, rank=0,
                                  world_size=1, connect_timeout=timeout_s)
    next(iter(loader))


def fails(datahelix, profiles, endpoint, cls, match, timeout_s=TIMEOUT_S):
    """Starts a loader on endpoint; returns the seconds until it raised cls matching match."""
    t0 = time.monotonic()
    with pytest.raises(cls, match=match):
        first_batch(datahelix, profiles, endpoint, timeout_s)
    return time.monotonic() - t0


class Listener:
    """A TCP server on 127.0.0.1 that is no ZeroMQ peer: on each connection it runs
    `answer(conn)` (send bytes, close, or keep silent)."""

    def __init__(self, answer):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.held = []
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)
            self.answer(conn)

    def close(self):
        self.sock.close()
        for c in self.held:
            c.close()


def test_an_endpoint_without_a_scheme_fails_at_once(datahelix, profiles):
    took = fails(datahelix, profiles, "127.0.0.1:5555", datahelix.InvalidArgumentError,
                 r"no scheme: endpoints are tcp://HOST:PORT or ipc://PATH")
    assert took < 1.0


def test_a_closed_port_names_the_coordinator_and_refusal(datahelix, profiles):
    # bound, never listening: connects are refused, and no one else can take the port
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        took = fails(datahelix, profiles, f"tcp://127.0.0.1:{port}", datahelix.TimeoutError,
                     rf"cannot reach the coordinator at tcp://127\.0\.0\.1:{port} "
                     r"\(connection refused\)")
    assert took < TIMEOUT_S + SLACK_S


def test_an_unknown_host_says_host_not_found(datahelix, profiles):
    took = fails(datahelix, profiles, "tcp://no-such-host.invalid:5555",
                 datahelix.DataHelixError,
                 r"cannot reach the coordinator at tcp://no-such-host\.invalid:5555 "
                 r"\(host not found")
    assert took < TIMEOUT_S + SLACK_S


def test_a_server_that_closes_at_once_is_not_a_coordinator(datahelix, profiles):
    # what torchrun's TCPStore does with bytes that are not its own protocol
    peer = Listener(lambda conn: conn.close())
    try:
        took = fails(datahelix, profiles, f"tcp://127.0.0.1:{peer.port}",
                     datahelix.DataHelixError,
                     rf"tcp://127\.0\.0\.1:{peer.port} answered, but it is not a DataHelix "
                     r"coordinator", timeout_s=20)
    finally:
        peer.close()
    assert took < 5, "a foreign peer is known at its first answer, not at connect_timeout"


def test_a_server_of_another_protocol_is_not_a_coordinator(datahelix, profiles):
    def http(conn):
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    peer = Listener(http)
    try:
        took = fails(datahelix, profiles, f"tcp://127.0.0.1:{peer.port}",
                     datahelix.DataHelixError,
                     rf"tcp://127\.0\.0\.1:{peer.port} answered, but it is not a DataHelix "
                     r"coordinator")
    finally:
        peer.close()
    assert took < TIMEOUT_S + SLACK_S


def test_a_silent_server_is_not_a_coordinator(datahelix, profiles):
    peer = Listener(lambda conn: None)  # accepts, reads nothing, says nothing
    try:
        took = fails(datahelix, profiles, f"tcp://127.0.0.1:{peer.port}",
                     datahelix.DataHelixError,
                     rf"tcp://127\.0\.0\.1:{peer.port} answered, but it is not a DataHelix "
                     r"coordinator \(it accepted the connection but sent no ZeroMQ greeting")
    finally:
        peer.close()
    assert took < TIMEOUT_S + SLACK_S


def test_torchruns_store_is_not_a_coordinator(datahelix, profiles):
    torch = pytest.importorskip("torch")
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    took = fails(datahelix, profiles, f"tcp://127.0.0.1:{store.port}",
                 datahelix.DataHelixError,
                 rf"tcp://127\.0\.0\.1:{store.port} answered, but it is not a DataHelix "
                 r"coordinator")
    assert took < TIMEOUT_S + SLACK_S
    del store


def cluster_log(env_level=None, arg_level=None):
    """stderr of a process that starts and stops a cluster, with DATAHELIX_LOG_LEVEL and
    start_cluster's log_level= as given."""
    import os
    import sys
    from conftest import _path
    env = dict(os.environ)
    env.pop("DATAHELIX_LOG_LEVEL", None)
    env.pop("DH_LOG_LEVEL", None)
    if env_level:
        env["DATAHELIX_LOG_LEVEL"] = env_level
    code = (f"import sys; sys.path.insert(0, {_path!r}); import datahelix; "
            f"datahelix.start_cluster(workers=1, log_level={arg_level!r}).close()")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_log_level_sets_the_c_sides_threshold(datahelix):
    assert " INFO coordinator: listening" in cluster_log()
    assert " INFO " not in cluster_log(env_level="warn")
    assert " INFO " not in cluster_log(arg_level="error")
    assert " INFO coordinator: listening" in cluster_log(env_level="error", arg_level="info")
    before = datahelix._C.set_log_level("debug")
    try:
        assert before in ("error", "warn", "info", "debug")
        with pytest.raises(datahelix.InvalidArgumentError, match="log_level 'loud'"):
            datahelix._C.set_log_level("loud")
    finally:
        datahelix._C.set_log_level(before)
