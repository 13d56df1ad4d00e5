"""Prepares a freshly started moto S3 server for tests/remote/test_s3_server.c.

Usage: s3_server_setup.py ENDPOINT OUT_FILE [KEY=PATH ...]

While moto still accepts any request (its INITIAL_NO_AUTH_ACTION_COUNT is unset, so infinite),
this makes an IAM user with an access key and a policy allowing s3:*, a bucket `dh-test` with
the objects the test reads (`shards/000.tar` .. `shards/011.tar`, each 1,000 bytes: byte j of
shard i is (i * 31 + j) % 251; `odd/a b+c%.tar`, 1,000 bytes of the same rule for i = 99;
`odd/ctl\x01.tar`, one byte; and each KEY=PATH given: the file PATH as KEY), and
then turns moto's IAM authentication on (POST /moto-api/reset-auth 0): from then on every
request must carry a SigV4 signature made with that key, which moto recomputes and compares
(SignatureDoesNotMatch otherwise). Writes "ACCESS_KEY_ID SECRET_ACCESS_KEY" to OUT_FILE.
"""

import sys
import urllib.request

import boto3


def shard_bytes(i: int) -> bytes:
    return bytes((i * 31 + j) % 251 for j in range(1000))


def main() -> int:
    endpoint, out = sys.argv[1], sys.argv[2]
    common = dict(
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
    )
    iam = boto3.client("iam", **common)
    iam.create_user(UserName="datahelix-test")
    key = iam.create_access_key(UserName="datahelix-test")["AccessKey"]
    iam.put_user_policy(
        UserName="datahelix-test",
        PolicyName="s3-all",
        PolicyDocument='{"Version":"2012-10-17","Statement":[{"Effect":"Allow",'
        '"Action":"s3:*","Resource":"*"}]}',
    )
    s3 = boto3.client("s3", **common)
    s3.create_bucket(Bucket="dh-test")
    for i in range(12):
        s3.put_object(Bucket="dh-test", Key=f"shards/{i:03d}.tar", Body=shard_bytes(i))
    s3.put_object(Bucket="dh-test", Key="odd/a b+c%.tar", Body=shard_bytes(99))
    # a key XML 1.0 cannot carry as text: listed only URL-encoded (encoding-type=url)
    s3.put_object(Bucket="dh-test", Key="odd/ctl\x01.tar", Body=b"x")
    for upload in sys.argv[3:]:
        key_name, path = upload.split("=", 1)
        with open(path, "rb") as f:
            s3.put_object(Bucket="dh-test", Key=key_name, Body=f.read())
    # text/plain: with urllib's default form type, Flask takes the body as a form, not data.
    req = urllib.request.Request(
        endpoint + "/moto-api/reset-auth",
        data=b"0",
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(req, timeout=30) as reply:
        reply.read()
    with open(out, "w") as f:
        f.write(f"{key['AccessKeyId']} {key['SecretAccessKey']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
