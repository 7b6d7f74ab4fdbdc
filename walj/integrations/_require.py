"""Importing a framework for an integration, with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import `module`, or raise ImportError telling the user to install `walj[extra]`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"walj.integrations.{extra.replace('-', '_')} needs {module!r}: "
            f"pip install 'walj[{extra}]'"
        ) from exc
