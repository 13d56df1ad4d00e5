"""_C.Cluster, the C library's in-process cluster (include/datahelix/cluster.h,
src/python/cluster.c): started with its coordinator's endpoint and both parts' counters, a
second cluster joining the first's coordinator, close() safe twice, a bad argument named in
its error; and start_cluster's Cluster built on it (docs/runtime.md, "In-process clusters")."""
import socket

import pytest

ARENA = 1 << 22


def test_a_cluster_starts_and_reports_both_parts(datahelix):
    with datahelix._C.Cluster(node="n0", workers=1, arena_bytes=ARENA) as c:
        assert c.endpoint.startswith("tcp://127.0.0.1:") and not c.endpoint.endswith(":*")
        assert c.has_coordinator and c.has_server and not c.closed
        assert c.server_name.startswith("n0-local-")
        assert c.server_endpoint.startswith("tcp://127.0.0.1:")
        c.wait_registered(10000)
        assert c.coordinator_stats()["servers_alive"] == 1
        assert c.server_stats()["tasks"] == 0
        arena = c.server_arena_stats()
        assert arena["size_bytes"] == ARENA and arena["allocations_live"] == 0
    assert c.closed and c.endpoint is None
    c.close()  # twice: safe
    with pytest.raises(RuntimeError, match="closed"):
        c.coordinator_stats()


def test_a_second_cluster_joins_the_first(datahelix):
    first = datahelix._C.Cluster(node="n0", workers=1, arena_bytes=ARENA)
    try:
        second = datahelix._C.Cluster(join=first.endpoint, node="n1", workers=1,
                                      arena_bytes=ARENA)
        assert second.endpoint == first.endpoint
        assert not second.has_coordinator and second.has_server
        second.wait_registered(10000, coordinator=first)
        assert first.coordinator_stats()["servers_alive"] == 2
        with pytest.raises(RuntimeError, match="joined the coordinator"):
            second.coordinator_stats()
        second.close()
        second.close()
    finally:
        first.close()
    first.close()


def test_a_wildcard_bind_advertises_its_endpoint(datahelix):
    """The torchrun job's rank 0 on several nodes: the coordinator binds every interface and
    the server (and endpoint) use the advertised address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    advertise = f"tcp://127.0.0.1:{port}"
    with datahelix._C.Cluster(listen=f"tcp://0.0.0.0:{port}", advertise=advertise, node="n0",
                              workers=1, arena_bytes=ARENA) as c:
        assert c.endpoint == advertise
        c.wait_registered(10000)


def test_a_coordinator_alone(datahelix):
    with datahelix._C.Cluster(listen="tcp://127.0.0.1:*", policy="least-request") as c:
        assert c.has_coordinator and not c.has_server
        assert c.coordinator_stats()["servers_alive"] == 0
        with pytest.raises(RuntimeError, match="no DataServer"):
            c.server_stats()


def test_a_bad_argument_names_itself(datahelix):
    with pytest.raises(datahelix.UnknownNameError) as info:
        datahelix._C.Cluster(policy="fastest")
    assert "policy" in str(info.value) and "fastest" in str(info.value)
    with pytest.raises(datahelix.InvalidArgumentError, match="role"):
        datahelix._C.Cluster(node="n0", role="sidecar")
    with pytest.raises(datahelix.InvalidArgumentError, match="shm_allow_uids"):
        datahelix._C.Cluster(node="n0", workers=1, arena_bytes=ARENA,
                             shm_allow_uids="1000,nobody")
    with pytest.raises(datahelix.InvalidArgumentError, match="node"):
        datahelix._C.Cluster(join="tcp://127.0.0.1:1")
    with pytest.raises(TypeError, match="worker"):
        datahelix._C.Cluster(node="n0", worker=1)
    with pytest.raises(datahelix.DataHelixError, match="tcp://nowhere"):
        datahelix._C.Cluster(listen="tcp://nowhere:1")


def test_start_cluster_keeps_its_api(datahelix):
    cluster = datahelix.start_cluster(workers=1, arena_bytes=ARENA, node="n0")
    try:
        assert cluster.endpoint == cluster.coordinator.endpoint
        assert cluster.server.endpoint.startswith("tcp://127.0.0.1:")
        stats = cluster.stats()
        assert set(stats) == {"coordinator", "server"}
        assert cluster.arena_stats()["size_bytes"] == ARENA
        assert cluster.server.arena_stats() == cluster.arena_stats()
        joined = datahelix.start_cluster(workers=1, arena_bytes=ARENA, node="n1",
                                         coordinator=cluster.endpoint)
        assert joined.coordinator is None and joined.endpoint == cluster.endpoint
        assert set(joined.stats()) == {"server"}
        joined.close()
    finally:
        cluster.close()
    cluster.close()
    assert cluster.coordinator is None and cluster.server is None
