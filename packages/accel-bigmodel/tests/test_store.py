"""accel_bigmodel.stores against a real S3 server (moto's, on loopback): opening a store,
moving files both ways, and the errors that name the URL and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_bigmodel import stores

pytestmark = pytest.mark.needs("s3fs", "moto")


def test_local_paths_and_file_urls_stay_local_and_urls_never_become_folders(tmp_path: Path):
    assert not stores.is_url(os.fspath(tmp_path)) and not stores.is_url(tmp_path)
    assert not stores.is_url(f"file://{tmp_path}")
    assert stores.local_path(f"file://{tmp_path}") == tmp_path
    assert stores.is_url("s3://bucket/run") and stores.is_url("memory://x")
    with pytest.raises(ValueError, match=r"'s3://bucket/run' is an object-store URL"):
        stores.local_path("s3://bucket/run")


def test_upload_download_and_listing_round_trip(s3: str, tmp_path: Path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(1000))
    (src / "sub" / "b.bin").write_bytes(b"b" * 10)
    url = stores.join(s3, "run", "step1")
    assert stores.upload(src, url) == 1010
    assert stores.files_under(url) == ["a.bin", "sub/b.bin"]
    assert stores.list_names(stores.join(s3, "run")) == ["step1"]
    assert (
        stores.read_bytes(stores.join(url, "a.bin"), 10, 20) == (src / "a.bin").read_bytes()[10:20]
    )
    dst = tmp_path / "dst"
    assert stores.download(url, dst, ["sub/b.bin"]) == 10
    assert [p.name for p in dst.rglob("*") if p.is_file()] == ["b.bin"]
    stores.remove(url)
    assert stores.files_under(url) == [] and not stores.exists(stores.join(url, "a.bin"))


def test_check_store_names_a_missing_bucket(s3: str):
    stores.check_store(stores.join(s3, "run"), write=True)
    with pytest.raises(
        FileNotFoundError,
        match=r"bucket 'no-such-bucket' of s3://no-such-bucket/run does not exist",
    ):
        stores.check_store("s3://no-such-bucket/run", write=True)


def _check_in_child(env: dict[str, str], url: str) -> str:
    code = (
        "from accel_bigmodel import stores\n"
        f"try: stores.check_store({url!r}, write=True)\n"
        "except Exception as e: print(type(e).__name__, e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_check_store_names_missing_credentials_and_an_endpoint_that_does_not_answer(
    s3: str, s3_endpoint
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_ENDPOINT_URL"] = s3_endpoint.endpoint
    env["AWS_SHARED_CREDENTIALS_FILE"] = env["AWS_CONFIG_FILE"] = os.devnull
    out = _check_in_child(env, f"{s3}/run")
    assert out.startswith("StoreError no credentials for") and "AWS_ACCESS_KEY_ID" in out, out
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # nothing listens there
    out = _check_in_child(env, f"{s3}/run")
    assert out.startswith("StoreError the store for") and "does not answer" in out, out
    assert "AWS_ENDPOINT_URL" in out and os.environ["AWS_SECRET_ACCESS_KEY"] not in out


def test_a_scheme_without_its_filesystem_names_what_to_install():
    with pytest.raises(
        ImportError, match=r"no filesystem for gs:// URLs is installed .*pip install gcsfs"
    ):
        stores.filesystem("gs://bucket/run")


def test_a_read_only_prefix_is_named_before_anything_is_written(tmp_path: Path) -> None:
    """moto's server enforcing IAM: a user whose policy only reads the bucket."""
    import json
    import socket
    import time

    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the first 4 requests are let through unsigned: the bucket, the user, its policy, its key
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"}
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:  # no request: none counted
            assert time.monotonic() < deadline and server.poll() is None, "moto did not start"
            time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        admin = {"endpoint_url": endpoint, "region_name": "us-east-1",
                 "aws_access_key_id": "admin", "aws_secret_access_key": "admin"}  # fmt: skip
        boto3.client("s3", **admin).create_bucket(Bucket="read-only")
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="reader")
        resources = ["arn:aws:s3:::read-only", "arn:aws:s3:::read-only/*"]
        policy = {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": resources}
        ]}  # fmt: skip
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        child = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        child.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=key["AccessKeyId"],
                     AWS_SECRET_ACCESS_KEY=key["SecretAccessKey"], AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
        out = _check_in_child(child, "s3://read-only/run")
        assert out.startswith("StoreError the store refused writing into s3://read-only/run"), out
        assert "write access" in out and key["SecretAccessKey"] not in out
    finally:
        server.terminate()
        server.wait(timeout=30)
