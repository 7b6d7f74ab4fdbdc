"""Tools and calls: the Tool registration, the context and result types, handler invocation,
function-call normalisation, and handle_function_calls (through a journal or without one)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from .._codec import NestingError
from ..errors import ApprovalError, SerializationError, ToolBlocked, ToolCancelled
from ._fingerprint import ERROR_CHARS as ERROR_CHARS
from ._fingerprint import Digest, describe_error
from ._records import Blocker

ON_AMBIGUOUS = ("fail", "assume_done", "rerun")

Reconcile = Callable[[Blocker], "str | None"]


class ToolContext(NamedTuple):
    """Passed to a handler that has a parameter named `context`. The idempotency key is the
    same after a restart, so a downstream API can deduplicate with it."""

    execution_id: str
    idempotency_key: str
    tool: str
    call_id: str
    turn_sequence: int
    arguments_sha256: str
    log_id: str


def takes_context(handler: Callable[..., Any]) -> bool:
    try:
        parameter = inspect.signature(handler).parameters.get("context")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


@dataclass(frozen=True)
class Tool:
    """A handler with its recovery policy.

    `on_ambiguous` settles an interrupted execution of this tool on open: "fail" (the default)
    leaves it blocking, "assume_done" resolves it as succeeded, "rerun" resolves it as "rerun"
    (safe to dispatch again). `reconcile(blocker)` is asked first and may answer "succeeded",
    "not_performed" or None (unknown). `guard(context)` runs after the intent is durable and
    before the handler; raising ToolBlocked or ToolCancelled there refuses the call.
    `approval`: True when every call needs a person's approval, or `policy(arguments) -> bool`
    deciding per call (one that raises or answers a non-bool: the call needs it); see
    docs/RECOVERY.md, "Approvals".
    """

    handler: Callable[..., Any]
    on_ambiguous: str = "fail"
    reconcile: Reconcile | None = None
    guard: Callable[[ToolContext], Any] | None = None
    approval: bool | Callable[[Mapping[str, Any]], Any] = False
    wants_context: bool = field(init=False, repr=False, compare=False, default=False)
    # Asked once here rather than on every dispatch (inspect's test is not cheap).
    is_async: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        if not callable(self.handler):
            raise TypeError(f"a tool handler must be callable, not {type(self.handler).__name__}")
        if self.on_ambiguous not in ON_AMBIGUOUS:
            raise ValueError(
                f"on_ambiguous must be one of {', '.join(ON_AMBIGUOUS)}, not {self.on_ambiguous!r}"
            )
        if self.reconcile is not None and not callable(self.reconcile):
            raise TypeError("reconcile must be callable or None")
        if self.guard is not None and not callable(self.guard):
            raise TypeError("guard must be callable or None")
        if not isinstance(self.approval, bool) and not callable(self.approval):
            raise TypeError("approval must be True, False or a callable policy(arguments)")
        object.__setattr__(self, "wants_context", takes_context(self.handler))
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.handler))


def as_tool(value: Any, name: str = "?") -> Tool:
    if isinstance(value, Tool):
        return value
    if callable(value):
        return Tool(value)
    raise TypeError(f"tool {name!r} must be a callable or a walj.Tool, not {type(value).__name__}")


def tools_from(tools: Mapping[str, Any] | None) -> dict[str, Tool]:
    if tools is None:
        return {}
    if not isinstance(tools, Mapping):
        raise TypeError("tools must map tool names to callables or walj.Tool objects")
    out: dict[str, Tool] = {}
    for name, value in tools.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"tool names must be non-empty strings, not {name!r}")
        out[name] = as_tool(value, name)
    return out


class ToolResult(NamedTuple):
    """The result of one dispatch. `outcome` is "ok", "error", "cancelled", "blocked",
    "refused" (a settled call id that replay cannot answer, or arguments other than the
    approved ones: nothing ran), "awaiting_approval", "denied" or "approval_expired" (the
    call needs approval: nothing ran, execution_id is ""). `replayed`: no handler ran, the
    outcome was answered from the record of the settled call with this call id, whose
    execution_id this is. `approval_id`: the approval the call awaits, was answered by, or
    consumed to run."""

    name: str
    call_id: str
    arguments: Any
    output: Any
    error: str | None
    outcome: str
    execution_id: str
    replayed: bool = False
    approval_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The five keys handle_function_calls returns."""
        return {
            "name": self.name,
            "call_id": self.call_id,
            "arguments": self.arguments,
            "output": self.output,
            "error": self.error,
        }


def invoke(tool: Tool, arguments: Mapping[str, Any], context: ToolContext | None) -> Any:
    """Call the handler with the arguments as keywords (and the context when it takes one)."""
    if context is not None and tool.wants_context:
        return tool.handler(**arguments, context=context)
    return tool.handler(**arguments)


def outcome_of(exc: Exception) -> str:
    if isinstance(exc, ToolCancelled):
        return "cancelled"
    if isinstance(exc, ToolBlocked):
        return "blocked"
    return "error"


# --- function calls -------------------------------------------------------------------------


class Call(NamedTuple):
    """A normalised function call. `problem` is set when the arguments could not be parsed
    (or, with a journal, stored); such a call gets an error result and runs nothing. `text`:
    the arguments came as JSON text, from the model. `digest`: their fingerprint and preview,
    when normalise_calls was given `describe`."""

    name: str
    arguments: Any
    call_id: str | None
    problem: str | None
    text: bool = False
    digest: Digest | None = None


def _get(call: Any, key: str) -> Any:
    if isinstance(call, Mapping):
        return call.get(key)
    return getattr(call, key, None)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")  # Python's json module would take NaN as a float


def normalise_call(call: Any, index: int) -> Call:
    """Accepts {"name", "arguments", "call_id"} or an OpenAI-style tool call (a dict or an SDK
    object with .id and .function.name / .function.arguments, arguments as a JSON string)."""
    function = _get(call, "function")
    source = function if function is not None else call
    name = _get(source, "name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"function call {index} has no tool name: {call!r:.200}")
    call_id = _get(call, "call_id") if function is None else None
    if call_id is None:
        call_id = _get(call, "id")
    if call_id is not None and not isinstance(call_id, str):
        raise ValueError(f"function call {index} has a call id that is not a string: {call_id!r}")
    arguments = _get(source, "arguments")
    if arguments is None or arguments == "":
        return Call(name, {}, call_id, None)
    text = isinstance(arguments, (str, bytes, bytearray))
    if text:
        try:
            parsed = json.loads(arguments, parse_constant=_not_json)
        except ValueError as exc:
            return Call(name, arguments, call_id, f"arguments are not valid JSON: {exc}", True)
        except RecursionError:  # the model's text, so one call's error, not the batch's
            return Call(name, arguments, call_id, "arguments are nested too deeply to parse",
                        True)
        arguments = parsed
    if not isinstance(arguments, Mapping):
        return Call(name, arguments, call_id,
                    f"arguments must be a JSON object, not {type(arguments).__name__}", text)
    return Call(name, dict(arguments), call_id, None, text)


def normalise_calls(calls: Sequence[Any] | Any,
                    describe: Callable[[Any], Digest] | None = None) -> list[Call]:
    """Every call normalised before any runs. With `describe` (the journal's fingerprint and
    preview), each call's arguments are described too. Arguments nested too deeply to
    fingerprint, or sent as JSON text that cannot be stored, make that call's error result,
    as invalid JSON does; other arguments that cannot be stored (a program passed an object
    JSON cannot hold) raise SerializationError for the whole batch, before anything ran."""
    if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
        raise TypeError("calls must be a list of function calls")
    normalised = [normalise_call(call, i) for i, call in enumerate(calls)]
    if describe is None:
        return normalised
    for index, call in enumerate(normalised):
        if call.problem is not None:
            continue
        try:
            normalised[index] = call._replace(digest=describe(call.arguments))
        except SerializationError as exc:
            if not (call.text or isinstance(exc, NestingError)):
                raise
            normalised[index] = call._replace(problem=str(exc))  # names where: arguments[...]
    return normalised


def _registry_dispatch(registry: Any, name: str) -> Callable[..., Any]:
    def handler(**arguments: Any) -> Any:
        return registry.dispatch(name, arguments)

    return handler


def lookup(registry: Any, name: str) -> Tool | None:
    """The tool `name` in a registry: a mapping of names to callables/Tools, or an object with
    dispatch(name, args)."""
    if registry is None:
        return None
    if isinstance(registry, Mapping):
        value = registry.get(name)
        return None if value is None else as_tool(value, name)
    if callable(getattr(registry, "dispatch", None)):
        return Tool(_registry_dispatch(registry, name))
    raise TypeError("a registry maps tool names to callables, or has dispatch(name, args)")


def error_result(call: Call, index: int, message: str) -> dict[str, Any]:
    return {
        "name": call.name,
        "call_id": call.call_id if call.call_id is not None else f"call-{index + 1}",
        "arguments": call.arguments,
        "output": None,
        "error": message,
    }


class _Journal(Protocol):  # ToolJournal, which imports this module
    def handle_function_calls(self, calls: Sequence[Any],
                              registry: Any = None) -> list[dict[str, Any]]: ...


def handle_function_calls(
    calls: Sequence[Any], registry: Any, journal: _Journal | None = None
) -> list[dict[str, Any]]:
    """Run function calls and return one dict per call with exactly the keys name, call_id,
    arguments, output and error. With a journal, each call goes through its durable dispatch;
    without one, handlers are simply called and exceptions become errors."""
    if journal is not None:
        return journal.handle_function_calls(calls, registry)

    def run(call: Call, index: int, tool: Tool) -> dict[str, Any]:
        entry = error_result(call, index, "")
        try:
            entry["output"] = invoke(tool, call.arguments, None)
            entry["error"] = None
        except Exception as exc:
            entry["error"] = describe_error(exc)
        return entry

    return call_results(normalise_calls(calls), lambda name: lookup(registry, name), run)


def call_results(calls: list[Call], find: Callable[[str], Tool | None],
             run: Callable[[Call, int, Tool], dict[str, Any]]) -> list[dict[str, Any]]:
    """One result dict per call: an error for a call that could not be read, names no tool, or
    needs approval but has no call id (ApprovalError, nothing written), else what `run` made
    of it."""
    results: list[dict[str, Any]] = []
    for index, call in enumerate(calls):
        if call.problem is not None:
            results.append(error_result(call, index, call.problem))
        elif (tool := find(call.name)) is None:
            results.append(error_result(call, index, f"unknown tool {call.name!r}"))
        else:
            try:
                results.append(run(call, index, tool))
            except ApprovalError as exc:
                results.append(error_result(call, index, str(exc)))
    return results
