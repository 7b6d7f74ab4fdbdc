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

Replay. A dispatch of a call id the journal already settled runs no handler. When replay
answers it from its record, no span is made (the execution that ran has its span; a span per
re-dispatch would count one execution many times): the span current where it was dispatched,
if one is recording, gets a `walj.replayed` event naming the tool, the call id, the settled
execution (`walj.execution_id`), `walj.outcome`, `walj.log_id` and `walj.replayed` = true;
with no span recording, nothing is emitted. The span starts only once something needs it (a
span the handler starts under it, or the end of a dispatch not answered from its record),
with the time the dispatch began; if something used it before replay answered, it is ended
with `walj.replayed` = true and the settled execution's id. A refused re-dispatch (other
arguments, or an outcome replay cannot give) keeps its ERROR span, marked `walj.replayed` =
true.

A durable resolution adds a `walj.resolved` event, naming the execution (`walj.execution_id`,
or `walj.turn_sequence` for a turn), `walj.resolution.kind`, `walj.resolution.outcome` and
`walj.resolution.actor`, to the current span when one is recording (the request that resolves,
say); otherwise to a span of its own, `walj resolve`, so that it is never lost. The note is not
recorded: it is a person's free text.

Importing this module imports `opentelemetry-api` (so a missing one fails here, naming the extra
`walj[otel]`); `import walj` never imports it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
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
REFUSED_SETTLED_CALL = "refused_settled_call"  # a refusal's `output["status"]` (RECOVERY.md)
logger = logging.getLogger("walj.journal")  # where observer failures are logged


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


def _from_replay(end: ExecutionEnd) -> bool:
    """The dispatch's call id was settled before: answered from its record, or refused."""
    result = end.result
    if result is None:
        return False
    output = result.output
    return result.replayed or (result.outcome == "refused" and isinstance(output, Mapping)
                               and output.get("status") == REFUSED_SETTLED_CALL)


def _replayed_event(end: ExecutionEnd) -> None:
    """A `walj.replayed` event on the span current where the dispatch was made, if one is
    recording; nothing otherwise (no span is made for an answer no handler gave)."""
    current = trace.get_current_span()
    if not current.is_recording() or end.result is None:
        return
    current.add_event("walj.replayed", {
        TOOL_NAME: end.context.tool, TOOL_CALL_ID: end.context.call_id,
        "walj.execution_id": end.result.execution_id, "walj.outcome": end.outcome,
        "walj.log_id": end.context.log_id, "walj.replayed": True})


class _DeferredSpan(trace.Span):
    """An execution's span, started only once something needs it: a span started under it
    (the handler's), a call on it, or the end of a dispatch that was not answered from its
    record, with the time its dispatch began. So a replayed answer makes no span. A span
    processor that fails to start it is logged and leaves a non-recording span: it never
    reaches the handler."""

    def __init__(self, tracer: trace.Tracer, name: str, attributes: dict[str, Any]) -> None:
        self._tracer, self._name, self._attributes = tracer, name, attributes
        self._parent = otel_context.get_current()
        self._start = time.time_ns()
        self._lock = threading.Lock()
        self._span: trace.Span | None = None

    @property
    def made(self) -> bool:
        return self._span is not None

    def make(self) -> trace.Span:
        with self._lock:
            if self._span is None:
                try:
                    self._span = self._tracer.start_span(
                        self._name, self._parent, trace.SpanKind.INTERNAL, self._attributes,
                        start_time=self._start)
                except Exception:  # a span processor's: tracing never changes an outcome
                    logger.warning("walj observer SpanObserver raised in on_start; the call's "
                                   "outcome is unchanged", exc_info=True)
                    self._span = trace.INVALID_SPAN
            return self._span

    def get_span_context(self) -> trace.SpanContext:
        return self.make().get_span_context()

    def is_recording(self) -> bool:
        return self.make().is_recording()

    def end(self, end_time: int | None = None) -> None:
        self.make().end(end_time)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.make().set_attributes(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        self.make().set_attribute(key, value)

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        self.make().add_event(name, attributes, timestamp)

    def add_link(self, context: trace.SpanContext, attributes: Any = None) -> None:
        self.make().add_link(context, attributes)

    def update_name(self, name: str) -> None:
        self.make().update_name(name)

    def set_status(self, status: Any, description: str | None = None) -> None:
        self.make().set_status(status, description)

    def record_exception(self, exception: BaseException, attributes: Any = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        self.make().record_exception(exception, attributes, timestamp, escaped)


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
        self._open: dict[str, tuple[_DeferredSpan, Any]] = {}

    def on_start(self, context: ToolContext) -> None:
        span = _DeferredSpan(self._tracer, f"{EXECUTE_TOOL} {context.tool}", {
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
        deferred, token = entry
        if token is not None:
            otel_context.detach(token)
        if end.result is not None and end.result.replayed and not deferred.made:
            _replayed_event(end)  # answered from its record: its execution has its span
            return
        span = deferred.make()
        try:
            span.set_attribute("walj.outcome", end.outcome)
            if _from_replay(end):
                span.set_attribute("walj.replayed", True)
            if end.result is not None and end.result.replayed:
                # Answered from the settled execution's record: that execution is the one to
                # inspect or resolve, not the id this dispatch was given.
                span.set_attribute("walj.execution_id", end.result.execution_id)
            if end.outcome in ERROR_OUTCOMES:
                span.set_attribute(ERROR_TYPE, _error_type(end.error, end.outcome))
                span.set_status(trace.StatusCode.ERROR, _description(end))
            if end.error is not None:  # last: it formats the exception, which may raise
                span.record_exception(end.error, escaped=end.result is None)
        finally:
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
