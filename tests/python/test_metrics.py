"""Prometheus metrics (docs/operations.md, "Metrics"): `--metrics-listen` on the coordinator
and the DataServers serves GET /metrics in the text exposition format, which
prometheus_client's parser reads, with every metric listed there, and numbers that moved
with the work a rank pulled through them; the loader's own registry (datahelix.metrics)
renders and serves DataLoader.stats() the same way."""
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import datahelix.metrics  # noqa: F401 (a submodule: datahelix.metrics below)
import pydatasets
from conftest import CLI, ROOT, torchrun_port

prometheus_parser = pytest.importorskip("prometheus_client.parser")


def table_metrics(table):
    """The families a daemon's table (src/runtime/stats_table.h, through _C) says it serves,
    each once (the rows of one labelled family share it)."""
    return list(dict.fromkeys(metric for _, _, metric, _, _, _ in table if metric))


COORDINATOR_METRICS = table_metrics(datahelix._C.Coordinator.metrics_table())
DATASERVER_METRICS = table_metrics(datahelix._C.DataServer.metrics_table())


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
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def read_port(path):
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    return int(text) if text.endswith("\n") else None


def get(port, path="/metrics"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.headers.get("Content-Type"), r.read().decode()


def scrape(port):
    """GET /metrics parsed: {family name: family}. Parsing fails on anything malformed."""
    content_type, text = get(port)
    assert content_type.startswith("text/plain; version=0.0.4"), content_type
    return {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}


def value(families, sample, **labels):
    """The sum of the samples named `sample` (a counter's with its _total, a histogram's
    _count ...) whose labels include `labels`; fails when there is none."""
    found = [s for f in families.values() for s in f.samples if s.name == sample and
             all(s.labels.get(k) == v for k, v in labels.items())]
    assert found, f"no sample {sample} {labels}"
    return sum(s.value for s in found)


def family_names(families):
    names = set()
    for f in families.values():
        names.add(f.name)
        if f.type == "counter":
            names.add(f.name + "_total")
    return names


def test_coordinator_and_dataservers_serve_their_metrics(datahelix, tmp_path):
    try:
        run_cluster_and_check(datahelix, tmp_path)
    except AssertionError as e:  # the daemons' logs say what they saw
        logs = "".join(f"\n--- {p.name}:\n{p.read_text()[-4000:]}"
                       for p in sorted(tmp_path.glob("*.log")))
        raise AssertionError(f"{e}{logs}") from e


def run_cluster_and_check(datahelix, tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, DH_PYTHON_EXE=sys.executable,
               PYTHONPATH=os.pathsep.join([here, os.environ.get("DH_PYTHON_PATH") or
                                           os.path.join(ROOT, "build", "python")]))
    endpoint = f"tcp://127.0.0.1:{torchrun_port()}"
    ports = {k: tmp_path / f"{k}.port" for k in ("coordinator", "local", "sidecar")}
    metrics = ["--metrics-listen", "127.0.0.1:0", "--metrics-port-file"]
    procs = [subprocess.Popen([CLI, "coordinator", "--listen", endpoint, "--dead-after-ms",
                               "10000"] + metrics + [str(ports["coordinator"])],
                              stderr=open(tmp_path / "coordinator.log", "w"))]
    common = [CLI, "server", "--coordinator", endpoint, "--heartbeat-ms", "50"]
    procs.append(subprocess.Popen(common + ["--role", "local", "--node", "n1", "--workers", "0",
                                            "--name", "n1-local"] + metrics +
                                  [str(ports["local"])],
                                  stderr=open(tmp_path / "local.log", "w")))
    procs.append(subprocess.Popen(common + ["--role", "remote", "--node", "n2", "--workers", "2",
                                            "--name", "n2-sidecar",
                                            "--dataset", "pydatasets:make_clips"] + metrics +
                                  [str(ports["sidecar"])],
                                  env=env, stderr=open(tmp_path / "sidecar.log", "w")))
    try:
        port = {k: wait_for(lambda p=p: read_port(p), f"{k}'s metrics port file", procs)
                for k, p in ports.items()}
        assert len(set(port.values())) == 3 and all(port.values())

        # before any work: every metric is there already, at its starting value
        idle = scrape(port["coordinator"])
        assert set(COORDINATOR_METRICS) <= family_names(idle), idle.keys()
        assert value(idle, "datahelix_coordinator_decisions_total", rule="local_meets") == 0

        ds = pydatasets.Clips(n=24)
        with datahelix.DataLoader(dataset=ds, batch_size=3, coordinator=endpoint, rank=0,
                                  world_size=1, node="n1", timeout=60, prefetch=4) as dl:
            it = iter(dl)
            held = [next(it) for _ in range(2)]
            # mid-run: the rank holds batches, so the local DataServer's arena is in use
            local_mid = scrape(port["local"])
            assert value(local_mid, "datahelix_dataserver_arena_used_bytes") > 0
            assert value(local_mid, "datahelix_dataserver_arena_slabs_used") > 0
            assert value(local_mid, "datahelix_dataserver_arena_allocations_live") > 0
            rest = list(it)
            client_stats = dl.stats()
            # stats()'s keys are the client table's rows with a value (C's, in its order)
            assert list(client_stats) == [key for key, kind, *_ in
                                          datahelix._C.Client.metrics_table() if kind != "metric"]
            # the loader's own registry: rendered and served, and parsed the same way
            client_text = datahelix.metrics.render(client_stats, labels={"rank": "0"})
            client = {f.name: f for f in
                      prometheus_parser.text_string_to_metric_families(client_text)}
            with datahelix.metrics.serve_metrics(dl, labels={"rank": "0"}) as server:
                served = scrape(server.port)
                with pytest.raises(urllib.error.HTTPError) as missing:
                    get(server.port, "/nothing")
                assert missing.value.code == 404
        assert len(held) + len(rest) == 8
        assert value(client, "datahelix_client_batches_total", rank="0") == 8
        assert value(client, "datahelix_client_samples_total") == 24
        assert value(client, "datahelix_client_delivered_bytes_total") > 0
        assert "datahelix_client_wait_seconds" in client
        assert value(served, "datahelix_client_batches_total", rank="0") == 8

        # the executors' and deliverers' reports reach the coordinator after the last batch
        def coordinator_done():
            c = scrape(port["coordinator"])
            return c if value(c, "datahelix_coordinator_delivered_total") >= 8 and \
                value(c, "datahelix_coordinator_cpu_prediction_abs_error_seconds_count") >= 8 else None
        coord = wait_for(coordinator_done, "the coordinator's reports", procs)
        local = scrape(port["local"])
        sidecar = scrape(port["sidecar"])
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)

    assert set(COORDINATOR_METRICS) <= family_names(coord)
    decisions = value(coord, "datahelix_coordinator_decisions_total")
    assert decisions >= 8
    assert value(coord, "datahelix_coordinator_dispatches_total") >= 8
    assert value(coord, "datahelix_coordinator_requests_total") == 8
    assert value(coord, "datahelix_coordinator_client_registrations_total") >= 1
    assert value(coord, "datahelix_coordinator_servers_alive") == 2
    assert value(coord, "datahelix_coordinator_servers_declared_dead_total") == 0
    assert value(coord, "datahelix_coordinator_heartbeat_gap_seconds_count") > 0
    assert value(coord, "datahelix_coordinator_server_alive", server="n1-local") == 1
    assert value(coord, "datahelix_coordinator_server_alive", server="n2-sidecar") == 1
    for name in ("datahelix_coordinator_server_queue_depth",
                 "datahelix_coordinator_server_queued_work_seconds",
                 "datahelix_coordinator_server_speed_factor",
                 "datahelix_coordinator_server_silence_seconds"):
        servers = {s.labels["server"] for s in coord[name].samples}
        assert servers == {"n1-local", "n2-sidecar"}, (name, servers)
    assert value(coord, "datahelix_coordinator_server_speed_factor", server="n2-sidecar") > 0
    # a histogram's buckets are cumulative and end in its count
    buckets = [s for s in coord["datahelix_coordinator_cpu_prediction_abs_error_seconds"].samples
               if s.name.endswith("_bucket")]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and buckets[-1].labels["le"] == "+Inf"
    assert counts[-1] == value(coord, "datahelix_coordinator_cpu_prediction_abs_error_seconds_count")

    for fams in (local, sidecar):
        assert set(DATASERVER_METRICS) <= family_names(fams), fams.keys()
    assert value(local, "datahelix_dataserver_info", server="n1-local") == 1
    assert value(sidecar, "datahelix_dataserver_info", server="n2-sidecar") == 1
    # the sidecar executed every sample and forwarded the batches to the local DataServer
    assert value(sidecar, "datahelix_dataserver_tasks_total") == 8
    assert value(sidecar, "datahelix_dataserver_samples_total") == 24
    assert value(sidecar, "datahelix_dataserver_forwarded_batches_total") == 8
    forwarded = value(sidecar, "datahelix_dataserver_forwarded_bytes_total")
    assert forwarded > 0
    assert value(sidecar, "datahelix_dataserver_cross_node_bytes_total") == forwarded
    assert value(sidecar, "datahelix_dataserver_workers") == 2
    assert value(sidecar, "datahelix_dataserver_worker_busy_seconds_total") > 0
    assert 0 <= value(sidecar, "datahelix_dataserver_worker_busy_ratio") <= 1
    assert value(sidecar, "datahelix_dataserver_arena_size_bytes") == 0  # a sidecar has none
    # the local DataServer received those bytes and placed every batch in its arena
    assert value(local, "datahelix_dataserver_received_bytes_total") == forwarded
    assert value(local, "datahelix_dataserver_batches_delivered_total",
                 source="forwarded") == 8
    assert value(local, "datahelix_dataserver_batches_delivered_total",
                 source="own") == 0
    assert value(local, "datahelix_dataserver_tasks_total") == 0
    assert value(local, "datahelix_dataserver_arena_size_bytes") > 0
    assert value(local, "datahelix_dataserver_arena_slabs") > 0
    # Spills (docs/shared-memory.md, "Full arena"): none while the arena has a slab for every
    # tensor the rank can hold and the machine gives the memory. Under memory pressure (other
    # jobs on the machine) they are the designed fallback, not a fault: a default arena is at
    # most half of MemAvailable at the start (5 slabs with 10 MiB left), and a high-water
    # fallocate can fail later. Then each spilled tensor reaches the rank as a copy, and the
    # DataServer's first spill says why: the test allows exactly those two reasons.
    spills = value(local, "datahelix_dataserver_arena_spills_total")
    assert spills == value(client, "datahelix_client_copied_tensors_total")
    if spills:
        log = (tmp_path / "local.log").read_text()
        first = [line for line in log.splitlines() if "first spill" in line]
        assert len(first) == 1, log
        # the test keeps all 8 batches (held + rest) of 4 tensors, each in its own 1 MiB slab
        small = value(local, "datahelix_dataserver_arena_slabs") < 8 * 4
        assert "cannot reserve memory" in first[0] or (small and "arena full" in first[0]), \
            f"{spills} spills through an arena of " \
            f"{value(local, 'datahelix_dataserver_arena_slabs')} slabs: {first[0]}"


def test_metrics_endpoint_answers_only_get_metrics(tmp_path):
    """Another path is 404; a bad --metrics-listen is a usage-level failure naming it."""
    port_file = tmp_path / "port"
    p = subprocess.Popen([CLI, "coordinator", "--listen", "tcp://127.0.0.1:*",
                          "--metrics-listen", "127.0.0.1:0", "--metrics-port-file",
                          str(port_file)], stderr=open(tmp_path / "log", "w"))
    try:
        port = wait_for(lambda: read_port(port_file), "the port file", [p])
        with pytest.raises(urllib.error.HTTPError) as e:
            get(port, "/")
        assert e.value.code == 404
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x",
                                     method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 405
        fams = scrape(port)
        assert value(fams, "datahelix_coordinator_servers_alive") == 0
    finally:
        p.terminate()
        p.wait(timeout=30)
    assert p.returncode == 0
    bad = subprocess.run([CLI, "coordinator", "--listen", "tcp://127.0.0.1:*",
                          "--metrics-listen", "nowhere"], capture_output=True, text=True)
    assert bad.returncode == 1 and "--metrics-listen 'nowhere'" in bad.stderr, bad.stderr
    lonely = subprocess.run([CLI, "server", "--coordinator", "tcp://127.0.0.1:1", "--role",
                             "local", "--node", "x", "--workers", "0", "--metrics-port-file",
                             str(tmp_path / "p2")], capture_output=True, text=True)
    assert lonely.returncode == 2 and "needs --metrics-listen" in lonely.stderr


def test_render_of_client_stats(datahelix):
    text = datahelix.metrics.render({"batches": 3, "wait_s": 0.25, "prefetch_now": 4,
                                     "future_key": 7, "note": "skipped"},
                                    labels={"rank": 'a"b'})
    fams = {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}
    assert fams["datahelix_client_batches"].type == "counter"
    assert fams["datahelix_client_batches"].samples[0].value == 3
    assert fams["datahelix_client_batches"].samples[0].labels == {"rank": 'a"b'}
    assert fams["datahelix_client_wait_seconds"].samples[0].value == 0.25
    assert fams["datahelix_client_prefetch_batches"].type == "gauge"
    assert fams["datahelix_client_future_key"].samples[0].value == 7  # unknown: a gauge
    assert "note" not in text
    assert datahelix.metrics.render({}) == ""


def test_the_client_table_and_writer_are_c_s(datahelix):
    """METRICS is the C table's (src/runtime/stats_table.h); render() is the daemons' writer:
    values in the fewest digits that read back, labels sorted, an unknown key a gauge with a
    valid name, a bad label name a ValueError."""
    table = datahelix._C.Client.metrics_table()
    assert datahelix.metrics.METRICS == {key: (metric, kind, help_text)
                                         for key, _, metric, kind, _, help_text in table if metric}
    assert {"wait_s", "prefetch_now", "rebalance_s_p95", "rebalance_callback_errors",
            "bytes_outstanding"} <= set(datahelix.metrics.METRICS)
    text = datahelix.metrics.render({"wait_s": 0.1, "odd key-é": 2, "copy_bytes": False},
                                    labels={"rank": 3, "job": "j"})
    assert 'datahelix_client_wait_seconds_total{job="j",rank="3"} 0.1\n' in text
    assert 'datahelix_client_odd_key___{job="j",rank="3"} 2\n' in text
    assert 'datahelix_client_copy_bytes_total{job="j",rank="3"} 0\n' in text
    prometheus_parser.text_string_to_metric_families(text)
    with pytest.raises(ValueError):
        datahelix.metrics.render({"batches": 1}, labels={"bad-label": "x"})


def test_the_dashboard_and_the_docs_name_only_metrics_that_exist():
    """docs/grafana/datahelix.json queries, and docs/operations.md lists, the metrics above
    (a renamed metric breaks this test, not a dashboard nobody looks at until an incident)."""
    import json
    import re
    known = set(COORDINATOR_METRICS) | set(DATASERVER_METRICS) | \
        {name for name, _, _ in datahelix.metrics.METRICS.values()}
    with open(os.path.join(ROOT, "docs", "grafana", "datahelix.json")) as f:
        dashboard = json.load(f)
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queried |= set(re.findall(r"datahelix_[a-z_]+", target["expr"]))
    queried = {re.sub(r"_(bucket|count|sum)$", "", n) for n in queried}
    assert queried <= known, queried - known
    assert len(queried) > 30
    with open(os.path.join(ROOT, "docs", "operations.md")) as f:
        doc = f.read()
    doc = doc[doc.index("## Metrics"):]
    for name in set(COORDINATOR_METRICS) | set(DATASERVER_METRICS):
        assert f"`{name}" in doc, f"{name} is not in docs/operations.md, Metrics"
