"""Anthropic Messages tool use through walj: tool_use blocks in, tool_result blocks out.

One call of `handle_tool_uses` is one walj turn: the `tool_use` blocks of one model response,
run in order through `walj.handle_function_calls`, each with the block's `id` as its walj
`call_id`. With a journal, every call gets the journal's contract (intent durable before the
handler runs, outcome durable before the next call, a blocked call answered without running);
without one, handlers are simply called.

The `tool_result` content is always a string: a `str` output as it is, any other output as JSON
(`json.dumps`, `ensure_ascii=False`, objects JSON has no type for as their `str()`), and, when
even that fails, the output's `repr()`. An error, a refusal or a blocked call sets
`is_error: true` and puts walj's message in `content`. A call that awaits a person's approval,
was denied, or whose approval expired sets `is_error: true` with the approval answer (a JSON
object naming the approval id; docs/INTEGRATIONS.md, "The approval answer") as `content`.

Importing this module imports the `anthropic` SDK (so a missing SDK fails here, naming the
extra `walj[anthropic]`); the functions themselves read SDK objects and plain dicts alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import walj

from ._approvals import handle_calls
from ._require import require
from ._shared import approval_answer, approval_text, blocked_message, field, named_call, output_text

require("anthropic", "anthropic")

__all__ = ["handle_tool_uses"]


def handle_tool_uses(
    content: Any, registry: Any, journal: walj.ToolJournal | None = None
) -> list[dict[str, Any]]:
    """Run the `tool_use` blocks of one Anthropic message and return one `tool_result` block
    dict per `tool_use` block, in order: `{"type": "tool_result", "tool_use_id", "content",
    "is_error"}` (plus `toolset_name` when the `tool_use` block had one).

    `content` is a message's content (a list of blocks, SDK objects or dicts; blocks of other
    types are skipped), or the message itself. `registry` maps tool names to callables or
    `walj.Tool`s, or has `dispatch(name, arguments)`; with a journal, `None` means the tools
    the journal was opened with. With a journal every call goes through
    `journal.handle_function_calls`, in the live turn or in a turn of its own; a message
    without `tool_use` blocks returns `[]` and writes nothing.

    Raises ValueError, before anything runs, for a `tool_use` block without an id or a name,
    and, without a journal, for a call of a tool that needs approval (nothing could wait).
    What `walj.handle_function_calls` raises goes on: `walj.SerializationError` for arguments
    a program (not the model) built that JSON cannot hold; with a journal,
    `walj.ToolOutcomeUnknown` and interrupts, which leave the execution blocking.
    """
    blocks = [block for block in _blocks(content) if field(block, "type") == "tool_use"]
    if not blocks:
        return []
    calls = [_call(block, index) for index, block in enumerate(blocks)]
    results = handle_calls(calls, registry, journal)
    return [_tool_result(block, result, approval)
            for block, (result, approval) in zip(blocks, results, strict=True)]


def _blocks(content: Any) -> Sequence[Any]:
    if isinstance(content, str):
        return []  # a message whose content is plain text has no tool_use block
    if isinstance(content, Sequence):
        return content
    inner = field(content, "content")  # a whole message
    if isinstance(inner, str):
        return []
    if isinstance(inner, Sequence) and not isinstance(inner, (bytes, bytearray)):
        return inner
    raise TypeError("content must be a message's list of content blocks, or the message")


def _call(block: Any, index: int) -> dict[str, Any]:
    name, block_id = named_call(block, index, "tool_use block", "id")
    return {"name": name, "call_id": block_id,
            "arguments": _model_arguments(field(block, "input"))}


def _model_arguments(value: Any) -> Any:
    """The block's input as the JSON text the model sent, so that walj treats it as the
    model's (a problem with it is that call's error, not the batch's). A value that does not
    survive the round trip unchanged (a program built it) is passed on as it is."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # a toolset member's typed input (a pydantic model)
        value = dump(mode="json", by_alias=True, exclude_unset=True)
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False)
        if json.loads(text) == value:
            return text
    except (TypeError, ValueError, RecursionError):
        pass
    return value


def _tool_result(block: Any, result: Mapping[str, Any],
                 approval: walj.ToolResult | None) -> dict[str, Any]:
    blocked = blocked_message(result)
    answered = approval_answer(approval) if approval is not None else None
    if answered is not None:  # nothing ran: the approval answer, never an output
        text, is_error = approval_text(answered), True
    elif result["error"] is None:
        text, is_error = output_text(result["output"]), False
    else:  # nothing ran when blocked, and walj's message says so
        text, is_error = (blocked if blocked is not None else str(result["error"])), True
    answer: dict[str, Any] = {"type": "tool_result", "tool_use_id": field(block, "id"),
                              "content": text, "is_error": is_error}
    toolset = field(block, "toolset_name")
    if isinstance(toolset, str):
        answer["toolset_name"] = toolset
    return answer
