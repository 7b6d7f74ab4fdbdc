"""The reader's conformance suite runs each test once per backend (backends.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from backends import Backend


@pytest.fixture(params=["local", "faulty", "archive"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return Backend(request.param, tmp_path)
