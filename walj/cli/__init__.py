"""The `walj` command line: forensic, recovery and demo commands over walj logs (`main`)."""

from __future__ import annotations

from ._main import main

__all__ = ["main"]
