"""Archive fixtures: one moto S3 server on loopback per session, a bucket per test, and the
`archive` fixture that runs each test over s3:// (through s3fs) and over file:// alike."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# Fake credentials and no way out: a request that escaped the endpoint settings would go to
# this proxy, which refuses it, instead of reaching a real AWS endpoint.
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
}


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    saved = {k: os.environ.get(k) for k in FAKE_AWS}
    os.environ.update(FAKE_AWS)  # moto's own boto calls, before any test's environment
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def aws_env(tmp: Path) -> dict[str, str]:
    """The environment a test (or its child process) runs in: fake credentials, no profile
    files of the user's, no endpoint (each test says how it points at moto)."""
    env = dict(FAKE_AWS)
    empty = tmp / "aws-empty"
    empty.write_text("")
    env["AWS_CONFIG_FILE"] = str(empty)
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(empty)
    return env


def make_bucket(endpoint: str) -> str:
    import boto3

    name = f"walj-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(
        Bucket=name)
    return name


@dataclass
class Archive:
    """An archive root URL, and how a test reaches its objects directly (to edit or delete
    one, as a hostile store or a crash would)."""

    url: str
    kind: str
    endpoint: str | None
    local_root: Path | None

    def _client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def _bucket_key(self, rel: str) -> tuple[str, str]:
        bucket, _, prefix = self.url[len("s3://"):].partition("/")
        return bucket, f"{prefix}/{rel}" if prefix else rel

    def get(self, rel: str) -> bytes:
        if self.local_root is not None:
            return (self.local_root / rel).read_bytes()
        bucket, key = self._bucket_key(rel)
        body: bytes = self._client().get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    def put(self, rel: str, data: bytes) -> None:
        if self.local_root is not None:
            (self.local_root / rel).write_bytes(data)
            return
        bucket, key = self._bucket_key(rel)
        self._client().put_object(Bucket=bucket, Key=key, Body=data)

    def delete(self, rel: str) -> None:
        if self.local_root is not None:
            (self.local_root / rel).unlink()
            return
        bucket, key = self._bucket_key(rel)
        self._client().delete_object(Bucket=bucket, Key=key)

    def names(self, log_id: str) -> list[str]:
        if self.local_root is not None:
            return sorted(p.name for p in (self.local_root / log_id).iterdir())
        bucket, key = self._bucket_key(log_id + "/")
        listed = self._client().list_objects_v2(Bucket=bucket, Prefix=key)
        return sorted(o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", []))


@pytest.fixture
def moto_env(request: pytest.FixtureRequest, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point this process's S3 at moto the botocore way (AWS_ENDPOINT_URL_S3), nothing else."""
    endpoint: str = request.getfixturevalue("s3_endpoint")
    env = aws_env(tmp_path)
    env["AWS_ENDPOINT_URL_S3"] = endpoint
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("FSSPEC_S3_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return env


@pytest.fixture(params=["s3", "file"])
def archive(request: pytest.FixtureRequest, tmp_path: Path) -> Archive:
    if request.param == "file":
        root = tmp_path / "archive"
        return Archive(f"file://{root}", "file", None, root)
    request.getfixturevalue("moto_env")
    endpoint: str = request.getfixturevalue("s3_endpoint")
    bucket = make_bucket(endpoint)
    return Archive(f"s3://{bucket}/sessions", "s3", endpoint, None)
