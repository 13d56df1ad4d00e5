"""Clips and tar shards at https:// URLs (docs/remote.md): nginx, started here with a CA
and server certificate made by the openssl CLI, serves a synth set and its shards; a
manifest of URLs is probed by `datahelix probe` and read by the DataLoader, and every
sample's frames equal those of the local files. DH_CA_BUNDLE trusts the test's CA."""
import json
import os
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest

from conftest import CLI
from test_tar_shards import SPEC, frames_by_id, pack_shards

pytestmark = pytest.mark.skipif(not shutil.which("nginx") or not shutil.which("openssl"),
                                reason="nginx and openssl are test dependencies (make deps)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, limit_s=60):
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, "nginx exited before it listened"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() - t0 < limit_s, f"nginx not listening on {port}"
            time.sleep(0.01)


@pytest.fixture
def https_server(tmp_path):
    """nginx over HTTPS serving tmp_path/www: (www, base URL, CA file)."""
    conf_dir = tmp_path / "nginx"
    www = tmp_path / "www"
    conf_dir.mkdir()
    www.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = dict(cwd=conf_dir, check=True, capture_output=True)
    subprocess.run(["openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt",
                    "-days", "2", "-subj", "/CN=datahelix-test-ca"], **run)
    subprocess.run(["openssl", "req", *ec, "-keyout", "server.key", "-out", "server.csr",
                    "-subj", "/CN=localhost"], **run)
    (conf_dir / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    subprocess.run(["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey",
                    "ca.key", "-CAcreateserial", "-out", "server.crt", "-days", "2",
                    "-extfile", "san.ext"], **run)
    port = free_port()
    d = str(conf_dir)
    (conf_dir / "nginx.conf").write_text(f"""daemon off; master_process off; worker_processes 1;
pid {d}/nginx.pid; error_log {d}/error.log;
events {{ worker_connections 64; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/t1; proxy_temp_path {d}/t2; fastcgi_temp_path {d}/t3;
  uwsgi_temp_path {d}/t4; scgi_temp_path {d}/t5;
  server {{ listen 127.0.0.1:{port} ssl; root {www};
           ssl_certificate {d}/server.crt; ssl_certificate_key {d}/server.key; }}
}}
""")
    proc = subprocess.Popen(["nginx", "-p", d, "-c", f"{d}/nginx.conf", "-e", f"{d}/error.log"])
    try:
        wait_port(port, proc)
        yield www, f"https://127.0.0.1:{port}", str(conf_dir / "ca.crt")
    finally:
        proc.kill()
        proc.wait()


def probe(where, tmp_path, env, out=None):
    """`datahelix probe` of where/manifest.jsonl into out (default where/profiles.jsonl)."""
    out = out or os.path.join(where, "profiles.jsonl")
    r = subprocess.run([CLI, "probe", os.path.join(where, "manifest.jsonl"), "-o", out, "-p",
                        str(tmp_path / "spec.json")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "0 files skipped" in r.stderr, r.stderr
    with open(out) as f:
        return [json.loads(x) for x in f]


def test_url_clips_and_shards_decode_as_local_files(datahelix, dataset, tmp_path, https_server,
                                                    monkeypatch):
    src, ids = dataset
    www, base, ca = https_server
    monkeypatch.setenv("DH_CA_BUNDLE", ca)  # the embedded DataServers read it at first use
    env = dict(os.environ, DH_CALIBRATION_CACHE=str(tmp_path / "calib.json"))
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    with open(os.path.join(src, "manifest.jsonl")) as f:
        entries = [json.loads(line) for line in f if line.strip()]

    # loose clips at URLs
    clips = www / "clips"
    clips.mkdir()
    url_set = tmp_path / "url-clips"
    url_set.mkdir()
    lines = []
    for e in entries:
        shutil.copy(os.path.join(src, e["path"]), clips / os.path.basename(e["path"]))
        lines.append(dict(e, path=f"{base}/clips/{os.path.basename(e['path'])}"))
    (url_set / "manifest.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = probe(str(url_set), tmp_path, env)
    assert all(row["uri"].startswith(base + "/clips/") for row in rows), rows[0]

    # members of shards at URLs
    shard_set = tmp_path / "url-shards"
    shard_set.mkdir()
    members = pack_shards(src, str(www), per_shard=5)
    for m in members:
        m["path"] = f"{base}/{m['path']}"
    (shard_set / "manifest.jsonl").write_text("".join(json.dumps(x) + "\n" for x in members))
    rows = probe(str(shard_set), tmp_path, env)
    sizes = {x["id"]: x["size"] for x in members}
    assert all(0 < row["in_bytes"] <= sizes[row["id"]] for row in rows)

    # the local files, through the same spec (their profiles name the files in `src`)
    loose = tmp_path / "loose"
    loose.mkdir()
    probe(src, tmp_path, env, out=str(loose / "profiles.jsonl"))
    want = frames_by_id(datahelix, str(loose), SPEC)
    for where in (url_set, shard_set):
        got = frames_by_id(datahelix, str(where), SPEC)
        assert sorted(got) == sorted(ids) == sorted(want)
        for sid in ids:
            assert np.array_equal(got[sid], want[sid]), (where, sid)


def test_missing_url_is_skipped_by_probe_naming_url_and_status(dataset, tmp_path, https_server):
    """A manifest line whose URL is missing: probe skips it, and its message names the URL
    (without a presigned query string), the HTTP status and the byte range."""
    src, _ = dataset
    www, base, ca = https_server
    with open(os.path.join(src, "manifest.jsonl")) as f:
        first = json.loads(f.readline())
    shutil.copy(os.path.join(src, first["path"]), www / "good.mp4")
    lines = [dict(first, path=f"{base}/good.mp4"),
             dict(first, id="gone", path=f"{base}/gone.mp4?X-Amz-Signature=s3cr3t")]
    where = tmp_path / "set"
    where.mkdir()
    (where / "manifest.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    env = dict(os.environ, DH_CA_BUNDLE=ca, DH_CALIBRATION_CACHE=str(tmp_path / "calib.json"))
    r = subprocess.run([CLI, "probe", str(where / "manifest.jsonl"), "-o",
                        str(where / "profiles.jsonl"), "-p", str(tmp_path / "spec.json")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "1 files skipped" in r.stderr, r.stderr
    assert f"{base}/gone.mp4?..." in r.stderr and "HTTP 404" in r.stderr, r.stderr
    assert "bytes 0-" in r.stderr and "s3cr3t" not in r.stderr, r.stderr
    rows = [json.loads(x) for x in (where / "profiles.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == [first["id"]]
