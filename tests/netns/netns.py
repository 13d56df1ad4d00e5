"""A small cluster of real network stacks for the multi-node tests (issue 16; docs/multinode.md,
"Testing across machines"): one network namespace per node, each with an eth0 veth'd to a
bridge in a hub namespace, per-link bandwidth shaped with `tc tbf` both ways, links taken
down and up. Processes run inside a node's namespace with `ip netns exec`. Only the
namespaces and addresses made here are used; everything is torn down by close(), also when
a test fails (the fixture's finalizer) or the interpreter exits.

Latency is not shaped (this kernel has no netem); loss is replaced by links taken down."""
import atexit
import itertools
import os
import random
import signal
import subprocess
import time

_counter = itertools.count()
_live = []


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def tc(*args, check=True):
    return subprocess.run(["tc", *args], check=check, capture_output=True, text=True)


def unavailable():
    """Why namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"{tool} (iproute2) is not installed"
    name = f"dhprobe{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot make a network namespace: {r.stderr.strip()}"
    ok = subprocess.run(["ip", "-n", name, "link", "add", "probe0", "type", "veth", "peer",
                         "name", "probe1"], capture_output=True, text=True)
    q = subprocess.run(["tc", "-n", name, "qdisc", "add", "dev", "probe0", "root", "tbf",
                        "rate", "10mbit", "burst", "32kb", "latency", "100ms"],
                       capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if ok.returncode != 0:
        return f"cannot make a veth pair: {ok.stderr.strip()}"
    if q.returncode != 0:
        return f"tc tbf does not work here: {q.stderr.strip()}"
    return None


class Net:
    """Nodes 0..n-1 on 10.X.Y.0/24 (node i at .i+1), each with its link to the bridge."""

    def __init__(self, n, mbit=200):
        k = next(_counter)
        self.tag = f"dh{os.getpid() % 10000}{k}"
        self.prefix = f"10.{random.randint(64, 250)}.{random.randint(1, 250)}"
        self.hub = f"{self.tag}h"
        self.nodes = [f"{self.tag}n{i}" for i in range(n)]
        self.procs = []
        self.mbit = [mbit] * n
        _live.append(self)
        ip("netns", "add", self.hub)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.nodes):
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("link", "add", self.port(i), "netns", self.hub, "type", "veth", "peer", "name",
               "eth0", "netns", ns)
            ip("-n", self.hub, "link", "set", self.port(i), "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            self.shape(i, mbit)

    def port(self, i):
        return f"{self.tag}v{i}"

    def addr(self, i):
        return f"{self.prefix}.{i + 1}"

    def shape(self, i, mbit):
        """Node i's link at `mbit` megabits per second, each way (tc tbf on both ends)."""
        self.mbit[i] = mbit
        # ~10 ms of the rate, in kbytes, and at least 128 KiB: a veth hands tbf GSO packets
        # of up to 64 KiB, and a packet larger than the bucket never leaves (the link
        # stalls for good, with no drop counted)
        burst = max(128, int(mbit * 1000 / 8 / 100))
        for where in (["-n", self.nodes[i], "qdisc", "replace", "dev", "eth0"],
                      ["-n", self.hub, "qdisc", "replace", "dev", self.port(i)]):
            tc(*where, "root", "tbf", "rate", f"{mbit}mbit", "burst", f"{burst}kb",
               "latency", "500ms")

    def link(self, i, up):
        """Node i's link up or down (the bridge's end: nothing passes either way)."""
        ip("-n", self.hub, "link", "set", self.port(i), "up" if up else "down")

    def popen(self, i, argv, log):
        """argv run in node i's namespace, its output to the file `log`."""
        out = open(log, "w")
        p = subprocess.Popen(["ip", "netns", "exec", self.nodes[i], *argv], stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
        p.log = log
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
        for ns in self.nodes + [self.hub]:
            ip("netns", "del", ns, check=False)
        if self in _live:
            _live.remove(self)


@atexit.register
def _close_all():
    for net in list(_live):
        net.close()


def wait_for(cond, what, timeout=30.0, log=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    extra = ""
    if log and os.path.exists(log):
        extra = "\n--- " + log + " ---\n" + open(log).read()[-4000:]
    raise AssertionError(f"timed out waiting for {what}{extra}")


def log_has(path, needle, times=1):
    try:
        with open(path) as f:
            return f.read().count(needle) >= times
    except OSError:
        return False
