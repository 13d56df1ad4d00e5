"""datahelix.count_text_tokens: the user's tokenizer counts the captions' tokens, which probe
puts in the profiles (text_len, tokens_est) instead of its bytes/4 estimate."""
import os

import pytest


def test_count_text_tokens_feeds_probe_the_users_tokenizer(datahelix, tmp_path, cli):
    """count_text_tokens writes each caption's length in the user's tokenizer into the
    manifest; probe then counts those text tokens in text_len and tokens_est instead of its
    bytes/4 estimate."""
    import json
    import shutil
    import subprocess

    from conftest import make_dataset
    src, ids = make_dataset(tmp_path / "set", 4, seed=3)
    with open(f"{src}/manifest.jsonl") as f:
        captions = {e["id"]: e.get("caption", "") for e in map(json.loads, f)}
    before = {r["id"]: r for r in map(json.loads, open(f"{src}/profiles.jsonl"))}
    assert datahelix.count_text_tokens(src, str.split) == 4
    with open(f"{src}/manifest.jsonl") as f:
        counted = {e["id"]: e["text_tokens"] for e in map(json.loads, f)}
    assert counted == {i: len(c.split()) for i, c in captions.items()}
    env = dict(os.environ, DH_CALIBRATION_CACHE=str(tmp_path / "calib.json"))
    subprocess.run([cli, "probe", f"{src}/manifest.jsonl", "-o", f"{src}/profiles.jsonl"],
                   check=True, capture_output=True, env=env)
    after = {r["id"]: r for r in map(json.loads, open(f"{src}/profiles.jsonl"))}
    for i in ids:
        assert after[i]["text_len"] == counted[i]
        visual = before[i]["tokens_est"] - before[i].get("text_len", 0)
        assert after[i]["tokens_est"] == visual + counted[i]
    # an object with encode() (a Hugging Face tokenizer), written elsewhere
    class Chars:
        def encode(self, text):
            return list(text)
    out = tmp_path / "copy.jsonl"
    assert datahelix.count_text_tokens(f"{src}/manifest.jsonl", Chars(), out=out) == 4
    assert {e["id"]: e["text_tokens"] for e in map(json.loads, open(out))} == \
        {i: len(c) for i, c in captions.items()}
    with pytest.raises(datahelix.InvalidArgumentError, match="tokenizer"):
        datahelix.count_text_tokens(src, 42)
    with pytest.raises(datahelix.NotFoundError, match="no manifest"):
        datahelix.count_text_tokens(tmp_path / "nowhere", str.split)
    shutil.rmtree(tmp_path / "set")
