"""OpenTelemetry tracing of a walj journal: one span per tool execution, following the GenAI
semantic conventions, and a span event per resolution.

Enable it with one call, `undo = instrument(journal)`, or with one option,
`ToolJournal.open(path, observers=[SpanObserver()])` (which also traces the resolutions that
reconcile hooks and policies make while the journal opens). Both take `tracer_provider`; without
one, the global provider is used (a no-op until the application sets one).

Each dispatch that gets past its argument checks makes one span, kind INTERNAL, named
`execute_tool {tool}`, with `gen_ai.operation.name` = `execute_tool`, `gen_ai.tool.name`,
`gen_ai.tool.call.id`, `walj.execution_id`, `walj.idempotency_key` and `walj.log_id` from its
start, and `walj.outcome` at its end. It starts before the intent is written and ends once the
outcome is durable; it is the current span meanwhile, in the dispatching thread or task, so the
spans a handler makes nest under it. The status is ERROR, with `error.type`, for the outcomes
"error", "blocked" and "ambiguous" (an interrupt, a cancellation while the handler ran, or
`walj.ToolOutcomeUnknown`), and unset otherwise; an exception (the handler's, or what
interrupted the dispatch) is recorded as the span's `exception` event. Arguments and outputs are
not put on the span: they may hold what the journal's previews redact.

A durable resolution adds a `walj.resolved` event, naming the execution (`walj.execution_id`,
or `walj.turn_sequence` for a turn), `walj.resolution.kind`, `walj.resolution.outcome` and
`walj.resolution.actor`, to the current span when one is recording (the request that resolves,
say); otherwise to a span of its own, `walj resolve`, so that it is never lost. The note is not
recorded: it is a person's free text.

Importing this module imports `opentelemetry-api` (so a missing one fails here, naming the extra
`walj[otel]`); `import walj` never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import walj
from walj.journal import ExecutionEnd, ToolContext, ToolObserver

from ._require import require

require("opentelemetry.trace", "otel")

from opentelemetry import context as otel_context  # noqa: E402 - after the check above
from opentelemetry import trace  # noqa: E402

__all__ = ["SpanObserver", "instrument"]

# Spelled here rather than imported: opentelemetry-api does not ship the semantic conventions,
# and the GenAI names sit in their incubating part, which moves between packages.
OPERATION_NAME = "gen_ai.operation.name"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
ERROR_TYPE = "error.type"
EXECUTE_TOOL = "execute_tool"
ERROR_OUTCOMES = frozenset({"error", "blocked", "ambiguous", "refused"})
SCOPE = "walj"


def _error_type(error: BaseException | None, outcome: str) -> str:
    """The exception's fully qualified type (builtins unqualified), else the outcome."""
    if error is None:
        return outcome
    kind = type(error)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _description(end: ExecutionEnd) -> str:
    """walj's error text (the handler's error, the blocked message), else the interrupt's."""
    if end.result is not None and end.result.error is not None:
        return end.result.error
    if end.error is None:
        return end.outcome
    try:
        message = str(end.error)
    except Exception:  # an exception whose own __str__ fails still has a type
        message = ""
    name = type(end.error).__name__
    return f"{name}: {message}" if message else name


class SpanObserver(ToolObserver):
    """A journal observer (walj.journal.ToolObserver) that makes the spans and events this
    module describes. One observer may watch many journals."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer",
                                                                None)):
            raise TypeError("tracer_provider must be an OpenTelemetry TracerProvider or None, "
                            f"not {type(tracer_provider).__name__}")
        self._tracer = trace.get_tracer(SCOPE, walj.__version__, tracer_provider)
        # Each execution's span and the token that made it current, until its end.
        self._open: dict[str, tuple[trace.Span, Any]] = {}

    def on_start(self, context: ToolContext) -> None:
        span = self._tracer.start_span(
            f"{EXECUTE_TOOL} {context.tool}", kind=trace.SpanKind.INTERNAL,
            attributes={
                OPERATION_NAME: EXECUTE_TOOL,
                TOOL_NAME: context.tool,
                TOOL_CALL_ID: context.call_id,
                "walj.execution_id": context.execution_id,
                "walj.idempotency_key": context.idempotency_key,
                "walj.log_id": context.log_id,
            })
        # Kept before it is made current, so that on_end finds it whatever happens after.
        self._open[context.execution_id] = (span, None)
        token = otel_context.attach(trace.set_span_in_context(span))
        self._open[context.execution_id] = (span, token)

    def on_end(self, end: ExecutionEnd) -> None:
        entry = self._open.pop(end.context.execution_id, None)
        if entry is None:
            return  # its on_start never got as far as the span
        span, token = entry
        try:
            span.set_attribute("walj.outcome", end.outcome)
            if end.result is not None and end.result.replayed:
                # Answered from the settled execution's record: that execution is the one to
                # inspect or resolve, not the id this dispatch was given.
                span.set_attribute("walj.replayed", True)
                span.set_attribute("walj.execution_id", end.result.execution_id)
            if end.outcome in ERROR_OUTCOMES:
                span.set_attribute(ERROR_TYPE, _error_type(end.error, end.outcome))
                span.set_status(trace.StatusCode.ERROR, _description(end))
            if end.error is not None:  # last: it formats the exception, which may raise
                span.record_exception(end.error, escaped=end.result is None)
        finally:
            if token is not None:
                otel_context.detach(token)
            span.end()

    def on_resolved(self, resolution: walj.Resolution) -> None:
        attributes: dict[str, Any] = {
            "walj.resolution.kind": resolution.kind,
            "walj.resolution.outcome": resolution.outcome,
            "walj.resolution.actor": resolution.actor,
        }
        for key, value in (("walj.execution_id", resolution.execution_id),
                           ("walj.turn_sequence", resolution.turn_sequence),
                           (TOOL_NAME, resolution.tool)):
            if value is not None:
                attributes[key] = value
        current = trace.get_current_span()
        if current.is_recording():
            current.add_event("walj.resolved", attributes)
            return
        with self._tracer.start_as_current_span("walj resolve", attributes=attributes) as span:
            span.add_event("walj.resolved", attributes)


def instrument(journal: walj.ToolJournal, *,
               tracer_provider: trace.TracerProvider | None = None) -> Callable[[], None]:
    """Trace every later execution and resolution of `journal`; returns a function that stops
    it (calling it again does nothing). Resolutions made while the journal opened are not
    traced: for those, open it with `observers=[SpanObserver(...)]`."""
    if not isinstance(journal, walj.ToolJournal):
        raise TypeError(f"instrument takes a walj.ToolJournal, not {type(journal).__name__}")
    observer = SpanObserver(tracer_provider)
    journal.add_observer(observer)

    def uninstrument() -> None:
        if any(o is observer for o in journal.observers):
            journal.remove_observer(observer)

    return uninstrument
