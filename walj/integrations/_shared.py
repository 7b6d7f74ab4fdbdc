"""What the integrations share: reading SDK objects and dicts alike (a tool call's name and
id), a tool's answer as the text a provider's tool result carries, the answer to a blocked
call (for the model) beside the log line about it (for the developer), and the answer to a
call that awaits, was denied or outlived its approval."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import walj

LOGGER = logging.getLogger("walj.integrations")

BlockedMessage = str | Callable[[walj.ToolResult], str] | None
"""An integration's `blocked_message=` option: the text a blocked call answers the model with
(a string, or a function of the blocked `walj.ToolResult`), instead of walj's own."""

# The documented `output["status"]` of walj's blocked answer (docs/RECOVERY.md, While blocked).
BLOCKED_STATUS = "blocked_interrupted_execution"

APPROVAL_OUTCOMES = ("awaiting_approval", "denied", "approval_expired")
"""The outcomes of a call that needs approval and did not run (docs/RECOVERY.md, Approvals)."""


def field(value: Any, key: str) -> Any:
    """`value[key]` of a dict, `value.key` of an SDK object; None when absent."""
    if isinstance(value, Mapping):
        return value.get(key)
    return getattr(value, key, None)


def named_call(item: Any, index: int, what: str, id_key: str) -> tuple[str, str]:
    """(tool name, call id) of the `index`-th tool call of a provider's message (`what`: its
    kind, for the message); ValueError when either is missing or empty."""
    call_id = field(item, id_key)
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(f"{what} {index} has no {id_key}: {item!r:.200}")
    name = field(item, "name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} {index} has no tool name: {item!r:.200}")
    return name, call_id


def output_text(output: Any) -> str:
    """A `str` as it is; anything else as JSON (objects JSON has no type for as their
    `str()`); when even that fails, its `repr()`."""
    if isinstance(output, str):
        return output
    try:
        return json.dumps(output, ensure_ascii=False, allow_nan=False, default=str)
    except Exception:  # the handler already ran: say what it gave, whatever it is
        pass
    try:
        return repr(output)
    except Exception:
        return f"<unrepresentable {type(output).__name__}>"


def blocked_message(result: Mapping[str, Any]) -> str | None:
    """walj's message when a handle_function_calls result is a blocked call, else None."""
    output = result["output"]
    if (result["error"] is not None and isinstance(output, Mapping)
            and output.get("status") == BLOCKED_STATUS and isinstance(output.get("message"), str)):
        return str(output["message"])
    return None


def check_blocked_message(option: Any) -> BlockedMessage:
    """The option as it is, or TypeError."""
    if option is None or isinstance(option, str) or callable(option):
        return option  # type: ignore[no-any-return]
    raise TypeError("blocked_message must be a string, a function of the blocked "
                    f"walj.ToolResult returning one, or None, not {type(option).__name__}")


def blockers_listed(done: walj.ToolResult) -> list[Any]:
    """What blocks a blocked call, as its result lists it (`output["ambiguous_executions"]`)."""
    output = done.output if isinstance(done.output, Mapping) else {}
    return list(output.get("ambiguous_executions") or [])


def blocked_answer(done: walj.ToolResult, option: BlockedMessage,
                   journal: walj.ToolJournal | None = None) -> str:
    """What the model is told of a call the journal blocked: `option`'s text, else walj's.
    The developer is told what to do on the "walj.integrations" logger (a warning naming the
    journal and each execution or turn in doubt)."""
    doubts = [
        f"turn {b.get('turn_sequence')}" if b.get("state") == "interrupted_turn"
        else f"execution {b.get('execution_id')} ({b.get('tool')!r}, call {b.get('call_id')!r})"
        for b in blockers_listed(done) if isinstance(b, Mapping)]
    LOGGER.warning(
        "walj blocked tool %r (call %r) in journal %s: in doubt: %s. Resolve each "
        "(journal.resolve / journal.resolve_turn, or `walj resolve PATH ID`) once a person knows "
        "whether it took effect.", done.name, done.call_id,
        journal.path if journal is not None else "?", "; ".join(doubts) or "unknown")
    if option is None:
        return done.error or f"The tool {done.name!r} was not run."
    text = option if isinstance(option, str) else option(done)
    if not isinstance(text, str):
        raise TypeError(f"blocked_message returned a {type(text).__name__}, not a string")
    return text



def approval_answer(done: walj.ToolResult) -> dict[str, Any] | None:
    """The answer the model gets for a call that awaits approval, was denied, or whose
    approval expired (docs/INTEGRATIONS.md, "The approval answer"); None for any other result.
    Nothing ran, so it carries no output: the status, the approval's id, the call, and walj's
    message saying what happened and what to do meanwhile."""
    if done.outcome not in APPROVAL_OUTCOMES or not done.approval_id:
        return None
    return {"status": done.outcome, "approval_id": done.approval_id, "tool": done.name,
            "call_id": done.call_id,
            "message": done.error or f"The tool {done.name!r} was not run ({done.outcome})."}


def approval_text(answer: Mapping[str, Any]) -> str:
    """The approval answer as the text a tool result carries: one JSON object."""
    return json.dumps(dict(answer), ensure_ascii=False)
