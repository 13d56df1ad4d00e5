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


def test_large_frames_stay_within_the_memory_budgets(tmp_path):
    """720p portrait and landscape clips (22 MB a decoded sample, 83 MB a padded batch of one
    of each) on 48 workers: every system finishes, the tasks' heap stays within
    DH_OUTPUT_BUDGET (200 MiB) and the process within the arenas (DH_ARENA_BUDGET, 1 GiB for
    the process's local DataServers together) plus that budget plus what is not charged
    (decoders, copies a rank holds): 1.7-2.2 GB measured here, 7 GB without the two
    budgets, whose defaults are a quarter of memory each."""
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps([
        {"frames": 8, "height": 1280, "width": 720, "duration_s": 0.5, "fps": 24, "weight": 1},
        {"frames": 8, "height": 720, "width": 1280, "duration_s": 0.5, "fps": 24, "weight": 1}]))
    clips, src = tmp_path / "clips", tmp_path / "set"
    src.mkdir()
    subprocess.run([CLI, "synth", "-o", str(clips), "-m", str(mix), "-n", "12", "-s", "3"],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([CLI, "probe", str(clips / "manifest.jsonl"), "-o", str(src / "profiles.jsonl"),
                    "--calibration", str(tmp_path / "calibration.json")],
                   check=True, capture_output=True, timeout=120)
    rows = [json.loads(l) for l in (src / "profiles.jsonl").read_text().splitlines()]
    assert len(rows) >= 8 and max(r["out_bytes"] for r in rows) > 20e6, rows
    out = tmp_path / "bench.json"
    r = subprocess.run([CLI, "bench", "--dataset", str(src), "--ranks", "2", "--batch", "2",
                        "--steps", "2", "--warmup", "1", "--local-servers", "2",
                        "--remote-servers", "4", "--cores-per-server", "8", "--systems",
                        "pool,helix", "--json", str(out)],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, OMP_NUM_THREADS="1", DH_OUTPUT_BUDGET="200M",
                                DH_ARENA_BUDGET="1G"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(out.read_text())
    for name, s in rep["systems"].items():
        assert s["throughput_sps"] > 0, (name, s)
        assert s["task_budget_mb"] == 200, (name, s)
        assert 0 < s["task_heap_peak_mb"] <= 200, (name, s)
        assert 0 < s["peak_pss_mb"] < 1024 + 200 + 1536, (name, s)
