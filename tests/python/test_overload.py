"""Overload (issue 17): real decode with many more workers than cores (48 decode workers on
this machine's 2, as `bench --dataset` with a paper-scale layout) completes, or fails with a
clear error, within 60 s; never hangs. The bench says it oversubscribes and reports its peak
memory. The DataServers' task memory stays within its budget (DH_OUTPUT_BUDGET, here 32 MiB,
a few tasks' decoded samples and batches): 48 workers each holding a task at once would take
several times that (docs/runtime.md, "Memory")."""
import json
import os
import subprocess

from conftest import CLI


def test_oversubscribed_real_decode_finishes_and_says_so(dataset, tmp_path):
    src, _ = dataset
    out = tmp_path / "bench.json"
    r = subprocess.run([CLI, "bench", "--dataset", src, "--ranks", "2", "--batch", "2",
                        "--steps", "2", "--warmup", "1", "--local-servers", "2",
                        "--remote-servers", "4", "--cores-per-server", "8", "--systems",
                        "pool,helix", "--json", str(out)],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, OMP_NUM_THREADS="1", DH_OUTPUT_BUDGET="32M"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    if (os.cpu_count() or 1) * 4 < 48:
        assert "real decode oversubscribes the CPUs" in r.stderr, r.stderr[-3000:]
    rep = json.loads(out.read_text())
    for name, s in rep["systems"].items():
        assert s["throughput_sps"] > 0 and s["peak_rss_mb"] > 0, (name, s)
        assert s["peak_pss_mb"] > 0, (name, s)
        assert s["task_budget_mb"] == 32, (name, s)
        assert 0 < s["task_heap_peak_mb"] <= 32, (name, s)
