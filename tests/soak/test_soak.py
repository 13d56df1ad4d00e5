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
