"""LangGraph's side of approvals: which tools need one, the interrupt that asks a person, and
the ToolMessage a call answered by an approval rule gets (docs/INTEGRATIONS.md, "Approvals")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import walj

from ._approvals import decide, pending_request, request_payload
from ._require import require
from ._shared import approval_answer, approval_text

_messages = require("langchain_core.messages", "langchain")
_lg_types = require("langgraph.types", "langchain")

if TYPE_CHECKING:
    from langchain_core.messages import ToolMessage
    from langgraph.prebuilt.tool_node import ToolCallRequest

OnApproval = Literal["interrupt", "message"]
Rule = bool | Callable[[Mapping[str, Any]], Any]


def check_rules(option: Any) -> dict[str, Rule]:
    """The `approval=` option (tool name to True, False or a policy of the arguments) as a
    dict, or TypeError."""
    if option is None:
        return {}
    if not isinstance(option, Mapping):
        raise TypeError("approval must map tool names to True, False or a function of the "
                        f"call's arguments, not {type(option).__name__}")
    rules: dict[str, Rule] = {}
    for name, rule in option.items():
        if not isinstance(name, str) or not (isinstance(rule, bool) or callable(rule)):
            raise TypeError(f"approval[{name!r}] must be True, False or a function of the "
                            "call's arguments, keyed by the tool's name")
        rules[name] = rule
    return rules


def check_on_approval(option: Any) -> OnApproval:
    if option not in ("interrupt", "message"):
        raise ValueError(f"on_approval must be 'interrupt' or 'message', not {option!r}")
    on_approval: OnApproval = option
    return on_approval


def await_decision(journal: walj.ToolJournal, call_id: str, problem: str | None) -> str | None:
    """While the call's request is pending: pause the graph (interrupt) with the request, and
    write the person's answer as the journal's decision. Returns once nothing is pending (the
    journal then decides what the dispatch does), with why the last answer was refused, if it
    was. Each pass makes the same interrupts in the same order, so LangGraph hands every
    resumed task its answers again; one already written is not written twice."""
    while (request := pending_request(journal, call_id)) is not None:
        answer = _lg_types.interrupt(request_payload(request, journal, problem))
        try:
            decide(journal, request, answer)
            problem = None
        except (walj.ApprovalError, ValueError, TypeError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
    return problem


def approval_message(done: walj.ToolResult, request: ToolCallRequest) -> ToolMessage | None:
    """The error ToolMessage of a call an approval rule answered (nothing ran), carrying the
    approval answer as its content and as its artifact; None for any other result."""
    answered = approval_answer(done)
    if answered is None:
        return None
    call = request.tool_call
    message: ToolMessage = _messages.ToolMessage(
        content=approval_text(answered), name=call["name"], tool_call_id=call["id"],
        status="error", artifact=answered)
    return message
