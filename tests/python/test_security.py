"""Authenticated, encrypted transport (docs/security.md; src/wire/auth.c): with a key directory
every tcp:// socket speaks CURVE and admits only the listed keys.

Real processes on loopback: a coordinator and a local DataServer (`datahelix coordinator` /
`server --keys DIR`), a remote sidecar that runs a Python dataset of images made of a known
byte pattern, and a rank (datahelix.DataLoader). The local DataServer advertises a relay in
front of its data socket, so everything the sidecar forwards to it crosses the relay, which
keeps a copy: in plaintext the pattern is there (the check can fail), with keys it is not.
"""
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

import pydatasets
from conftest import CLI, ROOT, torchrun_port

HERE = os.path.dirname(os.path.abspath(__file__))


def wait_for(cond, what, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Relay:
    """A TCP relay on 127.0.0.1 (port chosen by the kernel) to 127.0.0.1:target (set once
    known; connections wait for it). Keeps every byte it carries, both ways, one stream per
    connection and direction: bytes() must not interleave streams, or a chunk of one could
    split a pattern in another (the plaintext control once counted 3071 of 3072)."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.target = None
        self.streams = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        while self.target is None and not self.stop.is_set():
            time.sleep(0.01)
        try:
            up = socket.create_connection(("127.0.0.1", self.target))
        except OSError:
            conn.close()
            return
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src, dst):
        stream = bytearray()
        with self.lock:
            self.streams.append(stream)
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self.lock:
                    stream += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def bytes(self):
        """Every stream, in the order they opened, each whole, separated by a line."""
        with self.lock:
            return b"\n----\n".join(bytes(s) for s in self.streams)

    def close(self):
        self.stop.set()
        self.listener.close()


class Proc:
    """A CLI process with its standard error in a file."""

    def __init__(self, tmp_path, name, args, env=None):
        self.log = tmp_path / f"{name}.log"
        self.p = subprocess.Popen([CLI] + args, stderr=open(self.log, "w"),
                                  stdout=subprocess.DEVNULL, env=env)

    def text(self):
        return self.log.read_text()

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
        self.p.wait(timeout=30)


def keygen(folder, name):
    out = subprocess.run([CLI, "keygen", "-o", str(folder / name)], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture()
def keys(tmp_path):
    """The job's key directory: the server key and a sidecar's own key."""
    folder = tmp_path / "keys"
    folder.mkdir()
    keygen(folder, "server")
    keygen(folder, "sidecar")
    return folder


def sidecar_env():
    return dict(os.environ, DH_PYTHON_EXE=sys.executable,
                PYTHONPATH=os.pathsep.join([HERE, os.environ.get("DH_PYTHON_PATH") or
                                            os.path.join(ROOT, "build", "python")]))


def start_job(datahelix, tmp_path, keys):
    """Coordinator, local DataServer behind a relay (no workers: every batch comes from the
    sidecar), and a sidecar running pydatasets:make_pattern. keys=None: plaintext."""
    auth = ["--keys", str(keys)] if keys else []
    coord = Proc(tmp_path, "coordinator", ["coordinator", "--listen", "tcp://127.0.0.1:*"] + auth)
    endpoint = wait_for(lambda: (re.search(r"listening on (tcp://\S+)", coord.text()) or [0, 0])[1],
                        "the coordinator's endpoint")
    relay = Relay()
    # the data socket's port: below the kernel's ephemeral range (conftest.torchrun_port), so
    # no outgoing connection takes it between this choice and the bind
    relay.target = torchrun_port()
    local = Proc(tmp_path, "local",
                 ["server", "--coordinator", endpoint, "--role", "local", "--node", "n1",
                  "--workers", "0", "--heartbeat-ms", "50", "--listen",
                  f"tcp://127.0.0.1:{relay.target}",
                  "--advertise", f"tcp://127.0.0.1:{relay.port}"] + auth)
    sidecar = Proc(tmp_path, "sidecar",
                   ["server", "--coordinator", endpoint, "--role", "remote", "--node", "n2",
                    "--workers", "2", "--heartbeat-ms", "50", "--dataset",
                    "pydatasets:make_pattern"] + (auth + ["--key", "sidecar"] if keys else []),
                   env=sidecar_env())
    return endpoint, relay, [sidecar, local, coord]


def consume(datahelix, endpoint, keys):
    ds = pydatasets.Pattern()
    kw = {"keys": str(keys)} if keys else {}
    with datahelix.DataLoader(dataset=ds, batch_size=3, coordinator=endpoint, rank=0,
                              world_size=1, node="n1", timeout=60, **kw) as dl:
        batches = list(dl)
    for b in batches:
        assert b["info"]["server"].startswith("n2-remote")
        for row in b["image"].numpy():
            assert row.tobytes() == pydatasets.PATTERN * 256
    assert sorted(i for b in batches for i in b["indices"]) == list(range(len(ds)))


@pytest.mark.parametrize("encrypted", [False, True], ids=["plaintext", "curve"])
def test_forwarded_pixels_cross_the_wire_only_encrypted(datahelix, tmp_path, keys, encrypted):
    endpoint, relay, procs = start_job(datahelix, tmp_path, keys if encrypted else None)
    try:
        consume(datahelix, endpoint, keys if encrypted else None)
    finally:
        for p in procs:
            p.stop()
        relay.close()
    wire = relay.bytes()
    images = 12 * 64 * 64
    assert len(wire) > images, f"the relay carried {len(wire)} bytes: the batches went elsewhere"
    if encrypted:
        assert pydatasets.PATTERN[:8] not in wire, "pixel bytes crossed the wire in plaintext"
        assert b"CURVE" in wire[:4096]  # the ZMTP greeting names the mechanism
    else:
        assert wire.count(pydatasets.PATTERN) >= 12 * 256  # the control: the check can fail


def test_unknown_keys_are_refused_and_named(datahelix, tmp_path, keys):
    coord = Proc(tmp_path, "coordinator",
                 ["coordinator", "--listen", "tcp://127.0.0.1:*", "--keys", str(keys)])
    endpoint = wait_for(lambda: (re.search(r"listening on (tcp://\S+)", coord.text()) or [0, 0])[1],
                        "the coordinator's endpoint")
    rogue = tmp_path / "rogue"
    rogue.mkdir()
    (rogue / "server.pub").write_bytes((keys / "server.pub").read_bytes())
    evil = keygen(rogue, "evil")
    try:
        # a DataServer with an unlisted key: it exits, naming its key; the coordinator logs it
        t0 = time.monotonic()
        out = subprocess.run([CLI, "server", "--coordinator", endpoint, "--role", "remote",
                              "--node", "x", "--workers", "1", "--keys", str(rogue), "--key",
                              "evil"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, out.stderr
        assert "refused this process's key" in out.stderr and evil in out.stderr, out.stderr
        assert time.monotonic() - t0 < 20
        wait_for(lambda: f"refused CURVE key {evil} from 127.0.0.1" in coord.text(),
                 "the coordinator's log of the refusal")
        # a rank with an unlisted key: AuthError, naming the key file to list
        profiles = tmp_path / "p.jsonl"
        subprocess.run([CLI, "gen-profiles", "--mix", "kinetics-mixed", "--count", "8", "-o",
                        str(profiles)], check=True, capture_output=True)
        with pytest.raises(datahelix.AuthError, match=r"evil\.pub"):
            next(iter(datahelix.DataLoader(str(profiles), batch_size=2, coordinator=endpoint,
                                           rank=0, world_size=1, keys=str(rogue), key="evil",
                                           connect_timeout=20)))
        # a rank without keys: AuthError saying the peer requires keys
        env_keys = os.environ.pop("DATAHELIX_KEYS", None)
        try:
            with pytest.raises(datahelix.AuthError, match="requires CURVE keys"):
                next(iter(datahelix.DataLoader(str(profiles), batch_size=2,
                                               coordinator=endpoint, rank=0, world_size=1,
                                               connect_timeout=20)))
        finally:
            if env_keys is not None:
                os.environ["DATAHELIX_KEYS"] = env_keys
        # a secret readable by others is refused before anything connects
        os.chmod(rogue / "evil.secret", 0o644)
        out = subprocess.run([CLI, "server", "--coordinator", endpoint, "--role", "remote",
                              "--node", "x", "--workers", "1", "--keys", str(rogue), "--key",
                              "evil"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "chmod 600" in out.stderr, out.stderr
    finally:
        coord.stop()


def test_keygen_never_overwrites_and_keys_must_be_a_directory(datahelix, tmp_path):
    keygen(tmp_path, "server")
    out = subprocess.run([CLI, "keygen", "-o", str(tmp_path / "server")], capture_output=True,
                         text=True)
    assert out.returncode == 1 and "exists" in out.stderr
    assert oct(os.stat(tmp_path / "server.secret").st_mode & 0o777) == "0o600"
    with pytest.raises(datahelix.InvalidArgumentError, match="not a directory"):
        datahelix.DataLoader(str(tmp_path / "x"), keys=str(tmp_path / "nope"))
