"""walj: crash-safe tool execution for AI agents on a checksummed, segmented JSONL log.

Three layers, imported one way only: walj.log (storage) -> walj.journal (the tool-execution
contract) -> walj.cli (and the integrations and archival to come). Beside them sit the pieces
every layer shares: walj.errors (every error walj raises) and walj._codec (what a storable
JSON value is). Every public name is imported here.
"""

from __future__ import annotations

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
from .log import Log, Record, VerifyReport, read, verify

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

# --- the journal ---

from .errors import (  # noqa: E402
    ResolutionError,
    ToolBlocked,
    ToolCancelled,
    ToolOutcomeUnknown,
    TurnError,
    UnknownToolError,
)
from .journal import (  # noqa: E402
    Blocker,
    Cut,
    IncompleteTurn,
    PendingLLMCall,
    Recovery,
    Resolution,
    Tool,
    ToolContext,
    ToolJournal,
    ToolResult,
    handle_function_calls,
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
    "ToolOutcomeUnknown",
    "ToolJournal",
    "ToolResult",
    "TurnError",
    "UnknownToolError",
    "handle_function_calls",
]
