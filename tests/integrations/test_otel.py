"""walj.integrations.otel against the OpenTelemetry SDK: a real TracerProvider whose spans an
InMemorySpanExporter keeps, one per test, so nothing depends on the global provider."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from journal_helpers import fails, gives_up, interrupted, refuses, unknown
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import walj
from walj.integrations.otel import SpanObserver, instrument

ROOT = Path(__file__).resolve().parents[2]


class Traced:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.spans(name)
        return span


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = Traced()
    yield t
    t.provider.shutdown()


def exception_types(span: ReadableSpan) -> list[Any]:
    return [e.attributes["exception.type"] for e in span.events
            if e.name == "exception" and e.attributes]


@pytest.mark.parametrize(("handler", "outcome", "status", "error_type"), [
    (lambda x: x + 1, "ok", StatusCode.UNSET, None),
    (fails, "error", StatusCode.ERROR, "ValueError"),
    (refuses, "blocked", StatusCode.ERROR, "walj.errors.ToolBlocked"),
    (gives_up, "cancelled", StatusCode.UNSET, None)])
def test_one_span_per_execution_with_the_genai_attributes_and_its_status(
        tmp_path: Path, traced: Traced, handler: Any, outcome: str, status: StatusCode,
        error_type: str | None) -> None:
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        instrument(journal, tracer_provider=traced.provider)
        with journal.turn() as turn:
            result = turn.dispatch("send_email", {"x": 1}, call_id="toolu_1", handler=handler)
        key = list(walj.read(journal.path))
    span = traced.one("execute_tool send_email")
    started = [r.data for r in key if r.data["kind"] == "tool_execution_started"][0]
    assert span.kind is SpanKind.INTERNAL and span.status.status_code is status
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "send_email",
        "gen_ai.tool.call.id": "toolu_1", "walj.execution_id": result.execution_id,
        "walj.idempotency_key": started["idempotency_key"], "walj.log_id": journal.log_id,
        "walj.outcome": outcome, **({"error.type": error_type} if error_type else {})}
    if status is StatusCode.ERROR:
        assert span.status.description == result.error
    assert len(exception_types(span)) == (outcome != "ok")


def test_a_call_the_journal_blocks_is_an_error_span_and_interrupts_make_ambiguous_ones(
        tmp_path: Path, traced: Traced) -> None:
    journal = walj.ToolJournal.open(tmp_path / "j")
    instrument(journal, tracer_provider=traced.provider)
    with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
        turn.dispatch("charge", {"x": 1}, call_id="c1", handler=interrupted)
    assert trace.get_current_span() is trace.INVALID_SPAN  # its context was detached
    with journal.turn() as turn:
        blocked = turn.dispatch("charge", {"x": 2}, call_id="c2", handler=fails)
    journal.close()
    first, second = traced.spans()
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["walj.outcome"] == "ambiguous"
    assert first.attributes["error.type"] == "KeyboardInterrupt"
    assert first.status.status_code is StatusCode.ERROR
    assert exception_types(first) == ["KeyboardInterrupt"]
    assert blocked.outcome == "blocked" and second.attributes["walj.outcome"] == "blocked"
    assert second.attributes["error.type"] == "blocked" and exception_types(second) == []
    assert second.status.status_code is StatusCode.ERROR
    assert "was not run" in (second.status.description or "")


def test_an_unknown_outcome_is_an_ambiguous_error_span_and_the_journal_blocks(
        tmp_path: Path, traced: Traced) -> None:
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        instrument(journal, tracer_provider=traced.provider)
        with pytest.raises(walj.ToolOutcomeUnknown), journal.turn() as turn:
            turn.dispatch("charge", {"x": 1}, handler=unknown)
        assert journal.recovery.blocked
    span = traced.one("execute_tool charge")
    assert span.attributes is not None and span.attributes["walj.outcome"] == "ambiguous"
    assert span.attributes["error.type"] == "walj.errors.ToolOutcomeUnknown"
    assert span.status.status_code is StatusCode.ERROR


def test_a_span_made_inside_the_handler_nests_under_the_execution(
        tmp_path: Path, traced: Traced) -> None:
    def send(x: int) -> int:
        with traced.tracer.start_as_current_span("smtp send"):
            return x

    with traced.tracer.start_as_current_span("agent turn"), \
            walj.ToolJournal.open(tmp_path / "j") as journal:
        instrument(journal, tracer_provider=traced.provider)
        with journal.turn() as turn:
            turn.dispatch("send", {"x": 1}, handler=send)
    inner, execution, outer = (traced.one(n) for n in ("smtp send", "execute_tool send",
                                                       "agent turn"))
    assert inner.parent is not None and execution.parent is not None
    assert inner.parent.span_id == execution.context.span_id
    assert execution.parent.span_id == outer.context.span_id


def test_async_dispatch_nests_in_the_task_and_a_cancel_is_an_ambiguous_span(
        tmp_path: Path, traced: Traced) -> None:
    gate = asyncio.Event()

    async def fetch(x: int) -> int:
        with traced.tracer.start_as_current_span("http get"):
            await asyncio.sleep(0)
        return x

    async def hold(x: int) -> None:
        await gate.wait()

    async def main() -> walj.ToolJournal:
        journal = walj.ToolJournal.open(tmp_path / "j")
        instrument(journal, tracer_provider=traced.provider)
        async with journal.turn() as turn:
            await asyncio.gather(*(turn.adispatch("fetch", {"x": i}, handler=fetch)
                                   for i in range(3)))
            task = asyncio.create_task(turn.adispatch("hold", {"x": 1}, handler=hold))
            while not journal._core._live:  # the intent is durable: the handler waits
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert trace.get_current_span() is trace.INVALID_SPAN
        return journal

    journal = asyncio.run(main())
    assert journal.recovery.blocked
    journal.close()
    executions = {s.context.span_id: s for s in traced.spans("execute_tool fetch")}
    inner = traced.spans("http get")
    assert len(executions) == len(inner) == 3
    assert {s.parent.span_id for s in inner if s.parent} == set(executions)  # one under each
    held = traced.one("execute_tool hold")
    assert held.attributes is not None and held.attributes["walj.outcome"] == "ambiguous"
    assert held.status.status_code is StatusCode.ERROR
    assert exception_types(held) == ["asyncio.exceptions.CancelledError"]


def test_a_resolution_is_an_event_on_the_current_span_or_on_one_of_its_own(
        tmp_path: Path, traced: Traced) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path) as journal:
        for _ in range(2):
            with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
                turn.dispatch("charge", {"x": 1}, handler=interrupted)
            (blocker,) = journal.recovery.blockers
            assert blocker.execution_id is not None
            if _ == 0:
                journal.resolve(blocker.execution_id, "not_performed", actor="ann")
    tools = {"charge": walj.Tool(lambda x: x, on_ambiguous="assume_done")}
    observer = SpanObserver(traced.provider)
    with traced.tracer.start_as_current_span("admin request"):
        with walj.ToolJournal.open(path, tools=tools, observers=[observer]) as journal:
            assert not journal.recovery.blocked
    (event,) = traced.one("admin request").events
    assert event.name == "walj.resolved" and dict(event.attributes or {}) == {
        "walj.execution_id": blocker.execution_id, "walj.turn_sequence": 2,
        "walj.resolution.kind": "execution",
        "walj.resolution.outcome": "succeeded", "walj.resolution.actor": "policy",
        "gen_ai.tool.name": "charge"}
    with walj.ToolJournal.open(path) as journal:  # no span is current: one of its own
        with pytest.raises(RuntimeError), journal.turn() as turn:
            turn.dispatch("charge", {"x": 2}, handler=lambda x: x)
            raise RuntimeError("the loop died")
        instrument(journal, tracer_provider=traced.provider)
        journal.resolve_turn(3, actor="bob", note="answered")
    (event,) = traced.one("walj resolve").events
    assert dict(event.attributes or {}) == {
        "walj.turn_sequence": 3, "walj.resolution.kind": "turn",
        "walj.resolution.outcome": "resolved", "walj.resolution.actor": "bob"}


def test_function_calls_each_get_a_span_named_by_their_call_id(
        tmp_path: Path, traced: Traced) -> None:
    observer = SpanObserver(traced.provider)
    with walj.ToolJournal.open(tmp_path / "j", observers=[observer]) as journal:
        results = walj.handle_function_calls(
            [{"id": "call_1", "function": {"name": "add", "arguments": '{"x": 1}'}},
             {"id": "call_2", "function": {"name": "add", "arguments": '{"x": "a"}'}}],
            {"add": lambda x: x + 1}, journal)
    assert [r["error"] is None for r in results] == [True, False]
    spans = traced.spans("execute_tool add")
    assert [(s.attributes or {}).get("gen_ai.tool.call.id") for s in spans] == ["call_1",
                                                                                 "call_2"]
    assert [s.status.status_code for s in spans] == [StatusCode.UNSET, StatusCode.ERROR]


def test_a_replayed_call_makes_no_span_but_an_event_and_a_refused_one_is_a_marked_error_span(
        tmp_path: Path, traced: Traced) -> None:
    async def send(x: int) -> int:
        return x * 10

    async def main() -> list[walj.ToolResult]:
        with walj.ToolJournal.open(tmp_path / "j", store_outputs=True) as journal:
            instrument(journal, tracer_provider=traced.provider)
            async with journal.turn() as turn:
                with traced.tracer.start_as_current_span("agent turn"):
                    done = [await turn.adispatch("send", {"x": x}, call_id="c1", handler=send)
                            for x in (1, 1, 2)]
                # No span current: a replayed answer leaves no trace at all.
                done.append(await turn.adispatch("send", {"x": 1}, call_id="c1", handler=send))
                return done

    first, again, other, unseen = asyncio.run(main())
    assert again.replayed and unseen.replayed and other.outcome == "refused"
    spans = traced.spans("execute_tool send")
    assert [dict(s.attributes or {}).get("walj.outcome") for s in spans] == ["ok", "refused"]
    plain, refused = (dict(s.attributes or {}) for s in spans)
    assert "walj.replayed" not in plain and refused["walj.replayed"] is True
    assert refused["walj.execution_id"] == other.execution_id
    assert refused["error.type"] == "refused"
    assert spans[1].status.status_code is StatusCode.ERROR
    assert spans[1].status.description == other.error
    (event,) = traced.one("agent turn").events
    assert event.name == "walj.replayed" and dict(event.attributes or {}) == {
        "gen_ai.tool.name": "send", "gen_ai.tool.call.id": "c1",
        "walj.execution_id": first.execution_id, "walj.outcome": "ok",
        "walj.log_id": plain["walj.log_id"], "walj.replayed": True}
    assert len(traced.spans()) == 3  # the two executions' and the agent's: nothing else


def test_undo_stops_the_spans_and_bad_arguments_are_refused(
        tmp_path: Path, traced: Traced) -> None:
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        undo = instrument(journal, tracer_provider=traced.provider)
        undo()
        undo()  # a second undo does nothing
        assert journal.observers == ()
        with journal.turn() as turn:
            turn.dispatch("t", {"x": 1}, handler=lambda x: x)
        with pytest.raises(TypeError, match="TracerProvider"):
            instrument(journal, tracer_provider="jaeger")  # type: ignore[arg-type]
    assert traced.spans() == []
    with pytest.raises(TypeError, match="walj.ToolJournal"):
        instrument(tmp_path)  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["on_start", "on_end"])
def test_a_span_processor_that_raises_changes_no_outcome_and_is_logged(
        tmp_path: Path, traced: Traced, where: str, caplog: pytest.LogCaptureFixture) -> None:
    class Broken(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            if where == "on_start":
                raise OSError("collector down")

        def on_end(self, span: ReadableSpan) -> None:
            if where == "on_end":
                raise OSError("collector down")

    traced.provider.add_span_processor(Broken())
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        instrument(journal, tracer_provider=traced.provider)
        with journal.turn() as turn:
            assert turn.dispatch("t", {"x": 1}, handler=lambda x: x).output == 1
            assert trace.get_current_span() is trace.INVALID_SPAN
        assert not journal.recovery.blocked
        assert list(walj.read(journal.path))[-2].data["outcome"] == "ok"
    assert "collector down" in caplog.text and f"raised in {where}" in caplog.text


def test_importing_walj_does_not_import_opentelemetry_and_a_missing_api_names_the_extra(
) -> None:
    script = ("import sys, walj, walj.journal, walj.integrations\n"
              "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')"
              " or m == 'walj.integrations.otel'))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"
    script = ("import sys\n"
              "sys.modules['opentelemetry'] = None\n"  # as if it were not installed
              "try:\n"
              "    import walj.integrations.otel\n"
              "except ImportError as exc:\n"
              "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert "pip install 'walj[otel]'" in done.stdout, done.stdout + done.stderr
