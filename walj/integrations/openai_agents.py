"""OpenAI Agents SDK tools through walj: `journal_tools` wraps FunctionTools so that every call
is one walj execution, and `journaled_run` brackets a `Runner.run` as one walj turn.

`journal_tools(tools, journal)` returns copies of the given `FunctionTool`s (what
`@function_tool` makes, or one built by hand) whose `on_invoke_tool` dispatches through
`turn.adispatch`: the intent is durable before the tool's own `on_invoke_tool` runs, the
outcome before the SDK gets the answer. The call identity is `ToolContext.tool_call_id`; the
arguments are the model's JSON text. What the model gets back as the tool's output:

- the tool's own output when it ran (or, for a call id this journal already settled, the
  recorded output: walj's replay);
- `"not run: "` and walj's message when the journal is blocked, or when walj refused a call id
  it had settled with other arguments; the run goes on;
- `"error: "` and why, for arguments that are not a JSON object (nothing is run or written);
- for an exception of the tool: it is recorded with outcome "error" first; then the tool's own
  failure policy, exactly as the SDK applies it to the unwrapped tool, decides what the model
  sees (by default the SDK's "An error occurred while running the tool. Please try again.").
  A tool built with `failure_error_function=None` raises the exception out of the run.

`walj.ToolOutcomeUnknown` from a tool, cancellation (the SDK's timeout included) and walj's own
errors go out of `on_invoke_tool`: the execution is then ambiguous and blocks until resolved.

Turns. Inside `async with journaled_run(journal):` every journaled call of that journal joins
that one turn, so a run that never completed (a crash anywhere in it, or an exception out of
it) blocks the next run's calls, whatever new call id the model gives them. Without a bracket,
calls share a turn that opens with the first call and closes when the last concurrent call
ends: a crash inside a tool still blocks, but one after the tools returned and before the SDK
saved the result to its Session does not (docs/INTEGRATIONS.md).

Approvals. A tool's `needs_approval` keeps its rule, and the journal backs it: the SDK pauses
on a durable walj approval request, `approve_interruption` / `deny_interruption` write the
decision to the journal before the RunState carries it, `apply_journal_decisions` carries
decisions made elsewhere (`walj approve`) into a state, and only the journal's approval of the
call id, tool and arguments makes a call run, once (_agents_approvals).

Sessions. `WaljSessions(root)` holds one journal per SDK session id under `root`:
`async with sessions.run(session_id) as journal:` opens it (or reuses it), brackets the run as
`journaled_run` does, and holds it open until the block ends; it is closed once idle for
`idle_timeout` seconds, at most `max_open` are open, and one that another process holds is
waited for up to `lock_timeout` seconds. `end(session_id)` ends a session, `release` closes its
journal, `close()` all of them.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import walj

from ._agents_approvals import (
    JournaledApproval,
    apply_journal_decisions,
    approve_interruption,
    deny_interruption,
    interruption_approval,
)
from ._agents_turns import LiveTurn, dispatch_call, journaled_run
from ._journals import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_MAX_OPEN,
    JournalOnly,
    SessionJournals,
)
from ._require import require
from ._shared import (
    BlockedMessage,
    approval_answer,
    approval_text,
    blocked_answer,
    check_blocked_message,
)

if TYPE_CHECKING:
    from agents.tool import FunctionTool
    from agents.tool_context import ToolContext

require("agents", "openai-agents")  # first: a missing SDK fails here, naming the extra
_tool = require("agents.tool", "openai-agents")
from ._agents_repair import RepairedSession, repaired_session  # noqa: E402 - after the check

# The failure policy of a built FunctionTool lives in these two fields (openai-agents 0.24):
# an SDK without them cannot be made to let a tool's exception through to walj.
if not {"_failure_error_function", "_use_default_failure_error_function"} <= set(
        getattr(_tool.FunctionTool, "__dataclass_fields__", {})):
    raise ImportError("walj.integrations.openai_agents needs openai-agents 0.24 or newer: "
                      "pip install 'walj[openai-agents]'")

__all__ = ["BLOCKED_PREFIX", "ERROR_PREFIX", "LiveTurn", "RepairedSession", "WaljSessions",
           "apply_journal_decisions", "approve_interruption", "deny_interruption",
           "interruption_approval", "journal_tools", "journaled_run", "repaired_session"]

BLOCKED_PREFIX = "not run: "
ERROR_PREFIX = "error: "


class _ReplayedError(Exception):
    """An error outcome answered from the journal: the tool's failure policy formats it."""


class _Call:
    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: Exception | None = None  # what the tool raised, for its failure policy


class _JournaledInvoker:
    """A journaled tool's `on_invoke_tool`: the SDK calls it with the tool context and the
    model's JSON text."""

    def __init__(self, original: FunctionTool, inner: FunctionTool,
                 journal: walj.ToolJournal, blocked_message: BlockedMessage,
                 approval: JournaledApproval | None = None) -> None:
        self.original = original  # its failure policy formats an error for the model
        self.inner = inner  # raises instead of formatting, and has no timeout of its own
        self.journal = journal
        self.blocked_message = blocked_message
        self.approval = approval  # the tool's needs_approval, backed by the journal

    async def __call__(self, ctx: ToolContext[Any], arguments_json: str) -> Any:
        arguments = _arguments(arguments_json)
        if isinstance(arguments, str):
            return ERROR_PREFIX + arguments
        call_id = getattr(ctx, "tool_call_id", None)
        call = _Call()
        inner = self.inner

        async def handler(**_arguments: Any) -> Any:
            try:
                # The SDK's own invocation of the copy: argument validation, the context the
                # tool declares, a sync tool in a worker thread.
                return await _tool.invoke_function_tool(
                    function_tool=inner, context=ctx, arguments=arguments_json)
            except walj.ToolOutcomeUnknown:
                raise
            except Exception as exc:
                call.error = exc
                raise

        valid_id = call_id if isinstance(call_id, str) and call_id else None
        approval = self.approval is not None and await self.approval.needed(
            ctx, arguments, valid_id)
        done = await dispatch_call(self.journal, self.original.name, arguments, valid_id,
                                   walj.Tool(handler), approval)
        return await self._answer(ctx, done, call)

    async def _answer(self, ctx: ToolContext[Any], done: walj.ToolResult, call: _Call) -> Any:
        answer = approval_answer(done)
        if answer is not None:  # awaiting, denied or past its approval: nothing ran
            return approval_text(answer)
        if done.outcome == "blocked":
            return BLOCKED_PREFIX + blocked_answer(done, self.blocked_message, self.journal)
        if done.outcome == "refused":
            return BLOCKED_PREFIX + (done.error or f"walj answered {done.outcome}")
        if done.outcome == "ok":
            return done.output
        error: Exception = call.error if call.error is not None else _ReplayedError(
            done.error or f"the call ended {done.outcome}")
        shown = await _tool.maybe_invoke_function_tool_failure_error_function(
            function_tool=self.original, context=ctx, error=error)
        if shown is None:  # the tool was built to raise (failure_error_function=None)
            raise error
        return shown


def _arguments(text: Any) -> dict[str, Any] | str:
    """The model's JSON text as keyword arguments, or why it cannot be used."""
    if text is None or text == "":
        return {}
    if not isinstance(text, str):
        return f"arguments must be JSON text, not {type(text).__name__}"
    try:
        parsed = json.loads(text, parse_constant=_not_json)
    except ValueError as exc:
        return f"arguments are not valid JSON: {exc}"
    except RecursionError:
        return "arguments are nested too deeply to parse"
    if not isinstance(parsed, dict):
        return f"arguments must be a JSON object, not {type(parsed).__name__}"
    return parsed


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _journaled(tool: Any, journal: walj.ToolJournal, index: int,
               blocked_message: BlockedMessage) -> FunctionTool:
    if not isinstance(tool, _tool.FunctionTool):
        name = getattr(tool, "name", None)
        raise TypeError(
            f"tool {index} ({name!r}, a {type(tool).__name__}) cannot be journaled: only "
            "FunctionTools (@function_tool) run in this process through on_invoke_tool; "
            "hosted and other tool kinds run elsewhere")
    original: FunctionTool = tool
    if isinstance(original.on_invoke_tool, _JournaledInvoker):
        raise TypeError(f"tool {original.name!r} is journaled already")
    inner = copy.copy(original)  # the SDK's own copy: its invoker is rebound to the copy
    # An exception must reach walj, so the copy has no failure policy (the SDK's
    # `failure_error_function=None`); the original's formats it afterwards. The timeout stays
    # on the outer tool, where cancelling it leaves the execution ambiguous.
    inner._failure_error_function = None
    inner._use_default_failure_error_function = False
    inner.timeout_seconds = None
    inner.needs_approval = False  # the outer tool's, below, is what the SDK asks
    outer = copy.copy(original)
    approval = None
    if original.needs_approval is not False:
        approval = JournaledApproval(
            original.name, original.needs_approval, journal,
            lambda name, arguments, call_id, tool, needed: dispatch_call(
                journal, name, arguments, call_id, tool, needed))
        outer.needs_approval = approval
    outer.on_invoke_tool = _JournaledInvoker(original, inner, journal, blocked_message,
                                             approval)
    return outer


def journal_tools(tools: Sequence[Any], journal: walj.ToolJournal, *,
                  blocked_message: BlockedMessage = None) -> list[FunctionTool]:
    """The tools, journaled: new FunctionTools (the originals are left as they are) whose
    calls go through `journal`. `blocked_message`: the text the model gets (after
    `BLOCKED_PREFIX`) for a call the journal blocked, instead of walj's (a string, or a
    function of the blocked `walj.ToolResult`). Raises TypeError, before anything is wrapped,
    for a journal
    that is not a `walj.ToolJournal`, for `tools` that is not a list, and for a tool that is
    not a FunctionTool (hosted tools, computer, shell, MCP servers' tools are not in
    `agent.tools`) or is journaled already."""
    if not isinstance(journal, walj.ToolJournal):
        raise TypeError(f"journal must be a walj.ToolJournal, not {type(journal).__name__}")
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools must be a list of FunctionTools, not {type(tools).__name__}")
    check_blocked_message(blocked_message)
    return [_journaled(tool, journal, index, blocked_message)
            for index, tool in enumerate(tools)]


class WaljSessions:
    """The journals of an application's SDK sessions, one per session id under `root`, each
    opened with `ToolJournal.open_session(root, session_id, store_outputs=True,
    **journal_options)` and held only while a run of it is under way or it is idle for less
    than `idle_timeout` seconds (None: until released). Thread-safe.

        sessions = WaljSessions("journals")
        async with sessions.run(session.session_id) as journal:
            agent = Agent(..., tools=journal_tools([charge_card], journal))
            result = await Runner.run(agent, request, session=session)
    """

    def __init__(self, root: str | os.PathLike[str], *,
                 idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
                 max_open: int = DEFAULT_MAX_OPEN, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 **journal_options: Any) -> None:
        self._journals = SessionJournals(
            root, JournalOnly, options={"store_outputs": True, **journal_options},
            idle_timeout=idle_timeout, max_open=max_open, lock_timeout=lock_timeout)

    @asynccontextmanager
    async def run(self, session_id: str) -> AsyncIterator[walj.ToolJournal]:
        """One run of the session: its journal, held open and bracketed as one walj turn
        (`journaled_run`) until the block ends."""
        held = await self._journals.aacquire(session_id)
        try:
            async with journaled_run(held.journal):
                yield held.journal
        finally:
            self._journals.done(session_id, held)

    def journal(self, session_id: str) -> walj.ToolJournal:
        """The session's journal, opened if needed: for inspecting or resolving it. Once idle
        it may be closed; the next run opens it again."""
        return self._journals.get(session_id).journal

    def end(self, session_id: str) -> None:
        """End the session: `session_ended` is durable, then its journal is closed and
        forgotten (one with no journal yet is left alone). Its blockers stay; a later run of
        it is refused (`walj.SessionEndedError`). Refused while a run of it is under way
        (`walj.TurnError`)."""
        self._journals.end(session_id)

    def release(self, session_id: str) -> None:
        """Close the session's journal now, holding nothing of it open; its next run opens it
        again. Refused while a run of it is under way (`walj.TurnError`)."""
        self._journals.release(session_id)

    def close(self) -> None:
        """Close every journal held. Idempotent."""
        self._journals.close()

    async def __aenter__(self) -> WaljSessions:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()

    def __enter__(self) -> WaljSessions:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
