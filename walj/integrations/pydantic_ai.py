"""Pydantic AI tool calls through a walj journal: a capability that runs each tool call as one
durable execution, keyed by the model's tool-call id.

`WaljCapability(journal_or_root)` goes in `Agent(capabilities=[...])`. Its `wrap_tool_execute`
dispatches every function-tool call with `turn.adispatch`, so the intent is durable before
Pydantic AI's own execution (hooks, the tool function) starts, and the outcome before the call
returns. Its `wrap_node_run` makes one walj turn of each model response's tool calls (one
`CallToolsNode`), which the calls share while they run concurrently; a response whose step never
finished (the process died) is an incomplete tool-bearing turn, and blocks after a restart.

Pydantic AI, resumed from a history that ends with a response whose calls were not answered,
re-executes those calls under the same ids in a new run. walj answers each one that already has
a terminal record or a resolution from the record (replay), without running the tool again; one
whose outcome is unknown (the process died inside it) is blocked. A blocked call raises
`ToolFailed` with walj's message (the model sees it), or, with `on_blocked="defer"`,
`CallDeferred`, so that a person answers it: see `answer_blocked`.

A `requires_approval` tool's call is deferred with its walj approval request; the next run's
`DeferredToolResults` become journal decisions (`approval_decisions` signs them), and only the
journal's approval of the call id, tool and arguments makes the call run, once
(_pydantic_ai_approvals).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import walj

from ._approvals import open_approval
from ._journals import DEFAULT_IDLE_TIMEOUT, DEFAULT_LOCK_TIMEOUT, DEFAULT_MAX_OPEN, SessionJournals
from ._require import require
from ._shared import (
    APPROVAL_OUTCOMES,
    BlockedMessage,
    blocked_answer,
    blockers_listed,
    check_blocked_message,
)

require("pydantic_ai", "pydantic-ai")  # first: a missing extra is named, not a bare import

from pydantic_ai import CallToolsNode, RunContext  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.exceptions import (  # noqa: E402
    ApprovalRequired,
    CallDeferred,
    ModelRetry,
    ToolFailed,
)
from pydantic_ai.messages import ModelRequest, ToolCallPart  # noqa: E402
from pydantic_ai.tools import ToolDefinition, ToolDenied  # noqa: E402
from pydantic_core import to_jsonable_python  # noqa: E402

from ._pydantic_ai_answers import (  # noqa: E402
    ACTOR,
    ANSWER_OUTCOMES,
    METADATA_KEY,
    answer_blocked,
    apply_answer,
)
from ._pydantic_ai_approvals import (  # noqa: E402
    approval_decisions,
    ask_only,
    changed_arguments,
    deferral,
    journal_answers,
    needs_approval,
    record_decisions,
)

if TYPE_CHECKING:
    from pydantic_ai.capabilities import (
        AgentNode,
        NodeResult,
        WrapNodeRunHandler,
        WrapToolExecuteHandler,
    )

OnBlocked = Literal["fail", "defer"]


def attempt_call_id(ctx: RunContext[Any], call: ToolCallPart) -> str:
    """The walj call id of this attempt at `call`: its tool-call id, and, once the model has
    been asked to retry that id (`ModelRetry`) and sends it again, `<id>#retry-<n>`.

    Counted from the message history, so a run resumed from it derives the same id for the
    same attempt (which replay then answers), while a retry under a repeated id (a model that
    reuses ids, such as `TestModel`) is a new call, not the old error replayed."""
    retried = 0
    for message in ctx.messages:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if getattr(part, "tool_call_id", None) != call.tool_call_id:
                continue
            if (getattr(part, "part_kind", None) == "retry-prompt"
                    or getattr(part, "outcome", None) == "retried"):
                retried += 1
    return call.tool_call_id if retried == 0 else f"{call.tool_call_id}#retry-{retried}"


def journal_output(value: Any) -> Any:
    """A tool's return value as JSON, as the journal stores it and replay returns it."""
    try:
        return to_jsonable_python(value)
    except Exception:  # the tool already ran: describe what it gave, whatever it is
        try:
            return repr(value)
        except Exception:
            return f"<unrepresentable {type(value).__name__}>"


def _replayed_error(text: str) -> Exception:
    """What a replayed error answers: a retry stays a retry, anything else is a failure the
    model sees (walj keeps the error's text, not the exception object)."""
    prefix = "ToolRetryError: "
    if text.startswith(prefix):
        return ModelRetry(text[len(prefix):])
    return ToolFailed(
        f"walj: this call already ran and failed (answered from the journal, not run "
        f"again): {text}")


class _Attempt:
    """One call's fate, shared by walj's handler and `wrap_tool_execute`."""

    __slots__ = ("ran", "value", "error")

    def __init__(self) -> None:
        self.ran = False
        self.value: Any = None
        self.error: BaseException | None = None


class _Session:
    """One conversation's journal and its live turn (the response whose calls are running)."""

    __slots__ = ("journal", "turn")

    def __init__(self, journal: walj.ToolJournal) -> None:
        self.journal = journal
        self.turn: Any = None  # the live walj turn while a response's calls run

    def close(self) -> None:
        self.journal.close()  # a live turn is left incomplete, as after a crash


class WaljCapability(AbstractCapability[Any]):
    """Runs every function-tool call of an agent through a walj journal.

    `journal_or_root`: a `walj.ToolJournal` (every run uses it; one run at a time), or a
    directory under which each conversation gets its own journal, opened with
    `ToolJournal.open_session(root, ctx.conversation_id, store_outputs=True, **journal_options)`
    when a call of it comes, held while a run's step or call of it is under way, and closed once
    idle for `idle_timeout` seconds (None: never), at most `max_open` open at once; a journal
    another process holds is waited for up to `lock_timeout` seconds.
    `on_blocked`: "fail" (a blocked call raises `ToolFailed` with walj's message) or "defer"
    (it raises `CallDeferred`; the agent's `output_type` must include `DeferredToolRequests`).
    `blocked_message`: the text the model gets for a blocked call instead of walj's (a string,
    or a function of the blocked `walj.ToolResult`).
    """

    def __init__(self, journal_or_root: walj.ToolJournal | str | os.PathLike[str], *,
                 on_blocked: OnBlocked = "fail", blocked_message: BlockedMessage = None,
                 idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
                 max_open: int = DEFAULT_MAX_OPEN, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 **journal_options: Any) -> None:
        if on_blocked not in ("fail", "defer"):
            raise ValueError(f"on_blocked must be 'fail' or 'defer', not {on_blocked!r}")
        self._blocked_message = check_blocked_message(blocked_message)
        self._given: _Session | None = None
        self._journals: SessionJournals[_Session] | None = None
        if isinstance(journal_or_root, walj.ToolJournal):
            if journal_options:
                raise TypeError("journal options are for a root; this journal is already open")
            self._given = _Session(journal_or_root)
            self._where = repr(journal_or_root)
        elif isinstance(journal_or_root, (str, os.PathLike)):
            self._journals = SessionJournals(
                Path(journal_or_root), _Session,
                options={"store_outputs": True, **journal_options}, idle_timeout=idle_timeout,
                max_open=max_open, lock_timeout=lock_timeout)
            self._where = repr(str(Path(journal_or_root)))
        else:
            raise TypeError("journal_or_root must be a walj.ToolJournal or a directory, not "
                            f"{type(journal_or_root).__name__}")
        self.on_blocked: OnBlocked = on_blocked
        self._closed = False

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built from a journal or a path, not from an agent spec

    def __repr__(self) -> str:
        return f"<walj.integrations.pydantic_ai.WaljCapability {self._where} {self.on_blocked}>"

    # --- journals -------------------------------------------------------------------------------

    def journal_for(self, conversation_id: str) -> walj.ToolJournal:
        """The journal of a conversation (the one journal when built with one), opened if
        needed: for inspecting or resolving what blocks it. Once idle it may be closed; the
        next call of the conversation opens it again."""
        if self._journals is None:
            return self._use().journal
        return self._journals.get(self._key(conversation_id)).journal

    def end(self, conversation_id: str) -> None:
        """End the conversation's session: `session_ended` is durable, then its journal is
        closed and forgotten (one with no journal yet is left alone). Its blockers stay; a
        later run of it is refused (`walj.SessionEndedError`). Refused while a run of it is in
        a step (`walj.TurnError`). Built with a journal: ends that journal."""
        if self._journals is None:
            self._use().journal.end()
        else:
            self._journals.end(self._key(conversation_id))

    def release(self, conversation_id: str) -> None:
        """Close the conversation's journal now, holding nothing of it open; its next call
        opens it again. Refused while a run of it is in a step (`walj.TurnError`). Built with
        a journal, there is nothing to release (the caller owns it)."""
        if self._journals is not None:
            self._journals.release(self._key(conversation_id))

    def _key(self, conversation_id: str | None) -> str:
        if self._closed:
            raise walj.ClosedError("this WaljCapability was closed")
        if not conversation_id:
            raise ValueError("the run has no conversation_id; walj keys a journal by it")
        return conversation_id

    def _use(self) -> _Session:
        """The given journal's session (nothing opened, no run counted)."""
        if self._closed or self._given is None:
            raise walj.ClosedError("this WaljCapability was closed")
        return self._given

    async def _acquire(self, conversation_id: str | None) -> _Session:
        if self._journals is None:
            return self._use()
        return await self._journals.aacquire(self._key(conversation_id))

    def _done(self, conversation_id: str | None, session: _Session) -> None:
        if self._journals is not None and conversation_id:
            self._journals.done(conversation_id, session)

    def close(self) -> None:
        """Close every journal this capability opened (not one it was given). Idempotent."""
        self._closed = True
        if self._journals is not None:
            self._journals.close()

    def __enter__(self) -> WaljCapability:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        except walj.WaljError:
            if exc is None:
                raise

    # --- turns ----------------------------------------------------------------------------------

    async def wrap_node_run(self, ctx: RunContext[Any], *, node: AgentNode[Any],
                            handler: WrapNodeRunHandler[Any]) -> NodeResult[Any]:
        """One walj turn around a response's tool calls. Left normally, or by an ordinary
        exception (every call's outcome is then recorded), the turn is completed; left by an
        interrupt (a cancelled run) or never left (a crash), it is not, and blocks after a
        restart as an interrupted turn unless one of its calls already blocks."""
        if not (isinstance(node, CallToolsNode) and node.model_response.tool_calls):
            return await handler(node)
        session = await self._acquire(ctx.conversation_id)
        try:
            if session.turn is not None:  # a nested step: its calls join the live turn
                return await handler(node)
            if getattr(node, "tool_call_results", None):  # resumed with a person's answers
                record_decisions(session.journal, node, {
                    call.tool_call_id: attempt_call_id(ctx, call)
                    for call in node.model_response.tool_calls})
            failure: Exception | None = None
            async with session.journal.turn() as turn:
                session.turn = turn
                try:
                    return await handler(node)
                except Exception as exc:
                    failure = exc  # leave the block normally: the turn is completed
                finally:
                    session.turn = None
            assert failure is not None
            raise failure
        finally:
            self._done(ctx.conversation_id, session)

    # --- approvals ------------------------------------------------------------------------------

    async def after_tool_validate(self, ctx: RunContext[Any], *, call: ToolCallPart,
                                  tool_def: ToolDefinition, args: dict[str, Any]) -> Any:
        """A call of a `requires_approval` tool that Pydantic AI defers is deferred with its
        walj approval request (written the first time; the same one while it is pending), so
        the run's `DeferredToolRequests.metadata[id]["walj"]` names the approval."""
        if ctx.tool_call_approved or not needs_approval(tool_def):
            return args
        session = await self._acquire(ctx.conversation_id)
        try:
            journal = session.journal
            call_id = attempt_call_id(ctx, call)
            current = open_approval(journal, call_id, call.tool_name)
            if current is None:
                done = await self._dispatch(session, call.tool_name, call.args_as_dict(),
                                            call_id, walj.Tool(ask_only), approval=True)
                if done.outcome != "awaiting_approval" or done.approval_id is None:
                    # Answered otherwise (settled, blocked, denied, expired): the journal
                    # gives that answer when Pydantic AI executes the approved call.
                    return args
                current = journal.approval(done.approval_id)
        finally:
            self._done(ctx.conversation_id, session)
        raise deferral(current)

    # --- calls ----------------------------------------------------------------------------------

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart,
                                tool_def: ToolDefinition, args: dict[str, Any],
                                handler: WrapToolExecuteHandler) -> Any:
        session = await self._acquire(ctx.conversation_id)
        try:
            return await self._execute(ctx, session, call, args, handler,
                                       needs_approval(tool_def))
        finally:
            self._done(ctx.conversation_id, session)

    async def _dispatch(self, session: _Session, name: str, arguments: dict[str, Any],
                        call_id: str, tool: walj.Tool, *, approval: bool) -> walj.ToolResult:
        """One dispatch in the step's walj turn, or in a turn of its own outside a step."""
        options: dict[str, Any] = {"approval": True} if approval else {}
        if session.turn is not None:
            done: walj.ToolResult = await session.turn.adispatch(
                name, arguments, call_id=call_id, handler=tool, **options)
            return done
        async with session.journal.turn() as own:  # a call outside a model response's step
            return await own.adispatch(name, arguments, call_id=call_id, handler=tool,
                                       **options)

    async def _execute(self, ctx: RunContext[Any], session: _Session, call: ToolCallPart,
                       args: dict[str, Any], handler: WrapToolExecuteHandler,
                       approval: bool) -> Any:
        if ctx.tool_call_approved:
            if approval and changed_arguments(ctx.messages, call):
                raise ToolFailed(
                    "walj: not run: the approval changes the call's arguments "
                    "(override_args); an approval covers only the arguments its request "
                    "was made for")
            apply_answer(session.journal, ctx.tool_call_metadata)
        attempt = _Attempt()

        async def run(**_arguments: Any) -> Any:
            try:
                value = await handler(args)
            except (CallDeferred, ApprovalRequired) as exc:
                # The tool deferred itself: it refused, so the approved re-execution under the
                # same id runs (a call that only ever blocked is not settled).
                attempt.error = exc
                raise walj.ToolBlocked(f"the tool raised {type(exc).__name__}") from exc
            except Exception as exc:
                attempt.error = exc
                raise
            attempt.ran, attempt.value = True, value
            return journal_output(value)

        # The model's arguments (JSON), not the validated ones (which may hold objects JSON
        # cannot store): the same call sent again has the same fingerprint.
        done = await self._dispatch(session, call.tool_name, call.args_as_dict(),
                                    attempt_call_id(ctx, call), walj.Tool(run),
                                    approval=approval)
        if attempt.ran:
            return attempt.value  # what the tool returned, not the journal's JSON copy
        if attempt.error is not None:
            raise attempt.error  # recorded; raised as Pydantic AI raises it without walj
        return self._answer(done, session.journal)

    def _answer(self, done: walj.ToolResult, journal: walj.ToolJournal) -> Any:
        """The answer to a call walj did not run: blocked, replayed, refused, or waiting for,
        denied or past an approval."""
        if done.outcome == "awaiting_approval" and done.approval_id is not None:
            raise deferral(journal.approval(done.approval_id), done.error)
        if done.outcome in APPROVAL_OUTCOMES:
            return ToolDenied(done.error or f"walj answered {done.outcome}; nothing ran")
        if done.outcome == "blocked":
            message = blocked_answer(done, self._blocked_message, journal)
            if self.on_blocked == "defer":
                raise CallDeferred(metadata={METADATA_KEY: {
                    "execution_id": done.execution_id,
                    "call_id": done.call_id,
                    "message": message,
                    "blockers": blockers_listed(done),
                }})
            raise ToolFailed(message)
        if done.outcome == "ok":
            return done.output  # replayed: the stored output, or the resolution's
        if done.outcome == "error" and done.error:
            raise _replayed_error(done.error)
        raise ToolFailed(done.error or f"walj answered {done.outcome!r}; nothing ran")


__all__ = ["ACTOR", "ANSWER_OUTCOMES", "METADATA_KEY", "WaljCapability", "answer_blocked",
           "approval_decisions", "attempt_call_id", "journal_answers", "journal_output"]
