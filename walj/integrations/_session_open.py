"""Opening one session's journal for an integration's journal holder: the holder's settings
checked, and a journal that another process holds (another worker of a pool serving the same
session) asked to be released, then waited for."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import walj

# Who asks another process to release a session's journal (the actor of its request).
RELEASE_ACTOR = "walj-integration"


def check_settings(options: Mapping[str, Any], idle_timeout: float | None, max_open: int,
                   lock_timeout: float) -> None:
    """ValueError for a limit out of range, or for a journal option the holder sets itself."""
    if idle_timeout is not None and (not isinstance(idle_timeout, (int, float))
                                     or isinstance(idle_timeout, bool) or not idle_timeout > 0):
        raise ValueError(f"idle_timeout must be a positive number of seconds or None, not "
                         f"{idle_timeout!r}")
    if type(max_open) is not int or max_open < 1:
        raise ValueError(f"max_open must be a positive int, not {max_open!r}")
    if (not isinstance(lock_timeout, (int, float)) or isinstance(lock_timeout, bool)
            or not lock_timeout >= 0):
        raise ValueError(f"lock_timeout must be a number of seconds >= 0, not {lock_timeout!r}")
    if "lock_timeout" in options:
        raise ValueError("pass lock_timeout to the integration, not as a journal option")
    if "release_on_request" in options:
        raise ValueError("the integration answers release requests itself; "
                         "release_on_request is not a journal option here")


def open_session(root: str, session_id: str, options: Mapping[str, Any],
                 lock_timeout: float) -> walj.ToolJournal:
    """Open the session's journal (`ToolJournal.open_session` with `options`); when another
    process holds it, ask that process to release it (`walj.request_release`), then wait for
    its lock: `lock_timeout` seconds in all, then `walj.LockedError`."""
    try:
        return walj.ToolJournal.open_session(root, session_id, **options)
    except walj.LockedError:
        if lock_timeout == 0:
            raise
    deadline = time.monotonic() + lock_timeout
    path = walj.ToolJournal.session_path(root, session_id)
    try:
        walj.request_release(path, actor=RELEASE_ACTOR, wait=0,
                             note=f"process {os.getpid()} waits to open the session")
    except (walj.WaljError, OSError):
        pass  # not asked (the request could not be written): the wait is all there is
    return walj.ToolJournal.open_session(
        root, session_id, lock_timeout=max(0.0, deadline - time.monotonic()), **options)
