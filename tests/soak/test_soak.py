"""The soaks in `make test` (`make soak` runs them for 30 minutes each):
- the 2-minute chaos soak (tests/soak/soak.py): kill -9, SIGSTOP/SIGCONT and restarts of
  DataServers, sidecars and the coordinator at seeded random times during a 4-rank run with
  corrupt samples; every ledger checked;
- the 40-second memory soak (tests/soak/memsoak.py): epochs of a trainer reading natively
  decoded video and a Python Dataset through processes on loopback; every process's RSS and
  PSS per epoch, its private RSS after the warm-up bounded (16 MiB)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_two_minute_chaos_soak(tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, os.path.join(HERE, "soak.py"), "--seconds",
                        os.environ.get("DH_SOAK_SECONDS", "120"), "--seed",
                        os.environ.get("DH_SOAK_SEED", "7"), "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
    report = json.loads(out.read_text()) if out.exists() else {}
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert not report["failures"]
    assert report["faults"] >= 10, report
    print(json.dumps(report))


def test_memory_of_every_process_stays_flat_over_epochs(tmp_path):
    out = tmp_path / "memsoak.json"
    r = subprocess.run([sys.executable, os.path.join(HERE, "memsoak.py"), "--seconds",
                        os.environ.get("DH_MEMSOAK_SECONDS", "40"), "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text()) if out.exists() else {}
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-4000:]
    assert not report["failures"]
    # every process of the run was measured: the trainer, 2 coordinators, 4 DataServers and
    # the sidecar's 2 Python worker processes
    assert len(report["growth"]) == 9, report["growth"]
    assert report["epochs"] >= 8, report
    print(r.stdout[-6000:])


def test_memsoak_record_of_the_trainer_costs_little_per_epoch():
    """The trainer measures itself, so what memsoak.py keeps of the run adds to the trainer's
    RSS: kept as a list of (epoch, dict) pairs it cost ~390 bytes per process and epoch
    (~3.5 KiB an epoch for 9 processes), the whole 'linear growth' of the trainer in the
    first 30-minute run (docs/operations.md, "Memory over time"). The Record keeps 20."""
    import tracemalloc
    sys.path.insert(0, HERE)
    import memsoak
    rec = memsoak.Record()
    names = [f"p{i}" for i in range(9)]

    def epoch(e):
        for k, name in enumerate(names):  # values as /proc gives them: ints above the cache
            rec.add(name, e, {"rss": 250000 + e + k, "anon": 150000 + e, "shmem": 30000 + e,
                              "pss": None if k == 8 else 180000 + e})

    for e in range(1, 101):
        epoch(e)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for e in range(101, 2101):
            epoch(e)
        grew = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per = grew / (2000 * len(names))
    assert per <= 32, f"{per:.0f} bytes per process and epoch"
    rows = rec.rows()
    assert rec.epochs("p0") == 2100 and len(rows["p0"]) == 2100
    assert rows["p3"][9] == (10, {"rss": 250013, "pss": 180010, "anon": 150010,
                                  "shmem": 30010})
    assert rows["p8"][-1][1]["pss"] is None
