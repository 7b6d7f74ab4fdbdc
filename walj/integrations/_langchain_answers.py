"""What the LangChain integration stores of a tool call's answer, and the ToolMessage it
rebuilds from walj's record when a call is answered without running (replay, refusal, block)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import walj

from ._require import require

_messages = require("langchain_core.messages", "langchain")
_lg_errors = require("langgraph.errors", "langchain")
_lg_types = require("langgraph.types", "langchain")

if TYPE_CHECKING:
    from langchain_core.messages import ToolMessage
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command

    Result = ToolMessage | Command[Any]
else:
    Result = Any

ANSWER_KIND = "tool_message"  # `output["kind"]` of a stored ToolMessage
COMMAND_KIND = "command"  # `output["kind"]` of a stored Command
MESSAGES_KEY = "langchain_messages"  # a list of messages in a stored Command's update


class ToolMessageError(Exception):
    """How the journal records a tool whose ToolMessage has status "error" (error_type
    "ToolMessageError", the message's content as the error). The caller gets the
    ToolMessage itself; this is never raised out of the middleware."""


class Box:
    """What the framework's handler gave during one dispatch: its answer or its exception."""

    __slots__ = ("raised", "result")

    def __init__(self) -> None:
        self.result: Any = None
        self.raised: BaseException | None = None


def call_of(request: ToolCallRequest) -> tuple[str, str, dict[str, Any]]:
    """The call id, tool name and arguments of a request, or a typed error."""
    call = request.tool_call
    call_id, name, arguments = call.get("id"), call.get("name"), call.get("args")
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(f"walj needs the tool call's id to journal it; tool call {name!r} "
                         "has none")
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool call {call_id!r} has no tool name")
    if not isinstance(arguments, Mapping):
        raise TypeError(f"tool call {call_id!r}: args must be a dict, not "
                        f"{type(arguments).__name__}")
    return call_id, name, dict(arguments)


def _paused(exc: BaseException, box: Box) -> walj.ToolBlocked:
    # A tool that calls interrupt() itself pauses; LangGraph runs it again from its start on
    # resume. Outcome "blocked" is durable, blocks nothing and is never replayed, so the
    # resumed call runs, as it would without walj.
    box.raised = exc
    return walj.ToolBlocked("paused by a LangGraph interrupt inside the tool; it runs again "
                            "when the graph is resumed")


def _recorded(result: Any, box: Box) -> Any:
    """What the journal stores of the framework's answer; raises for an error ToolMessage so
    that the journal records outcome error."""
    box.result = result
    if isinstance(result, _messages.ToolMessage):
        if result.status == "error":
            raise ToolMessageError(content_text(result.content))
        stored: dict[str, Any] = {"kind": ANSWER_KIND, "content": result.content,
                                  "name": result.name, "status": result.status}
        if result.artifact is not None and _is_json(result.artifact):
            stored["artifact"] = result.artifact
        return stored if _is_json(stored) else {**stored, "content": content_text(
            result.content)}
    command = _command_record(result)
    if command is not None:
        return command
    return {"kind": type(result).__name__, "repr": repr(result)[:2000]}


def _command_record(result: Any) -> dict[str, Any] | None:
    """A Command whose update is JSON once its message lists are written as LangChain's message
    dicts, and whose goto is node names; None for any other (kept as a repr)."""
    if not isinstance(result, _lg_types.Command) or result.resume is not None:
        return None
    goto = result.goto
    if not (isinstance(goto, str) or (isinstance(goto, (list, tuple))
                                      and all(isinstance(g, str) for g in goto))):
        return None
    update = result.update
    if isinstance(update, Mapping):
        update = {key: _messages_record(value) for key, value in update.items()}
    stored = {"kind": COMMAND_KIND, "update": update, "goto": list(goto) if isinstance(
        goto, (list, tuple)) else goto, "graph": result.graph}
    return stored if _is_json(stored) else None


def _messages_record(value: Any) -> Any:
    if (isinstance(value, (list, tuple)) and value
            and all(isinstance(m, _messages.BaseMessage) for m in value)):
        return {MESSAGES_KEY: _messages.messages_to_dict(list(value))}
    return value


def _command_rebuilt(output: Mapping[str, Any]) -> Command[Any]:
    update = output.get("update")
    if isinstance(update, Mapping):
        update = {key: _messages.messages_from_dict(value[MESSAGES_KEY])
                  if isinstance(value, Mapping) and set(value) == {MESSAGES_KEY} else value
                  for key, value in update.items()}
    command: Command[Any] = _lg_types.Command(update=update, goto=output.get("goto") or (),
                                              graph=output.get("graph"))
    return command


def sync_tool(request: ToolCallRequest, handler: Callable[[ToolCallRequest], Result],
              box: Box, approval: Any = False) -> walj.Tool:
    """The walj tool of one call: the framework's own continuation, `handler(request)`, with
    the tool's approval rule."""
    def run(**_arguments: Any) -> Any:
        try:
            result = handler(request)
        except _lg_errors.GraphBubbleUp as exc:
            raise _paused(exc, box) from exc
        except Exception as exc:
            box.raised = exc  # recorded "error" by walj, then raised as LangChain raises it
            raise
        return _recorded(result, box)
    return walj.Tool(run, approval=approval)


def async_tool(request: ToolCallRequest,
               handler: Callable[[ToolCallRequest], Awaitable[Result]], box: Box,
               approval: Any = False) -> walj.Tool:
    async def run(**_arguments: Any) -> Any:
        try:
            result = await handler(request)
        except _lg_errors.GraphBubbleUp as exc:
            raise _paused(exc, box) from exc
        except Exception as exc:
            box.raised = exc
            raise
        return _recorded(result, box)
    return walj.Tool(run, approval=approval)


def answer(done: walj.ToolResult, box: Box, request: ToolCallRequest) -> Result:
    """The ToolMessage (or Command) for what walj answered."""
    call = request.tool_call
    if box.result is not None:  # the tool ran here: its own answer, unchanged
        result: Result = box.result
        return result
    if done.outcome == "ok":  # replayed: rebuilt from the record
        return _rebuilt(done.output, call)
    error = done.error or f"walj answered {done.outcome}"
    if done.replayed and error.startswith(ToolMessageError.__name__ + ": "):
        error = error[len(ToolMessageError.__name__) + 2:]
    message: ToolMessage = _messages.ToolMessage(content=error, name=call["name"],
                                                 tool_call_id=call["id"], status="error")
    return message


def _rebuilt(output: Any, call: Mapping[str, Any]) -> Result:
    if isinstance(output, Mapping) and output.get("kind") == COMMAND_KIND:
        return _command_rebuilt(output)
    if isinstance(output, Mapping) and output.get("kind") == ANSWER_KIND:
        message: ToolMessage = _messages.ToolMessage(
            content=output.get("content", ""), name=output.get("name"),
            tool_call_id=call["id"], status=output.get("status", "success"),
            artifact=output.get("artifact"))
        return message
    if isinstance(output, Mapping) and isinstance(output.get("message"), str) and (
            output.get("status") == "already_done"):
        text = str(output["message"])
    elif isinstance(output, Mapping) and "repr" in output and "kind" in output:
        text = (f"walj: this call already ran and returned a {output['kind']}, which walj cannot "
                f"rebuild; it was not run again. Recorded: {output['repr']}")
    else:
        text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    plain: ToolMessage = _messages.ToolMessage(content=text, name=call["name"],
                                               tool_call_id=call["id"])
    return plain


def content_text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False,
                                                               default=str)


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
