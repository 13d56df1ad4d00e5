"""`datahelix bench --python-dataset MODULE:FACTORY` (tools/cmd_bench.c) and
bench/python_dataset/overhead.py run end to end on a small configuration: the Python dataset
is profiled both ways (estimate_cost, and learned over one pass), every system runs on it in
DataServer worker processes, helix runs again on the learned costs under the same compute
model, and the reports say so. Not a performance test: the numbers are checked for sense
only (docs/benchmarks.md has the measured ones)."""
import json
import os
import re
import subprocess
import sys

from conftest import CLI, ROOT

BENCH = os.path.join(ROOT, "bench", "python_dataset")


def test_bench_python_dataset_compares_learned_and_estimated_costs(tmp_path):
    env = dict(os.environ, DH_PYTHON_EXE=sys.executable, OMP_NUM_THREADS="1")
    r = subprocess.run([CLI, "bench", "--python-dataset", "sleepy:make", "--ranks", "2",
                        "--batch", "2", "--steps", "8", "--warmup", "2", "--local-servers", "1",
                        "--remote-servers", "0", "--cores-per-server", "2",
                        "--systems", "native,helix", "--python-dir", str(tmp_path / "py"),
                        "--json", str(tmp_path / "bench.json")],
                       cwd=BENCH, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "costs learned" in r.stdout and "costs from estimate_cost" in r.stdout
    m = re.search(r"helix on learned costs / helix on estimate_cost: ([0-9.]+)x", r.stdout)
    assert m and float(m.group(1)) > 0, r.stdout
    est = json.load(open(tmp_path / "bench.json"))
    learned = json.load(open(tmp_path / "bench.learned.json"))
    assert set(est["systems"]) == {"native", "helix"} and set(learned["systems"]) == {"helix"}
    for rep in (est, learned):
        for s in rep["systems"].values():
            assert s["throughput_sps"] > 0
    with open(tmp_path / "py" / "learned" / "costs.jsonl") as f:
        assert sum(1 for _ in f) == 1024
    with open(tmp_path / "py" / "estimate" / "pipeline.json") as f:
        assert json.load(f)["dataset"] == "sleepy:make"
    bad = subprocess.run([CLI, "bench", "--python-dataset", "sleepy:make", "--dataset", "x"],
                         cwd=BENCH, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "give one of" in bad.stderr


def test_overhead_bench_runs_both_loaders(tmp_path):
    out = tmp_path / "overhead.json"
    r = subprocess.run([sys.executable, os.path.join(BENCH, "overhead.py"), "--runs", "1",
                        "--batches", "6", "--batch", "4", "--json", str(out)],
                       env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.load(open(out))
    assert rep["median_samples_per_s"]["torch"] > 0 and rep["median_samples_per_s"]["datahelix"] > 0
    assert "datahelix / torch" in r.stdout
