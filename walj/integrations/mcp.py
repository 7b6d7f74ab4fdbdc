"""Journaled MCP tool calls: each `call_tool` of an `mcp.Client` runs as one walj execution.

`journaled(client, journal)` wraps a connected `mcp.Client` (mcp 2.x). Its `call_tool` takes
the client's own parameters, forwarded unchanged, plus two of walj's, keyword-only: `call_id`
(the model's id for the call, which makes the idempotency key stable across a restart) and
`turn` (the live walj turn to dispatch in; without one, each call runs in a turn of its own).

One call is one execution: the intent is durable before the request leaves, and the terminal
record before `call_tool` returns. The input-required rounds (elicitation, sampling, roots) and
the client's own resend after a tool-list mismatch happen inside that one execution. The
request's `_meta` carries `io.walj/idempotency-key` and `io.walj/execution-id`, so a server can
deduplicate a call that is sent again after a crash.

What `call_tool` answers:

- the server's result, unchanged; one with `is_error` set is recorded with outcome "error";
- while the journal is blocked: an error `CallToolResult` holding walj's message (and, in its
  `_meta` under `io.walj/blocked`, what blocks), without sending anything;
- a failure after the request may have reached the server (the connection closed, a read
  timeout, a broken stream): recorded ambiguous, so the journal blocks until it is resolved,
  and `walj.ToolOutcomeUnknown` is raised, chained from the original error;
- any other exception of the client (a JSON-RPC error response, an invalid result, a client
  that is not connected): recorded with outcome "error" and raised unchanged, as the plain
  client raises it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import walj

from ._require import require
from ._shared import BlockedMessage, blocked_answer, check_blocked_message

if TYPE_CHECKING:
    from mcp import Client
    from mcp.shared.dispatcher import ProgressFnT
    from mcp.types import CallToolResult, InputResponses, RequestParamsMeta

_mcp = require("mcp", "mcp")
_anyio = require("anyio", "mcp")
_mcp_types = require("mcp.types", "mcp")

IDEMPOTENCY_KEY_META = "io.walj/idempotency-key"
"""The request `_meta` key holding the execution's idempotency key (the same after a restart)."""
EXECUTION_ID_META = "io.walj/execution-id"
"""The request `_meta` key holding the walj execution id (new for every dispatch)."""
BLOCKED_META = "io.walj/blocked"
"""The `_meta` key of a blocked answer: walj's blocked output (status, message, blockers)."""

# The mcp client's errors that mean "the request may have been delivered, no answer came".
_LOST_CODES = frozenset({_mcp_types.CONNECTION_CLOSED, _mcp_types.REQUEST_TIMEOUT})
_BROKEN_STREAMS: tuple[type[BaseException], ...] = (
    _anyio.BrokenResourceError,
    _anyio.ClosedResourceError,
    _anyio.EndOfStream,
    OSError,  # a broken pipe or reset socket, and a transport's own write timeout
)


class DispatchTurn(Protocol):
    """What `call_tool(turn=...)` needs of a turn: a live `walj` turn's `adispatch`."""

    async def adispatch(self, name: str, arguments: Mapping[str, Any], *,
                        call_id: str | None = None, handler: Any = None) -> walj.ToolResult: ...


class MCPToolError(Exception):
    """How the journal records a result the server marked `is_error` (error_type
    "MCPToolError", its text content as the message). `call_tool` never raises it: the
    caller gets the server's result itself."""


def transport_lost(exc: BaseException) -> bool:
    """True for an error of the mcp client that leaves it unknown whether the server ran the
    call: the connection closed or the read timed out while waiting for the answer, or the
    stream under it broke. Exception groups count when any member does."""
    members = getattr(exc, "exceptions", None)
    if isinstance(members, tuple) and members:
        return any(isinstance(m, BaseException) and transport_lost(m) for m in members)
    if isinstance(exc, _mcp.MCPError):
        return exc.code in _LOST_CODES
    return isinstance(exc, _BROKEN_STREAMS)


def _text_of(result: CallToolResult) -> str:
    texts = [block.text for block in result.content if isinstance(block, _mcp_types.TextContent)]
    return "\n".join(texts) if texts else "the server returned an error result"


def _journal_output(result: CallToolResult) -> Any:
    """The result as JSON, so the journal's output fingerprint and preview mean something."""
    try:
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)
    except Exception:  # never fail a call that ran over how it is described
        return repr(result)


class _Call:
    """One call's state, shared by the guard, the handler and `call_tool`."""

    __slots__ = ("context", "result", "error")

    def __init__(self) -> None:
        self.context: walj.ToolContext | None = None
        self.result: CallToolResult | None = None  # the server's answer, ok or is_error
        self.error: BaseException | None = None  # to raise once the turn is left


class JournaledClient:
    """An `mcp.Client` whose `call_tool` goes through a walj journal. Build with `journaled`.
    Everything else (listing tools, resources, prompts) is the client's: use `.client`."""

    def __init__(self, client: Client, journal: walj.ToolJournal, *,
                 blocked_message: BlockedMessage = None) -> None:
        if not isinstance(journal, walj.ToolJournal):
            raise TypeError(f"journal must be a walj.ToolJournal, not {type(journal).__name__}")
        if not callable(getattr(client, "call_tool", None)):
            raise TypeError(f"client must be an mcp.Client, not {type(client).__name__}")
        self._client = client
        self._journal = journal
        self._blocked_message = check_blocked_message(blocked_message)

    @property
    def client(self) -> Client:
        return self._client

    @property
    def journal(self) -> walj.ToolJournal:
        return self._journal

    def __repr__(self) -> str:
        return f"<walj.integrations.mcp.JournaledClient {self._journal!r}>"

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        meta: RequestParamsMeta | None = None,
        call_id: str | None = None,
        turn: DispatchTurn | None = None,
    ) -> CallToolResult:
        """`mcp.Client.call_tool`, journaled: see the module's documentation for what it
        answers. Without `turn`, the call runs in a turn of its own (`journal.turn()`), which
        raises `walj.TurnError` while another turn of the journal is live: pass that one (and
        share one turn between concurrent calls). Caller `meta` is copied, with walj's two
        keys set over any of the same name."""
        call = _Call()

        def capture(context: walj.ToolContext) -> None:
            # A guard, not a `context` parameter of the handler: an MCP tool may well have an
            # argument named "context", which walj refuses beside a context parameter.
            call.context = context

        async def handler(**_arguments: Any) -> Any:
            context = call.context
            assert context is not None  # the guard runs first
            sent_meta: dict[str, Any] = dict(meta) if meta is not None else {}
            sent_meta[IDEMPOTENCY_KEY_META] = context.idempotency_key
            sent_meta[EXECUTION_ID_META] = context.execution_id
            try:
                result = await self._client.call_tool(
                    name,
                    arguments,  # as the caller gave them, not the journal's copy
                    read_timeout_seconds,
                    progress_callback,
                    input_responses=input_responses,
                    request_state=request_state,
                    meta=cast("RequestParamsMeta", sent_meta),  # an open TypedDict
                )
            except Exception as exc:
                if transport_lost(exc):
                    raise walj.ToolOutcomeUnknown(
                        f"MCP tool {name!r}: the call failed after its request may have reached "
                        f"the server ({type(exc).__name__}: {exc}); whether it took effect is "
                        "unknown"
                    ) from exc
                call.error = exc
                raise
            call.result = result
            if result.is_error:
                raise MCPToolError(_text_of(result))
            return _journal_output(result)

        tool = walj.Tool(handler, guard=capture)
        journal_arguments = {} if arguments is None else arguments
        if turn is None:
            async with self._journal.turn() as own:
                done = await self._dispatch(own, name, journal_arguments, call_id, tool, call)
        else:
            done = await self._dispatch(turn, name, journal_arguments, call_id, tool, call)
        if call.error is not None:
            raise call.error
        return done

    async def _dispatch(self, turn: DispatchTurn, name: str, arguments: Mapping[str, Any],
                        call_id: str | None, tool: walj.Tool, call: _Call) -> CallToolResult:
        """Dispatch, keeping an exception to raise in `call.error`: a turn of our own is left
        normally (completed) whatever the call's outcome, so it never blocks on its own."""
        try:
            done = await turn.adispatch(name, arguments, call_id=call_id, handler=tool)
        except walj.ToolOutcomeUnknown as exc:
            call.error = exc  # recorded ambiguous: the journal blocks until it is resolved
            return _error_result(str(exc))
        if done.outcome == "blocked":
            return _blocked_result(done, blocked_answer(done, self._blocked_message,
                                                        self._journal))
        if done.outcome == "refused" or done.replayed:  # answered from the journal: no call
            return _answered_result(done)
        if call.result is not None:  # "ok", or "error" for a result marked is_error
            return call.result
        if call.error is not None:  # the client raised: recorded as "error", raised as is
            return _error_result(done.error or "")
        raise AssertionError(f"walj answered {done.outcome!r} without calling the handler")


def _error_result(text: str) -> CallToolResult:
    result: CallToolResult = _mcp_types.CallToolResult(
        content=[_mcp_types.TextContent(type="text", text=text)], is_error=True)
    return result


def _answered_result(done: walj.ToolResult) -> CallToolResult:
    """A call id the journal had settled: its recorded result, or why it was refused."""
    if done.outcome == "ok":
        try:
            result: CallToolResult = _mcp_types.CallToolResult.model_validate(done.output)
        except Exception:  # an output that was not a call result: shown as its JSON
            result = _mcp_types.CallToolResult(
                content=[_mcp_types.TextContent(type="text", text=json.dumps(done.output))])
    else:
        result = _error_result(done.error or f"walj answered {done.outcome}")
    result.meta = {**(result.meta or {}), EXECUTION_ID_META: done.execution_id}
    return result


def _blocked_result(done: walj.ToolResult, text: str) -> CallToolResult:
    result: CallToolResult = _mcp_types.CallToolResult(
        content=[_mcp_types.TextContent(type="text", text=text)],
        is_error=True,
        meta={BLOCKED_META: done.output, EXECUTION_ID_META: done.execution_id},
    )
    return result


def journaled(client: Client, journal: walj.ToolJournal, *,
              blocked_message: BlockedMessage = None) -> JournaledClient:
    """Wrap a connected `mcp.Client` so that each `call_tool` is one durable walj execution.
    `blocked_message`: the text of a blocked call's result instead of walj's (a string, or a
    function of the blocked `walj.ToolResult`)."""
    return JournaledClient(client, journal, blocked_message=blocked_message)


__all__ = [
    "BLOCKED_META",
    "EXECUTION_ID_META",
    "IDEMPOTENCY_KEY_META",
    "DispatchTurn",
    "JournaledClient",
    "MCPToolError",
    "journaled",
    "transport_lost",
]
