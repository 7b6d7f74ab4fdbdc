"""walj: crash-safe tool execution for AI agents on a checksummed, segmented JSONL log."""

from __future__ import annotations

from ._log import Log
from ._read import Record, VerifyReport, read, verify
from .errors import (
    ClosedError,
    CorruptionError,
    DiskFullError,
    LockedError,
    PoisonedError,
    RecordTooLargeError,
    SerializationError,
    UnsupportedVersionError,
    WaljError,
)

__version__ = "0.1.0"

__all__ = [
    "Log",
    "Record",
    "VerifyReport",
    "read",
    "verify",
    "ClosedError",
    "CorruptionError",
    "DiskFullError",
    "LockedError",
    "PoisonedError",
    "RecordTooLargeError",
    "SerializationError",
    "UnsupportedVersionError",
    "WaljError",
    "__version__",
]

# --- the log (format -> segment -> log -> scan) ---

# --- the journal (journal/recovery) ---

from ._journal import ToolJournal  # noqa: E402
from ._records import (  # noqa: E402
    Blocker,
    Cut,
    IncompleteTurn,
    PendingLLMCall,
    Recovery,
    Resolution,
)
from ._tools import Tool, ToolContext, ToolResult, handle_function_calls  # noqa: E402
from .errors import (  # noqa: E402
    ResolutionError,
    ToolBlocked,
    ToolCancelled,
    TurnError,
    UnknownToolError,
)

__all__ += [
    "Blocker",
    "Cut",
    "IncompleteTurn",
    "PendingLLMCall",
    "Recovery",
    "Resolution",
    "ResolutionError",
    "Tool",
    "ToolBlocked",
    "ToolCancelled",
    "ToolContext",
    "ToolJournal",
    "ToolResult",
    "TurnError",
    "UnknownToolError",
    "handle_function_calls",
]
