"""OpenAI Responses function calls through walj: function_call items in, function_call_output out.

One call of `handle_response_calls` is one walj turn: the `function_call` items of one
response's output, run in order through `walj.handle_function_calls`, each with the item's
`call_id` as its walj `call_id`. Their `arguments` are the model's JSON text: text that is not
valid JSON, or not a JSON object, makes that call's error output and runs nothing. With a
journal, every call gets the journal's contract (intent durable before the handler runs,
outcome durable before the next call, a blocked call answered without running); without one,
handlers are simply called.

The `output` string: a `str` output as it is, any other output as JSON (`json.dumps`,
`ensure_ascii=False`, objects JSON has no type for as their `str()`), and, when even that
fails, the output's `repr()`. A call walj blocked gets `"not run: "` and walj's message; any
other error (bad arguments, an unknown tool, a handler that raised or refused) `"error: "` and
the error. A call that awaits a person's approval, was denied, or whose approval expired gets
the approval answer, a JSON object naming the approval id (docs/INTEGRATIONS.md, "The approval
answer").

Importing this module imports the `openai` SDK (so a missing SDK fails here, naming the extra
`walj[openai]`); the functions themselves read SDK objects and plain dicts alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import walj

from ._approvals import handle_calls
from ._require import require
from ._shared import approval_answer, approval_text, blocked_message, field, named_call, output_text

require("openai", "openai")

__all__ = ["handle_response_calls", "BLOCKED_PREFIX", "ERROR_PREFIX"]

BLOCKED_PREFIX = "not run: "
ERROR_PREFIX = "error: "


def handle_response_calls(
    items: Any, registry: Any, journal: walj.ToolJournal | None = None
) -> list[dict[str, Any]]:
    """Run the `function_call` items of one OpenAI Responses output and return one
    `{"type": "function_call_output", "call_id", "output"}` dict per `function_call` item, in
    order; other items are skipped.

    `items` is a response's `output` (a list of items, SDK objects or dicts), or the response
    itself. `registry` maps tool names to callables or `walj.Tool`s, or has
    `dispatch(name, arguments)`; with a journal, `None` means the tools the journal was opened
    with. With a journal every call goes through `journal.handle_function_calls`, in the live
    turn or in a turn of its own; an output without `function_call` items returns `[]` and
    writes nothing.

    Raises ValueError, before anything runs, for a `function_call` item without a call_id or
    a name, and, without a journal, for a call of a tool that needs approval. With a journal,
    `walj.ToolOutcomeUnknown` and interrupts go on, leaving the execution blocking.
    """
    calls = [item for item in _items(items) if field(item, "type") == "function_call"]
    if not calls:
        return []
    normalised = [_call(item, index) for index, item in enumerate(calls)]
    results = handle_calls(normalised, registry, journal)
    return [
        {"type": "function_call_output", "call_id": call["call_id"],
         "output": _output(result, approval)}
        for call, (result, approval) in zip(normalised, results, strict=True)
    ]


def _items(items: Any) -> Sequence[Any]:
    if isinstance(items, Sequence) and not isinstance(items, (str, bytes, bytearray)):
        return items
    output = None if isinstance(items, (str, bytes, bytearray)) else field(items, "output")
    if isinstance(output, Sequence) and not isinstance(output, (str, bytes, bytearray)):
        return output  # a whole response
    raise TypeError("items must be a response's list of output items, or the response")


def _call(item: Any, index: int) -> dict[str, Any]:
    name, call_id = named_call(item, index, "function_call item", "call_id")
    return {"name": name, "call_id": call_id, "arguments": field(item, "arguments")}


def _output(result: Mapping[str, Any], approval: walj.ToolResult | None) -> str:
    answered = approval_answer(approval) if approval is not None else None
    if answered is not None:  # nothing ran: the approval answer, never an output
        return approval_text(answered)
    if result["error"] is None:
        return output_text(result["output"])
    blocked = blocked_message(result)
    if blocked is not None:
        return BLOCKED_PREFIX + blocked
    return ERROR_PREFIX + str(result["error"])
