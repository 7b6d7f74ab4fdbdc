"""Journaled LangChain agent and LangGraph ToolNode tool calls: `WaljMiddleware`.

`WaljMiddleware(root, **journal_options)` is an `AgentMiddleware` for
`langchain.agents.create_agent(middleware=[...])`; its `wrap_tool_call` / `awrap_tool_call`
also plug into `langgraph.prebuilt.ToolNode(wrap_tool_call=..., awrap_tool_call=...)`.

- **Session**: one journal per LangGraph thread (`config["configurable"]["thread_id"]`), opened
  with `ToolJournal.open_session(root, thread_id, store_outputs=True, ...)` when a call of the
  thread comes, held while a call of it runs, and closed once idle for `idle_timeout` seconds
  (at most `max_open` open at once; the next call opens it again). `end(thread_id)` ends the
  thread's session (`session_ended`), `release(thread_id)` closes its journal, `close()` (or
  leaving `with WaljMiddleware(...) as walj_mw:`) closes them all. A journal another process
  holds is waited for, up to `lock_timeout` seconds.
- **Call**: `request.tool_call` gives the call id (`id`), the tool (`name`) and its arguments
  (`args`). walj's handler is the framework's own continuation, `handler(request)`, so the tool
  runs inside walj's dispatch, after its intent is durable.
- **Turn**: the tool calls of one AIMessage (one LangGraph step of parallel tool tasks) are one
  walj turn. It is completed when every call of that message has been answered in this process;
  a step that never completed stays an incomplete turn, which blocks after a crash.
- **Answer**: the ToolMessage (or Command) the tool returned. What rebuilds it (content,
  name, status and artifact; a Command's update and goto) is stored with the terminal record,
  so a re-dispatch of the same call id (LangGraph re-running a task whose result it did not
  save) is answered with an equal one, and the tool is not run again. An error ToolMessage
  or an exception is recorded as outcome `error`.
- **Blocked**: by default an error ToolMessage holding walj's message for the model, or the
  `blocked_message` option's (`on_blocked="message"`); with `on_blocked="interrupt"` (the graph
  needs a checkpointer) a `langgraph.types.interrupt` whose payload lists what blocks, raised
  before the call is dispatched. Resume with `Command(resume=answer)`, where `answer` is one
  dict, or a list of them: `{"execution_id", "outcome", "actor", "note"?, "output"?}` resolves an
  execution, `{"turn_sequence", "actor", "note"?}` an interrupted turn. The resumed task reads
  the answer and writes its resolutions first, then dispatches the call once, which replay
  answers (never running a call resolved `succeeded` or `failed`).
- **Approval**: `approval={"tool name": True | policy(arguments)}` makes those tools' calls
  wait for a person (docs/RECOVERY.md, "Approvals"). With `on_approval="interrupt"` (the
  default) in a graph with a checkpointer, the task pauses on a `langgraph.types.interrupt`
  whose payload is the request (`kind` "walj_approval", its approval id, the tool, call id,
  arguments preview and digest); `Command(resume={"approval_id", "decision": "approve" |
  "deny", "actor", "note"?, "expires_at"?})`, or `walj approve` / `walj deny` and resuming,
  decides it in the journal, and the resumed task dispatches the call once: the journal alone
  lets it run, with the approved arguments only. Otherwise the call is answered with an error
  ToolMessage holding the approval answer (docs/INTEGRATIONS.md, "The approval answer").
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import walj

from ._approvals import APPROVAL_KIND
from ._journals import DEFAULT_IDLE_TIMEOUT, DEFAULT_LOCK_TIMEOUT, DEFAULT_MAX_OPEN, SessionJournals
from ._langchain_answers import (
    Box,
    Result,
    ToolMessageError,
    answer,
    async_tool,
    call_of,
    sync_tool,
)
from ._langchain_approvals import (
    OnApproval,
    approval_message,
    await_decision,
    check_on_approval,
    check_rules,
)
from ._langchain_ask import BLOCKED_KIND, checkpointed, payload, payload_before, resolve
from ._langchain_steps import RESUMED_STEP_ACTOR, Session, StepTurn
from ._require import require
from ._shared import BlockedMessage, blocked_answer, check_blocked_message

_middleware_types = require("langchain.agents.middleware.types", "langchain")
_lg_types = require("langgraph.types", "langchain")
_lg_errors = require("langgraph.errors", "langchain")

if TYPE_CHECKING:
    from langchain.agents.middleware.types import AgentMiddleware
    from langgraph.prebuilt.tool_node import ToolCallRequest

    _Base = AgentMiddleware[Any, Any, Any]
else:
    _Base = _middleware_types.AgentMiddleware

OnBlocked = Literal["message", "interrupt"]


def thread_id_of(request: ToolCallRequest) -> str:
    """The LangGraph thread of a tool call, or ValueError: walj needs a session per thread."""
    runtime = getattr(request, "runtime", None)
    config = getattr(runtime, "config", None)
    configurable = config.get("configurable") if isinstance(config, Mapping) else None
    thread = configurable.get("thread_id") if isinstance(configurable, Mapping) else None
    if thread is None or thread == "":
        raise ValueError("walj's WaljMiddleware needs a LangGraph thread: invoke the graph with "
                         "config={'configurable': {'thread_id': ...}} (one walj journal per "
                         "thread)")
    return str(thread)


class WaljMiddleware(_Base):
    """Every tool call of a LangChain agent (or a LangGraph ToolNode) through a walj journal,
    one journal per thread under `root`. See the module's documentation."""

    def __init__(self, root: str | os.PathLike[str], *, on_blocked: OnBlocked = "message",
                 blocked_message: BlockedMessage = None,
                 approval: Mapping[str, bool | Callable[[Mapping[str, Any]], Any]] | None = None,
                 on_approval: OnApproval = "interrupt",
                 idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
                 max_open: int = DEFAULT_MAX_OPEN, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 **journal_options: Any) -> None:
        super().__init__()
        if on_blocked not in ("message", "interrupt"):
            raise ValueError(f"on_blocked must be 'message' or 'interrupt', not {on_blocked!r}")
        if "tools" in journal_options:
            raise ValueError("WaljMiddleware runs the agent's own tools, so it takes no tools= "
                             "(reconcile hooks and on_ambiguous policies do not apply to it)")
        self._on_blocked: OnBlocked = on_blocked
        self._blocked_message = check_blocked_message(blocked_message)
        self._approval = check_rules(approval)
        self._on_approval = check_on_approval(on_approval)
        self._journals = SessionJournals(
            root, Session, options={"store_outputs": True, **journal_options},
            idle_timeout=idle_timeout, max_open=max_open, lock_timeout=lock_timeout)

    @property
    def root(self) -> str:
        return self._journals.root

    @property
    def on_blocked(self) -> OnBlocked:
        return self._on_blocked

    def journal(self, thread_id: str) -> walj.ToolJournal:
        """The journal of `thread_id`, opened if needed (for inspecting or resolving it; it
        may be closed once idle, and the next call opens it again)."""
        return self._journals.get(thread_id).journal

    def end(self, thread_id: str) -> None:
        """End the thread's session: `session_ended` is durable, then its journal is closed
        and forgotten (a thread with no journal yet is left alone). Its blockers stay; a later
        call of the thread is refused (`walj.SessionEndedError`). Refused while a call of it
        runs (`walj.TurnError`)."""
        self._journals.end(thread_id)

    def release(self, thread_id: str) -> None:
        """Close the thread's journal now, holding nothing of it open; its next call opens it
        again. Refused while a call of it runs (`walj.TurnError`)."""
        self._journals.release(thread_id)

    def close(self) -> None:
        """Close every journal it holds. A step with unanswered calls is left incomplete."""
        self._journals.close()

    def __enter__(self) -> WaljMiddleware:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- the hooks ------------------------------------------------------------------------------

    def wrap_tool_call(self, request: ToolCallRequest,
                       handler: Callable[[ToolCallRequest], Result]) -> Result:
        """Run the call through its thread's journal (the hook of `create_agent` and of
        `ToolNode(wrap_tool_call=...)`)."""
        call_id, name, arguments = call_of(request)
        thread = thread_id_of(request)
        session = self._journals.acquire(thread)
        rule = self._approval.get(name, False)
        try:
            problem = self._ask_first(session, request, call_id, name)
            refused: str | None = None
            while True:
                if rule is not False and self._pauses(request):
                    refused = await_decision(session.journal, call_id, refused)
                turn = session.enter(request, call_id, rule is not False)
                while True:
                    box = Box()
                    done = turn.dispatch(name, arguments, call_id=call_id,
                                         handler=sync_tool(request, handler, box, rule))
                    if not self._asks(request, done, box):
                        break
                    problem = self._ask(session.journal, payload(done, session.journal),
                                        problem)
                if not self._awaits(request, done):
                    return self._answered(session, turn, call_id, done, box, request)
                session.answered(turn, call_id)  # the request is its answer in this turn
        finally:
            self._journals.done(thread, session)

    async def awrap_tool_call(self, request: ToolCallRequest,
                              handler: Callable[[ToolCallRequest], Awaitable[Result]]
                              ) -> Result:
        """As `wrap_tool_call`, for `ainvoke`/`astream`; the journal's blocking steps (opening,
        turn records, resolutions) run in worker threads."""
        call_id, name, arguments = call_of(request)
        thread = thread_id_of(request)
        session = await self._journals.aacquire(thread)
        rule = self._approval.get(name, False)
        try:
            problem = await asyncio.to_thread(self._ask_first, session, request, call_id, name)
            refused: str | None = None
            while True:
                if rule is not False and self._pauses(request):
                    refused = await asyncio.to_thread(await_decision, session.journal, call_id,
                                                      refused)
                turn = await asyncio.to_thread(session.enter, request, call_id,
                                               rule is not False)
                while True:
                    box = Box()
                    done = await turn.adispatch(name, arguments, call_id=call_id,
                                                handler=async_tool(request, handler, box, rule))
                    if not self._asks(request, done, box):
                        break
                    problem = await asyncio.to_thread(self._ask, session.journal,
                                                      payload(done, session.journal), problem)
                if not self._awaits(request, done):
                    return await asyncio.to_thread(self._answered, session, turn, call_id, done,
                                                   box, request)
                await asyncio.to_thread(session.answered, turn, call_id)
        finally:
            self._journals.done(thread, session)

    def _ask_first(self, session: Session, request: ToolCallRequest, call_id: str,
                   name: str) -> str | None:
        """In interrupt mode, while the journal blocks: ask a person before dispatching, so a
        resumed task reads the answer and writes its resolutions first, then dispatches the
        call once. (A first pause writes nothing; the interrupt says what blocks.)"""
        if not (self._on_blocked == "interrupt" and checkpointed(request)):
            return None
        session.adopt_new(request, call_id)
        problem: str | None = None
        while session.journal.recovery.blockers:
            asked = payload_before(session.journal, name, call_id)
            problem = self._ask(session.journal, asked, problem)
        return problem

    def _asks(self, request: ToolCallRequest, done: walj.ToolResult, box: Box) -> bool:
        """True when a person is asked: the journal blocked the call (nothing ran), and the
        graph can pause and resume (it has a checkpointer)."""
        return (self._on_blocked == "interrupt" and done.outcome == "blocked"
                and box.raised is None and box.result is None and checkpointed(request))

    def _pauses(self, request: ToolCallRequest) -> bool:
        """Whether a call awaiting approval pauses the graph: interrupt mode, and a graph that
        can resume (it has a checkpointer)."""
        return self._on_approval == "interrupt" and checkpointed(request)

    def _awaits(self, request: ToolCallRequest, done: walj.ToolResult) -> bool:
        """True when the call awaits approval and the graph pauses for it (asked next pass)."""
        return done.outcome == "awaiting_approval" and self._pauses(request)

    def _answered(self, session: Session, turn: StepTurn, call_id: str, done: walj.ToolResult,
                  box: Box, request: ToolCallRequest) -> Result:
        """The call's answer; the step's turn learns it was answered, unless the tool paused
        on an interrupt of its own (LangGraph runs it again on resume)."""
        if not isinstance(box.raised, _lg_errors.GraphBubbleUp):
            session.answered(turn, call_id)
        if box.raised is not None:
            raise box.raised  # as LangChain raises it (ToolNode's handle_tool_errors applies)
        if done.outcome == "blocked" and box.result is None:
            done = done._replace(error=blocked_answer(done, self._blocked_message,
                                                      session.journal))
        asked = approval_message(done, request)
        return asked if asked is not None else answer(done, box, request)

    @staticmethod
    def _ask(journal: walj.ToolJournal, payload: dict[str, Any],
             problem: str | None) -> str | None:
        """Pause the graph for a person (interrupt) and write their answer's resolutions; the
        caller then dispatches. A bad answer is asked again, saying what was wrong."""
        if problem is not None:
            payload["problem"] = problem
        answer = _lg_types.interrupt(payload)
        try:
            resolve(journal, answer)
        except (walj.ResolutionError, ValueError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None


__all__ = ["APPROVAL_KIND", "BLOCKED_KIND", "RESUMED_STEP_ACTOR", "OnApproval", "OnBlocked",
           "ToolMessageError", "WaljMiddleware", "resolve", "thread_id_of"]
