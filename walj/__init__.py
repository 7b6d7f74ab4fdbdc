"""walj: crash-safe tool execution for AI agents on a checksummed, segmented JSONL log.

Three layers, imported one way only: walj.log (storage) -> walj.journal (the tool-execution
contract) -> walj.cli, walj.integrations and walj.archive. Beside them sit the pieces every
layer shares: walj.errors (every error walj raises) and walj._codec (what a storable JSON value
is). Every public name is imported here; `read` and `verify` also take an archive's URL, which
they hand to walj.archive (fsspec is imported only when a URL that needs it is read).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from .errors import (
    ClosedError,
    CommitModeError,
    CorruptionError,
    DiskFullError,
    DroppedWhileReadingError,
    LockedError,
    PoisonedError,
    RecordTooLargeError,
    SerializationError,
    UnsupportedVersionError,
    WaljError,
)
from .log import Log, Record, VerifyReport, commit_stats, set_commit_mode
from .log import read as _read_local
from .log import verify as _verify_local


def read(
    path: str | os.PathLike[str],
    start_seq: int = 0,
    *,
    recovery: str = "tolerate_tail",
    archive: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    **private: Any,
) -> Iterator[Record]:
    """Yield the log's records in order from `start_seq`, taking no lock. `path` is a log
    directory, or the URL of an archived session (`s3://bucket/prefix/<log_id>`, `file://...`,
    any fsspec URL); with `archive=URL`, the archive's segments of the session at `path` come
    first and its local segments continue them, the seal chain checked across the two."""
    from . import archive as archives

    if archive is not None or archives.is_url(path):
        return archives.read(archive if archive is not None else path, start_seq,
                             local=path if archive is not None else None, recovery=recovery,
                             storage_options=storage_options)
    return _read_local(path, start_seq, recovery=recovery, **private)


def verify(
    path: str | os.PathLike[str],
    *,
    archive: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    **private: Any,
) -> VerifyReport:
    """Check every checksum, seq, seal and header without changing anything: of the log
    directory at `path`, of an archived session at a URL, or (`archive=URL`) of the archive's
    segments of the session at `path` followed by its local ones."""
    from . import archive as archives

    if archive is not None or archives.is_url(path):
        return archives.verify(archive if archive is not None else path,
                               local=path if archive is not None else None,
                               storage_options=storage_options)
    return _verify_local(path, **private)


__version__ = "0.1.0"

__all__ = [
    "CommitModeError",
    "Log",
    "Record",
    "commit_stats",
    "set_commit_mode",
    "VerifyReport",
    "read",
    "verify",
    "ClosedError",
    "CorruptionError",
    "DiskFullError",
    "DroppedWhileReadingError",
    "LockedError",
    "PoisonedError",
    "RecordTooLargeError",
    "SerializationError",
    "UnsupportedVersionError",
    "WaljError",
    "__version__",
]

# --- the journal ---

from .errors import (  # noqa: E402
    ApprovalError,
    ResolutionError,
    SessionEndedError,
    ToolBlocked,
    ToolCancelled,
    ToolOutcomeUnknown,
    TurnError,
    UnknownToolError,
)
from .journal import (  # noqa: E402
    Approval,
    Blocker,
    CompactReport,
    Cut,
    ExecutionEnd,
    IncompleteTurn,
    PendingLLMCall,
    Recovery,
    Resolution,
    SessionResolution,
    Tool,
    ToolContext,
    ToolJournal,
    ToolObserver,
    ToolResult,
    approve_session,
    deny_session,
    handle_function_calls,
    request_release,
    resolve_session,
    resolve_session_turn,
)

__all__ += [
    "Approval",
    "ApprovalError",
    "Blocker",
    "CompactReport",
    "Cut",
    "ExecutionEnd",
    "IncompleteTurn",
    "PendingLLMCall",
    "Recovery",
    "Resolution",
    "ResolutionError",
    "SessionEndedError",
    "SessionResolution",
    "Tool",
    "ToolBlocked",
    "ToolCancelled",
    "ToolContext",
    "ToolOutcomeUnknown",
    "ToolJournal",
    "ToolObserver",
    "ToolResult",
    "TurnError",
    "UnknownToolError",
    "approve_session",
    "deny_session",
    "handle_function_calls",
    "request_release",
    "resolve_session",
    "resolve_session_turn",
]


def _archive_for_compaction(path: str, url: str,
                            storage_options: dict[str, Any] | None) -> set[str]:
    """`ToolJournal.compact(archive=URL)`: the journal lies below walj.archive and never
    imports it, so the top package hands it this (fsspec is imported only when used)."""
    from . import archive as archives

    return archives.verified_copies(path, url, storage_options)


ToolJournal.archiver = _archive_for_compaction
