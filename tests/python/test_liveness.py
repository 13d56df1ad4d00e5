"""Liveness that a busy machine cannot fake (docs/runtime.md, "Liveness"), with real processes:
a `datahelix coordinator`, two `datahelix server` processes (a local DataServer and a remote
sidecar, 2 workers each, the synthetic pipeline) and a DataLoader in this process, each on
its own loopback endpoint, all with the DEFAULT liveness settings (no --dead-after-ms, no
--heartbeat-ms). Busy-loop processes, 4 x the CPUs at normal priority,
saturate the machine from before the servers start until the epoch's last batch. Then:
  (a) no server was declared dead (the coordinator's
      datahelix_coordinator_servers_declared_dead_total, and its log);
  (b) nothing ran twice: the coordinator placed no request again (redispatches 0), the
      loader dropped no duplicate, and the servers executed each sample once (their
      samples_total add up to the epoch);
  (c) the epoch completed with every sample, each index once.
And with the same processes, no load: the coordinator stopped (SIGSTOP) for 4 x its limit in
the middle of an epoch declares no server dead when it resumes (it does not count its own
absence as their silence), while a server stopped itself still is
(test_stopped_coordinator_declares_no_server_dead).

Size: 320 samples (gen-profiles kinetics-mixed) whose work is a sleep of 0.1 x their profiled
CPU seconds (the synthetic pipeline's "sleep" cost, in C workers: the epoch's length hardly
depends on how much CPU the niced workers get), on 2 servers x 2 workers: 5 s idle, 7-30 s
under the load on a 2-CPU machine (depending on what else runs there), i.e. 70-300
heartbeat periods per server: past the 32 gaps after which the coordinator's limit follows
each server's p99, and several times the default 1 s limit. The load is 4 x the CPUs: at
16 x the epoch took 94 s, too long for the suite (DH_TEST_BUSY_PER_CPU=16 runs it so). A
larger epoch would only make the test slower; a shorter one would end before the limits
were learned.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import CLI, torchrun_port

prometheus_parser = pytest.importorskip("prometheus_client.parser")

# busy loops per CPU (DH_TEST_BUSY_PER_CPU=0: none, 16: the heavier load of the docs)
BUSY_PER_CPU = int(os.environ.get("DH_TEST_BUSY_PER_CPU", "4"))
SAMPLES, BATCH = 320, 8
PIPELINE = '{"type": "synthetic", "cost": "sleep", "cpu_scale": 0.1, "bytes_scale": 0.01}'
BUSY_MAX_S = 120  # a busy loop ends by itself after this, should this test be killed


def wait_for(cond, what, procs=(), timeout=30.0):
    """Polls cond() until true; fails at once if one of procs exited (its log says why)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: {p.args[:2]} exited with {p.returncode}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read_port(path):
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    return int(text) if text.endswith("\n") else None


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}


def value(families, sample, **labels):
    found = [s for f in families.values() for s in f.samples if s.name == sample and
             all(s.labels.get(k) == v for k, v in labels.items())]
    assert found, f"no sample {sample} {labels}"
    return sum(s.value for s in found)


def gap_buckets(coord):
    """The heartbeat gap histogram as 'le: count' (cumulative), for the failure message."""
    return ", ".join(f"{s.labels['le']}: {s.value:.0f}"
                     for s in coord["datahelix_coordinator_heartbeat_gap_seconds"].samples
                     if s.name.endswith("_bucket"))


def saturate():
    """BUSY_PER_CPU x the CPUs this process may run on of busy-loop processes, at normal
    priority."""
    n = BUSY_PER_CPU * len(os.sched_getaffinity(0))
    code = ("import time\nend = time.monotonic() + %d\nwhile time.monotonic() < end:\n"
            "    pass\n" % BUSY_MAX_S)
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def with_logs(tmp_path, run, *args):
    """run(*args); a failure's message carries the daemons' logs (they say what they saw)."""
    try:
        run(*args)
    except AssertionError as e:
        logs = "".join(f"\n--- {p.name}:\n{p.read_text()[-4000:]}"
                       for p in sorted(tmp_path.glob("*.log")))
        raise AssertionError(f"{e}{logs}") from e


def test_saturated_cpu_declares_no_server_dead(datahelix, tmp_path):
    with_logs(tmp_path, run_saturated_epoch, datahelix, tmp_path)


def start_daemons(tmp_path, coordinator_args=()):
    """`datahelix coordinator` and two `datahelix server` processes (a local DataServer on n1
    and a remote sidecar on n2, 2 workers each, the synthetic pipeline), each with its
    metrics on a port of its own; returns (endpoint, procs, port of each, their log files).
    The caller ends the processes and closes the logs (stop_daemons)."""
    pipeline = tmp_path / "synthetic.json"
    pipeline.write_text(PIPELINE)
    endpoint = f"tcp://127.0.0.1:{torchrun_port()}"
    ports = {k: tmp_path / f"{k}.port" for k in ("coordinator", "local", "sidecar")}
    metrics = ["--metrics-listen", "127.0.0.1:0", "--metrics-port-file"]
    logs = {k: open(tmp_path / f"{k}.log", "w") for k in ports}
    procs = []
    procs.append(subprocess.Popen([CLI, "coordinator", "--listen", endpoint] +
                                  list(coordinator_args) + metrics + [str(ports["coordinator"])],
                                  stderr=logs["coordinator"]))
    for key, role, node in (("local", "local", "n1"), ("sidecar", "remote", "n2")):
        procs.append(subprocess.Popen(
            [CLI, "server", "--coordinator", endpoint, "--role", role, "--node", node,
             "--workers", "2", "--name", f"{node}-{key}", "--pipeline", str(pipeline)] +
            metrics + [str(ports[key])], stderr=logs[key]))
    port = {k: wait_for(lambda p=p: read_port(p), f"{k}'s metrics port file", procs)
            for k, p in ports.items()}
    wait_for(lambda: value(scrape(port["coordinator"]),
                           "datahelix_coordinator_servers_alive") == 2,
             "both DataServers registered", procs)
    return endpoint, procs, port, logs


def stop_daemons(procs, logs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)  # a stopped one must be running to end
            p.terminate()
    for p in procs:
        p.wait(timeout=30)
    for f in logs.values():
        f.close()


def make_profiles(tmp_path):
    profiles = tmp_path / "profiles.jsonl"
    subprocess.run([CLI, "gen-profiles", "--mix", "kinetics-mixed", "--count", str(SAMPLES),
                    "--seed", "7", "-o", str(profiles)], check=True, capture_output=True)
    return profiles


def run_saturated_epoch(datahelix, tmp_path):
    profiles = make_profiles(tmp_path)
    busy, procs, logs = [], [], {}
    try:
        # saturated from before the servers start: their registration and the coordinator's
        # first verdicts on them (before it has learned their jitter) happen under load too
        busy.extend(saturate())
        # default liveness: neither --dead-after-ms nor --heartbeat-ms
        endpoint, procs, port, logs = start_daemons(tmp_path)
        n = SAMPLES
        seen = []
        start = time.monotonic()
        with datahelix.DataLoader(str(profiles), batch_size=BATCH, coordinator=endpoint,
                                  rank=0, world_size=1, node="n1", timeout=60) as dl:
            for batch in dl:
                seen.extend(batch["sample_ids"])
            client = dl.stats()
        epoch_s = time.monotonic() - start
        # the coordinator's book of the last batches, still under load
        coord = wait_for(lambda: (lambda c: c if value(
            c, "datahelix_coordinator_delivered_total") >= n // BATCH else None)(
                scrape(port["coordinator"])), "the coordinator's reports", procs)
        for p in busy:
            p.kill()
        local, sidecar = scrape(port["local"]), scrape(port["sidecar"])
        for p in procs:
            assert p.poll() is None, f"{p.args[:2]} exited with {p.returncode}"
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()
        stop_daemons(procs, logs)

    print(f"epoch of {n} samples under {len(busy)} busy loops: {epoch_s:.1f} s; samples "
          f"executed: local {value(local, 'datahelix_dataserver_samples_total'):.0f}, sidecar "
          f"{value(sidecar, 'datahelix_dataserver_samples_total'):.0f}; heartbeat gaps (s, "
          f"cumulative): {gap_buckets(coord)}")
    # (a) no server declared dead
    dead = value(coord, "datahelix_coordinator_servers_declared_dead_total")
    assert dead == 0, f"{dead:.0f} servers declared dead; heartbeat gaps {gap_buckets(coord)}"
    assert "declared dead" not in (tmp_path / "coordinator.log").read_text()
    assert value(coord, "datahelix_coordinator_servers_alive") == 2
    # (b) nothing ran twice
    assert value(coord, "datahelix_coordinator_redispatches_total") == 0
    assert client["duplicates_dropped"] == 0
    executed = (value(local, "datahelix_dataserver_samples_total") +
                value(sidecar, "datahelix_dataserver_samples_total"))
    assert executed == n, f"{executed:.0f} samples executed for an epoch of {n}"
    # (c) the epoch completed with every sample, once
    ids = [json.loads(line)["id"] for line in profiles.read_text().splitlines() if line.strip()]
    assert len(ids) == n and sorted(seen) == sorted(ids)
    assert client["samples"] == n and client["samples_failed"] == 0



STOP_S = 4.0  # the coordinator's SIGSTOP: 4 x the default 1 s limit (a deliberate interval)
VERDICT_MAX_S = 15.0  # a stopped server's verdict: within the 10 s cap, and slack for load


def test_stopped_coordinator_declares_no_server_dead(datahelix, tmp_path):
    """The coordinator judges silence only over time it was running to hear it
    (docs/runtime.md, "Liveness"): the `datahelix coordinator` process is stopped (SIGSTOP)
    for 4 x its default 1 s limit in the middle of an epoch while both servers run and
    heartbeat; after SIGCONT no server is declared dead and nothing runs twice. Control: a
    server really stopped is still declared dead (within the limit's cap) and taken back once
    it resumes."""
    with_logs(tmp_path, run_stopped_coordinator, datahelix, tmp_path)


def run_stopped_coordinator(datahelix, tmp_path):
    profiles = make_profiles(tmp_path)
    procs, logs = [], {}
    try:
        endpoint, procs, port, logs = start_daemons(tmp_path)
        coordinator, sidecar = procs[0], procs[2]
        n, seen, stopped_s = SAMPLES, [], None
        with datahelix.DataLoader(str(profiles), batch_size=BATCH, coordinator=endpoint,
                                  rank=0, world_size=1, node="n1", timeout=60) as dl:
            for batch in dl:
                seen.extend(batch["sample_ids"])
                if stopped_s is None and len(seen) >= n // 4:
                    # mid-epoch: the loader's prefetched requests are on both servers
                    t0 = time.monotonic()
                    coordinator.send_signal(signal.SIGSTOP)
                    time.sleep(STOP_S)
                    coordinator.send_signal(signal.SIGCONT)
                    stopped_s = time.monotonic() - t0
            client = dl.stats()
        assert stopped_s is not None, "the epoch ended before the coordinator was stopped"
        coord = wait_for(lambda: (lambda c: c if value(
            c, "datahelix_coordinator_delivered_total") >= n // BATCH else None)(
                scrape(port["coordinator"])), "the coordinator's reports", procs)
        local, remote = scrape(port["local"]), scrape(port["sidecar"])
        log = (tmp_path / "coordinator.log").read_text()
        print(f"coordinator stopped for {stopped_s:.1f} s mid-epoch; heartbeat gaps (s, "
              f"cumulative): {gap_buckets(coord)}")
        # no server declared dead, nothing ran twice, every sample once
        dead = value(coord, "datahelix_coordinator_servers_declared_dead_total")
        assert dead == 0, f"{dead:.0f} servers declared dead after the coordinator's stop"
        assert "declared dead" not in log
        assert "did not run for" in log, "the coordinator did not see its own stop"
        assert value(coord, "datahelix_coordinator_redispatches_total") == 0
        assert client["duplicates_dropped"] == 0
        executed = (value(local, "datahelix_dataserver_samples_total") +
                    value(remote, "datahelix_dataserver_samples_total"))
        assert executed == n, f"{executed:.0f} samples executed for an epoch of {n}"
        ids = [json.loads(line)["id"] for line in profiles.read_text().splitlines()
               if line.strip()]
        assert sorted(seen) == sorted(ids)

        # control: a server that is itself stopped is still dead within its limit
        t0 = time.monotonic()
        sidecar.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: value(scrape(port["coordinator"]),
                                   "datahelix_coordinator_servers_declared_dead_total") == 1,
                     "the stopped sidecar declared dead", procs, timeout=VERDICT_MAX_S)
            verdict_s = time.monotonic() - t0
        finally:
            sidecar.send_signal(signal.SIGCONT)
        log = (tmp_path / "coordinator.log").read_text()
        said = re.search(r"'n2-sidecar' \(pid \d+\) declared dead: (silent for \d+ ms "
                         r"\(limit \d+ ms[^)]*\))", log)
        assert said, "no verdict on the sidecar in the coordinator's log"
        print(f"sidecar stopped: declared dead after {verdict_s:.1f} s ({said.group(1)})")
        wait_for(lambda: value(scrape(port["coordinator"]),
                               "datahelix_coordinator_servers_alive") == 2,
                 "the sidecar taken back after SIGCONT", procs)
    finally:
        stop_daemons(procs, logs)
