"""Typed errors: every failure walj reports is a WaljError subclass."""

from __future__ import annotations


class WaljError(Exception):
    """Base class of every error walj raises on purpose."""


class CorruptionError(WaljError):
    """The log holds damage that is not a torn tail; names file, byte offset and seq."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        offset: int | None = None,
        seq: int | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.file = file
        self.offset = offset
        self.seq = seq
        self.kind = kind


class UnsupportedVersionError(CorruptionError):
    """A segment header or journal record carries a format version this code does not know."""


class LockedError(WaljError):
    """Another writer holds the log directory; `owner` describes it when known."""

    def __init__(self, message: str, *, owner: str | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class PoisonedError(WaljError):
    """A write or fsync failed; the handle refuses all further work. Reopen to recover."""


class DiskFullError(PoisonedError):
    """The disk is full (ENOSPC); nothing after the last acknowledged record was acknowledged."""


class RecordTooLargeError(WaljError):
    """The encoded record is larger than the log's max_record_bytes."""


class SerializationError(WaljError):
    """The record cannot be stored as JSON (unsupported type, NaN or Infinity, non-dict)."""


class CommitModeError(WaljError, ValueError):
    """A commit mode that is not one of "inline", "files", "syncfs", a bad thread count, or
    "syncfs" where the system has no usable syncfs(2)."""


class ClosedError(WaljError):
    """The log or journal was used after close()."""


# --- the tool journal -----------------------------------------------------------------------


class ToolCancelled(Exception):
    """Raised by a tool handler to say it did nothing: the execution finishes as "cancelled"."""


class ToolBlocked(Exception):
    """Raised by a tool handler or guard to refuse the call: the execution finishes as "blocked"."""


class ToolOutcomeUnknown(Exception):
    """Raised by a tool handler that cannot tell whether its effect happened (a connection lost
    after the request was sent): the execution is recorded ambiguous and blocks, as after a
    crash, until it is resolved; dispatch then re-raises it."""


class ResolutionError(WaljError, ValueError):
    """A resolution was refused; `reason` says why and nothing was written.

    Reasons: "unknown", "already_terminal", "already_resolved", "in_flight", "bad_outcome",
    "note_required", "bad_actor".
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ApprovalError(WaljError):
    """An approval was refused or cannot be given; `reason` says why and nothing was written.

    Reasons: "unknown" (no such approval id), "not_pending" (already decided or consumed),
    "call_id_required" (a call that needs approval was dispatched without a call id),
    "bad_expiry", and those of a resolution's signature: "bad_actor", "note_required".
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class UnknownToolError(WaljError, LookupError):
    """Dispatch named a tool that is not registered and no handler was given; nothing written."""


class DroppedWhileReadingError(WaljError):
    """A reader reached a segment that `Log.drop_before` removed while it was reading: the
    records it would have read next are gone on purpose. Read again from `first_seq`."""

    def __init__(self, message: str, *, first_seq: int) -> None:
        super().__init__(message)
        self.first_seq = first_seq


class SessionEndedError(WaljError, RuntimeError):
    """The session was ended (`ToolJournal.end`): it takes no new turn or LLM call. Its
    blockers may still be resolved."""


class TurnError(WaljError, RuntimeError):
    """A turn was misused: dispatch outside a live turn, or a second turn while one is live."""
