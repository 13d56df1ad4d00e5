"""Data sets at URLs read by the DataLoader as local ones are (docs/remote.md, docs/datasets.md):
`datahelix.DataLoader("s3://bucket/prefix/manifest.jsonl")` against moto's S3 server with
signatures enforced (tests/remote/s3_server_setup.py turns IAM authentication on), and
`https://host/set/manifest.jsonl` against nginx (test_remote_http's fixture). The manifest's
relative paths join the URL's folder; `datahelix probe` reads the manifest at its URL; the
frames of every sample equal those of the local files; a missing manifest or profile set is
named."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import CLI, ROOT
from test_remote_http import https_server  # noqa: F401 (a fixture)
from test_tar_shards import SPEC, frames_by_id, pack_shards


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def upload_set(src, www):
    """The set's clips under www/clips/ and a manifest of relative paths: www/manifest.jsonl."""
    os.makedirs(os.path.join(www, "clips"), exist_ok=True)
    lines = []
    with open(os.path.join(src, "manifest.jsonl")) as f:
        for line in f:
            if line.strip():
                e = json.loads(line)
                name = os.path.basename(e["path"])
                shutil.copy(os.path.join(src, e["path"]), os.path.join(www, "clips", name))
                lines.append(json.dumps(dict(e, path=f"clips/{name}")) + "\n")
    with open(os.path.join(www, "manifest.jsonl"), "w") as f:
        f.write("".join(lines))


def probe_url(manifest_url, out, tmp_path, env):
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    r = subprocess.run([CLI, "probe", manifest_url, "-o", str(out), "-p",
                        str(tmp_path / "spec.json")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "0 files skipped" in r.stderr, r.stderr
    rows = [json.loads(x) for x in open(out)]
    return rows


@pytest.fixture
def moto(tmp_path):
    """moto's S3 server with a bucket dh-test and signatures enforced: (endpoint, key, secret)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "moto.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while True:
            assert proc.poll() is None, (tmp_path / "moto.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() - t0 < 120, "moto did not listen"
                time.sleep(0.05)
        keys = tmp_path / "keys"
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "remote",
                                                     "s3_server_setup.py"), endpoint, str(keys)],
                       check=True, capture_output=True)
        key, secret = keys.read_text().split()
        yield endpoint, key, secret
    finally:
        proc.kill()
        proc.wait()
        log.close()


def test_s3_manifest_reads_as_the_local_set(datahelix, dataset, tmp_path, moto, monkeypatch):
    import boto3
    src, ids = dataset
    endpoint, key, secret = moto
    # the S3 settings as AWS tools take them; read at this process's first s3:// request
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    www = tmp_path / "www"
    upload_set(src, str(www))
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=key, aws_secret_access_key=secret)
    for root, _, files in os.walk(www):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), www)
            s3.upload_file(os.path.join(root, name), "dh-test", f"set/{rel}")
    env = dict(os.environ, DH_CALIBRATION_CACHE=str(tmp_path / "calib.json"))

    # no profile set next to the manifest yet: named, with how to make it
    with pytest.raises(datahelix.NotFoundError, match="s3://dh-test/set/profiles.jsonl: no "
                                                      "profile set; make it with `datahelix probe"):
        datahelix.DataLoader("s3://dh-test/set/manifest.jsonl", pipeline=SPEC, batch_size=2)

    # probed at its URL: the relative paths are joined to the manifest's folder
    rows = probe_url("s3://dh-test/set/manifest.jsonl", tmp_path / "profiles.jsonl", tmp_path,
                     env)
    assert all(row["uri"].startswith("s3://dh-test/set/clips/") for row in rows), rows[0]
    s3.upload_file(str(tmp_path / "profiles.jsonl"), "dh-test", "set/profiles.jsonl")

    loose = tmp_path / "loose"
    loose.mkdir()
    r = subprocess.run([CLI, "probe", os.path.join(src, "manifest.jsonl"), "-o",
                        str(loose / "profiles.jsonl"), "-p", str(tmp_path / "spec.json")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    want = frames_by_id(datahelix, str(loose), SPEC)
    got = frames_by_id(datahelix, "s3://dh-test/set/manifest.jsonl", SPEC)
    assert sorted(got) == sorted(ids) == sorted(want)
    for sid in ids:
        assert np.array_equal(got[sid], want[sid]), sid
    # captions come from the manifest at the URL
    with datahelix.DataLoader("s3://dh-test/set/manifest.jsonl", pipeline=SPEC, batch_size=2,
                              shuffle=False, workers=1, arena_bytes=64 << 20, timeout=60) as dl:
        b = next(iter(dl))
    with open(os.path.join(src, "manifest.jsonl")) as f:
        captions = {e["id"]: e.get("caption", "") for e in map(json.loads, f) if e}
    assert b["captions"] == [captions[i] for i in b["sample_ids"]]
    assert any(b["captions"])

    with pytest.raises(datahelix.NotFoundError, match="s3://dh-test/nope/manifest.jsonl: HTTP 404"):
        datahelix.DataLoader("s3://dh-test/nope/manifest.jsonl", pipeline=SPEC, batch_size=2)


def test_https_manifest_reads_as_the_local_set(datahelix, dataset, tmp_path,
                                               https_server, monkeypatch):  # noqa: F811
    src, ids = dataset
    www, base, ca = https_server
    monkeypatch.setenv("DH_CA_BUNDLE", ca)
    env = dict(os.environ, DH_CALIBRATION_CACHE=str(tmp_path / "calib.json"))
    upload_set(src, str(www / "set"))
    rows = probe_url(f"{base}/set/manifest.jsonl", www / "set" / "profiles.jsonl", tmp_path, env)
    assert all(row["uri"].startswith(f"{base}/set/clips/") for row in rows), rows[0]
    loose = tmp_path / "loose"
    loose.mkdir()
    r = subprocess.run([CLI, "probe", os.path.join(src, "manifest.jsonl"), "-o",
                        str(loose / "profiles.jsonl"), "-p", str(tmp_path / "spec.json")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    want = frames_by_id(datahelix, str(loose), SPEC)
    got = frames_by_id(datahelix, f"{base}/set/manifest.jsonl", SPEC)
    assert sorted(got) == sorted(ids)
    for sid in ids:
        assert np.array_equal(got[sid], want[sid]), sid


def test_https_shards_by_brace_pattern(dataset, tmp_path, https_server):  # noqa: F811
    """`manifest --from-tar 'https://host/shard-{000..002}.tar'`: the tar headers read by range
    requests give tarfile's own offsets, each path the shard's URL."""
    src, ids = dataset
    www, base, ca = https_server
    members = pack_shards(src, str(www), per_shard=5)
    out = tmp_path / "m.jsonl"
    env = dict(os.environ, DH_CA_BUNDLE=ca)
    r = subprocess.run([CLI, "manifest", "--from-tar", f"{base}/shard-{{000..002}}.tar", "-o",
                        str(out)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(g["path"], g["offset"], g["size"], g["caption"]) for g in got] == \
        [(f"{base}/{m['path']}", m["offset"], m["size"], m["caption"]) for m in members]
    assert sorted(g["id"].split("/", 1)[1] for g in got) == sorted(ids)
