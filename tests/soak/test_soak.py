"""The 2-minute chaos soak in `make test` (tests/soak/soak.py; `make soak` runs it for 30
minutes): kill -9, SIGSTOP/SIGCONT and restarts of DataServers, sidecars and the coordinator
at seeded random times during a 4-rank run with corrupt samples; every ledger checked."""
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
