"""Shared fixtures: a fresh log directory per test; test helpers import from this folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    return tmp_path / "log"
