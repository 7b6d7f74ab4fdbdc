"""Shared fixtures: a fresh log directory per test; one moto S3 server on loopback per session,
a bucket per test, and the `archive` fixture that runs a test over s3:// (through s3fs) and over
file:// alike. Test helpers import from this folder."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from archive_helpers import FAKE_AWS, Archive, aws_env, make_bucket  # noqa: E402


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    return tmp_path / "log"


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
