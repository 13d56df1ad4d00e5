"""Tier 2 across nodes with CURVE on (issue 33, point 5; docs/security.md, "What travels
where"): node-0 runs the coordinator, a local DataServer and rank 0, node-1 a local
DataServer and rank 1, all with one key directory; the DataServers run pydatasets.Pattern
(images made of a 16-byte pattern), and a sort_fn swaps every part between the ranks, so
every sample crosses the link between the nodes in a tier-2 move. A raw socket in the hub
namespace keeps every frame that crosses node-1's link.

- forward (the default): the moves go DataServer to DataServer over CURVE: no frame holds
  the pattern, a ZMTP greeting names CURVE, and each rank yields every image intact.
- process_group with allow_unencrypted_exchange=True (the control: the check can fail): the
  moves go over gloo in plaintext, and the capture holds the pattern; the opt-in warned."""
import json
import os
import struct
import subprocess
import sys

import pytest

from conftest import CLI, ROOT
from netns import log_has, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
PATTERN = b"PIXELS-PIXELS-PX"  # tests/python/pydatasets.py
SAMPLES = 48  # tier2_rank.py's Pattern(n=48): 4096 bytes an image


def frames(path):
    with open(path, "rb") as f:
        data = f.read()
    out, at = [], 0
    while at + 4 <= len(data):
        (n,) = struct.unpack_from("<I", data, at)
        out.append(data[at + 4:at + 4 + n])
        at += 4 + n
    return out


@pytest.mark.parametrize("mode", ["forward", "process_group"])
def test_tier2_across_nodes_with_curve_sends_no_pixel_in_plaintext(net3, tmp_path, mode):
    net = net3
    keys = tmp_path / "keys"
    keys.mkdir()
    subprocess.run([CLI, "keygen", "-o", str(keys / "server")], check=True, capture_output=True)
    py = os.environ.get("DH_PYTHON_PATH") or os.path.join(ROOT, "build", "python")
    env = ["env", f"PYTHONPATH={os.path.join(ROOT, 'tests', 'python')}{os.pathsep}{py}",
           f"DH_PYTHON_EXE={sys.executable}", "OMP_NUM_THREADS=1", "GLOO_SOCKET_IFNAME=eth0"]
    capture_file = str(tmp_path / "link.bin")
    capture = subprocess.Popen(["ip", "netns", "exec", net.hub, sys.executable,
                                os.path.join(HERE, "capture.py"), net.port(1), capture_file],
                               stdout=open(tmp_path / "capture.log", "w"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    net.procs.append(capture)
    wait_for(lambda: log_has(str(tmp_path / "capture.log"), "capturing"), "the capture",
             log=str(tmp_path / "capture.log"))
    endpoint = f"tcp://{net.addr(0)}:5555"
    coord = net.popen(0, [CLI, "coordinator", "--listen", "tcp://0.0.0.0:5555", "--keys",
                          str(keys)], str(tmp_path / "coordinator.log"))
    wait_for(lambda: log_has(coord.log, "listening on"), "the coordinator", log=coord.log)
    servers = []
    for i in range(2):
        servers.append(net.popen(i, env + [
            CLI, "server", "--coordinator", endpoint, "--role", "local", "--node", f"node-{i}",
            "--workers", "1", "--dataset", "pydatasets:make_pattern", "--name", f"local-{i}",
            "--arena-mb", "64", "--heartbeat-ms", "50", "--listen", "tcp://0.0.0.0:*",
            "--keys", str(keys)], str(tmp_path / f"local-{i}.log")))
    for i in range(2):
        wait_for(lambda: log_has(coord.log, f"DataServer 'local-{i}' registered"),
                 f"local-{i} to register", log=coord.log)
    ranks = [net.popen(r, env + [sys.executable, os.path.join(HERE, "tier2_rank.py"), endpoint,
                                 str(keys), str(r), str(tmp_path / f"rank-{r}.json"), mode,
                                 f"{net.addr(0)}:29500"], str(tmp_path / f"rank-{r}.log"))
             for r in range(2)]
    for r, p in enumerate(ranks):
        try:
            rc = p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"rank {r} did not finish:\n" + open(p.log).read()[-4000:])
        assert rc == 0, f"rank {r} exit {rc}:\n" + open(p.log).read()[-4000:]
    for p in servers + [coord]:
        p.send_signal(2)
    for p in servers + [coord]:
        p.wait(timeout=20)
    capture.terminate()
    capture.wait(timeout=10)

    res = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert sorted(res[0]["got"] + res[1]["got"]) == list(range(SAMPLES))
    for r in range(2):
        st = res[r]["stats"]
        assert res[r]["wrong"] == 0, f"rank {r}: {res[r]['wrong']} images not intact"
        assert st["rebalance_applied"] > 0 and st["rebalance_bytes_remote"] > 0, st
        assert st["rebalance_callback_errors"] == 0, st
        assert (st["rebalance_exchanges"] > 0) == (mode == "process_group"), st
        said = [w for w in res[r]["warnings"] if "allow_unencrypted_exchange" in w]
        assert len(said) == (1 if mode == "process_group" else 0), res[r]["warnings"]
    link = frames(capture_file)
    wire = sum(len(f) for f in link)
    plain = sum(f.count(PATTERN) for f in link)
    print(f"{mode}: {len(link)} frames, {wire} bytes across node-1's link, {plain} patterns "
          f"in plaintext; rebalance bytes across nodes "
          f"{[x['stats']['rebalance_bytes_remote'] for x in res]}")
    assert wire > SAMPLES * 4096, f"the link carried {wire} bytes: the moves went elsewhere"
    if mode == "forward":
        assert not any(PATTERN[:8] in f for f in link), "pixel bytes crossed in plaintext"
        assert any(b"CURVE" in f for f in link)  # the ZMTP greeting names the mechanism
    else:
        # the control: gloo carries the moved parts in plaintext, so the check can fail
        assert plain >= SAMPLES * 256 // 2, plain
