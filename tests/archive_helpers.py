"""Helpers of the archive tests: fake AWS settings, a bucket on moto, an archive a test can
reach into (to edit or delete an object as a hostile store would), and small sessions."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import walj

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



def make_session(path: Path, count: int = 60, start: int = 0,
                 **options: Any) -> list[dict[str, Any]]:
    records = [{"i": i, "text": f"record {i}", "pad": "x" * (i % 9)}
               for i in range(start, start + count)]
    with walj.Log.open(path, segment_bytes=1024, sync="never", **options) as log:
        for record in records:
            log.append(record)
    return records


def datas(records: Any) -> list[dict[str, Any]]:
    out = []
    for expected, record in enumerate(records, start=1):
        assert record.seq == expected
        out.append(record.data)
    return out
