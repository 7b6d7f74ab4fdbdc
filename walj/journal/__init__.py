"""walj.journal: the tool-execution contract, on top of walj.log.

It promises: a tool's intent is durable before its handler runs and its outcome before the next
dispatch; arguments and outputs are stored as SHA-256 fingerprints and bounded, redacted
previews; on open one pass over the log, from its last complete checkpoint, rebuilds every
unmatched intent, interrupted turn, pending LLM call and unexplained cut, and dispatch is
refused (fail closed) until a person, a reconcile hook or a per-tool policy settles each one
with a durable record. A caller-given call id dispatched again after it settled is answered from
its record (replayed) or refused, and its handler is not run again. A call that needs a
person's approval runs only on a durable approval of exactly its call id, tool and arguments,
consumed once by its intent. The live state in a process always equals what a replay of its
log would rebuild. Nothing is silently replayed; this is not exactly-once.

It never touches a file descriptor or a path inside the log directory: it reaches the log only
through walj.log's public surface (Log, read, the errors) and the replay hooks
`Log.open(_replay=..., _replay_start=...)`. It never imports the CLI or an integration.

Public modules, for the layers above: records (the record schema: kinds, fields in the order
they are written, encode, decode, byte peeks) and state (JournalState, the one `rebuild` of it
from records, damage accounting). Private ones: _records (the recovery view's types), _writes
(every record the journal writes, built from the schema), _fingerprint (digests and previews),
_damage (which cuts a crash explains), _openwork (what the rebuild holds open), _callindex (the
bounded index of settled call ids), _checkpoint_parts and _checkpoint (the state as checkpoint
records, and back), _snapshot (the recovery view), _compact (writing checkpoints; compaction),
_tools (tools, contexts, results), _options (what a journal was opened with), _slots (a turn or
LLM call in flight), _core (the locked writer and the live-state table, behind the few
operations turns, LLM calls, replay, resolution, requests and compaction use), _aio (blocking
steps from asyncio), _replay (answering a settled call id from its record), _dispatch (one
dispatch's steps and interrupt rules, sync and async), _turn (turns and dispatch), _llm
(LLM-call brackets), _resolve (resolutions and policies), _approvalbook (the approvals the
state holds), _approvals (whether a call needs approval, what its dispatch answers, decisions),
_applied (the ids of answered
resolution requests), _requests (applying resolution requests other processes leave),
_session_resolve (resolve_session: resolving from outside a live writer), _observe (the
observer hook: tracing and metrics), _sessions (session ids to directory names), _opening (the
log opened from its last checkpoint), _journal (ToolJournal).
"""

from __future__ import annotations

from ._compact import CompactReport
from ._journal import ToolJournal, end_idle
from ._observe import ExecutionEnd, ToolObserver
from ._records import (
    Approval,
    Blocker,
    Cut,
    IncompleteTurn,
    PendingLLMCall,
    Recovery,
    Resolution,
)
from ._session_resolve import (
    DEFAULT_WAIT,
    SessionResolution,
    approve_session,
    deny_session,
    known_ids,
    request_release,
    resolve_session,
    resolve_session_turn,
)
from ._tools import Tool, ToolContext, ToolResult, handle_function_calls

__all__ = ["DEFAULT_WAIT", "Approval", "Blocker", "CompactReport", "Cut", "ExecutionEnd",
           "IncompleteTurn",
           "PendingLLMCall", "Recovery", "Resolution", "SessionResolution", "Tool", "ToolContext",
           "ToolJournal", "ToolObserver", "ToolResult", "approve_session", "deny_session",
           "end_idle", "handle_function_calls",
           "known_ids", "request_release", "resolve_session", "resolve_session_turn"]
