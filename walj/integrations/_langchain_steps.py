"""One LangGraph thread's journal and the walj turn of its live step: the tool calls of one
AIMessage, which LangGraph runs as parallel tasks, and which a resumed step dispatches again."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import walj

from ._approvals import awaits_run

if TYPE_CHECKING:
    from langgraph.prebuilt.tool_node import ToolCallRequest


def step_of(request: ToolCallRequest, call_id: str) -> tuple[tuple[str, ...], set[str]]:
    """The step (the ids of every tool call of the AIMessage holding `call_id`) and those of
    its calls not answered yet in the state. A call without such a message is a step alone."""
    state = request.state
    messages = state.get("messages") if isinstance(state, Mapping) else getattr(
        state, "messages", None)
    if isinstance(messages, Sequence):
        answered = {getattr(m, "tool_call_id", None) for m in messages
                    if getattr(m, "type", None) == "tool"}
        for message in reversed(messages):
            calls = getattr(message, "tool_calls", None) or []
            ids = tuple(str(c.get("id")) for c in calls if isinstance(c, Mapping))
            if call_id in ids:
                return ids, {i for i in ids if i not in answered} | {call_id}
    return (call_id,), {call_id}


class StepTurn(Protocol):
    """What the middleware uses of a live walj turn (`journal.turn()`)."""

    def __enter__(self) -> Any: ...
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...
    def dispatch(self, name: str, arguments: Mapping[str, Any], *, call_id: str | None = None,
                 handler: Any = None) -> walj.ToolResult: ...
    async def adispatch(self, name: str, arguments: Mapping[str, Any], *,
                        call_id: str | None = None, handler: Any = None) -> walj.ToolResult: ...


RESUMED_STEP_ACTOR = "walj.integrations.langchain"
"""The actor of the turn resolution written when LangGraph resumes a step whose earlier turn
was interrupted after every one of its calls had settled."""


def _turn_call_ids(journal: walj.ToolJournal, sequence: int) -> set[str]:
    """Every call id the journal's records give for turn `sequence` (intents, blocked,
    replayed and refused calls): the more a turn holds, the less it is taken for a step's."""
    ids: set[str] = set()
    for record in walj.read(journal.path):
        data = record.data
        if (isinstance(data, dict) and data.get("turn_sequence") == sequence
                and isinstance(data.get("call_id"), str)):
            ids.add(data["call_id"])
    return ids


class Session:
    """One thread's journal and its live step: the walj turn holding the step's calls."""

    def __init__(self, journal: walj.ToolJournal) -> None:
        self.journal = journal
        self.lock = threading.Lock()
        self.step: tuple[str, ...] | None = None
        self.turn: StepTurn | None = None
        self.pending: set[str] = set()

    def adopt(self, step: tuple[str, ...]) -> None:
        """LangGraph resumes a step by running its unsaved tool tasks again, with the same call
        ids. An interrupted turn (every execution in it settled) whose calls all belong to this
        step is that step's earlier attempt: replay answers its calls, so it is resolved, with
        a note, rather than blocking the step's calls that never ran."""
        for blocker in self.journal.recovery.blockers:
            if blocker.state != "interrupted_turn" or blocker.turn_sequence is None:
                continue
            ids = _turn_call_ids(self.journal, blocker.turn_sequence)
            if ids and ids <= set(step):
                self.journal.resolve_turn(blocker.turn_sequence, actor=RESUMED_STEP_ACTOR, note=(
                    "LangGraph resumed this step; its calls are dispatched again with the same "
                    "ids, and replay answers those that settled: " + ", ".join(sorted(ids))))

    def adopt_new(self, request: ToolCallRequest, call_id: str) -> None:
        """`adopt` the call's step when it is not the live one."""
        step, _unanswered = step_of(request, call_id)
        with self.lock:
            if self.step != step:
                self.adopt(step)

    def enter(self, request: ToolCallRequest, call_id: str, approvable: bool = False) -> StepTurn:
        """The live turn of the call's step, starting it (and leaving an earlier step's turn
        incomplete, so that it blocks) when the step is new. `approvable`: the call's tool
        has an approval rule."""
        step, unanswered = step_of(request, call_id)
        with self.lock:
            if self.turn is None or self.step != step:
                if self.turn is not None:  # abandoned with calls unanswered: incomplete
                    self.turn.__exit__(RuntimeError, RuntimeError("step abandoned"), None)
                self.turn = None
                self.adopt(step)
                waiting = self.resumed(unanswered, call_id) if approvable else unanswered
                turn: StepTurn = self.journal.turn()
                turn.__enter__()
                self.turn, self.step, self.pending = turn, step, waiting
            self.pending.add(call_id)
            return self.turn

    def resumed(self, unanswered: set[str], call_id: str) -> set[str]:
        """The calls a new turn of the step waits for. A call with an approval request is
        dispatched again when LangGraph resumes the task that paused for it; of the step's
        other calls, only those doing the same will come (the rest finished before the pause,
        though the state does not show it yet)."""
        waiting = awaits_run(self.journal)
        if call_id not in waiting:
            return unanswered
        return {c for c in unanswered if c in waiting} | {call_id}

    def answered(self, turn: StepTurn, call_id: str) -> None:
        """A call of the step got its answer: the last one completes the turn."""
        with self.lock:
            if self.turn is not turn:
                return
            self.pending.discard(call_id)
            if not self.pending:
                self.turn, self.step = None, None
                turn.__exit__(None, None, None)

    def close(self) -> None:
        with self.lock:
            if self.turn is not None:  # calls unanswered: left incomplete, as after a crash
                try:
                    self.turn.__exit__(RuntimeError, RuntimeError("closed"), None)
                finally:
                    self.turn = None
            self.journal.close()
